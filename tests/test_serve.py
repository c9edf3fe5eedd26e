"""`mt serve`: the real server on a loopback port, called by a real HTTP client. Its answers
equal `mt translate`'s; every bad request gets a 4xx with a one-line JSON error naming the field
and the server keeps serving; requests are batched, a full queue is refused, a slow request
times out without holding the others, the API key is checked, SIGTERM answers the requests in
flight and exits 0; the web page works in a real browser."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from mt.serve.app import Limits, Served, create_app  # noqa: E402
from mt.serve.batcher import Batcher, QueueFull, Stopped, TimedOut, decode_seconds  # noqa: E402
from tests.conftest import ROOT, assert_user_error, cli_env, free_port, run_mt  # noqa: E402


class Server:
    """`mt serve` in a subprocess on a free loopback port."""

    def __init__(self, *args: str, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mt", "serve", *map(str, args), "--port", str(self.port)],
            cwd=ROOT,
            env={**cli_env(), **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []  # its stderr, read as it comes (a full pipe would stop it)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        self.http = httpx.Client(base_url=self.url, timeout=60)
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._reader.join(5)
                raise RuntimeError(f"mt serve did not start: {''.join(self.lines)}")
            time.sleep(0.2)

    def post(self, body, **headers) -> httpx.Response:
        if isinstance(body, (dict, list)):
            return self.http.post("/translate", json=body, headers=headers)
        headers = {"Content-Type": "application/json", **headers}
        return self.http.post("/translate", content=body, headers=headers)

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self._reader.join(10)
        self.http.close()
        return self.proc.returncode, "".join(self.lines)


@pytest.fixture(scope="module")
def server(tiny_run):
    s = Server(tiny_run)
    yield s
    code, err = s.stop()
    assert code == 0, err


@pytest.fixture(scope="module")
def sentences(tiny_run) -> list[str]:
    lines = (tiny_run.parent / "data" / "test.src").read_text().splitlines()
    return lines[:12]


def _translate_cli(tiny_run, tmp_path, lines, *flags) -> list[str]:
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    proc = run_mt("translate", tiny_run, "-i", src, *flags)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.parametrize(
    "settings, flags",
    [
        ({}, []),
        ({"beam": 1}, ["--beam", "1"]),
        ({"beam": 3, "length_penalty": 0.6}, ["--beam", "3", "--length-penalty", "0.6"]),
        (
            {"sample": True, "topk": 5, "temperature": 0.8, "seed": 7},
            ["--sample", "--topk", "5", "--temperature", "0.8", "--seed", "7"],
        ),
        ({"prefix": "ZO"}, ["--prefix", "ZO"]),
    ],
)
def test_the_api_answers_what_mt_translate_writes(server, tiny_run, sentences, tmp_path, settings,
                                                  flags):  # fmt: skip
    answer = server.post({"sentences": sentences, **settings})
    assert answer.status_code == 200, answer.text
    got = [t["text"] for t in answer.json()["translations"]]
    assert got == _translate_cli(tiny_run, tmp_path, sentences, *flags)


def test_nbest_and_alignment_equal_mt_translate(server, tiny_run, sentences, tmp_path):
    rows = _translate_cli(tiny_run, tmp_path, sentences[:4], "--beam", "4", "--nbest", "3")
    answer = server.post({"sentences": sentences[:4], "beam": 4, "nbest": 3}).json()
    got = [
        f"{i}\t{alt['score']:.4f}\t{alt['text']}"
        for i, t in enumerate(answer["translations"])
        for alt in t["nbest"]
    ]
    assert got == rows
    assert [t["text"] for t in answer["translations"]] == [r.split("\t")[2] for r in rows[::3]]

    aligned = _translate_cli(tiny_run, tmp_path, sentences[:4], "--print-alignment")
    answer = server.post({"sentences": sentences[:4], "alignment": True}).json()
    assert [f"{t['text']}\t{t['alignment']}" for t in answer["translations"]] == aligned


def test_attention_is_the_weights_mt_attention_draws(server, tiny_run, sentences):
    from mt.decode.alignment import readable_pieces
    from mt.decode.translator import Translator

    answer = server.post({"sentences": sentences[:1], "attention": True}).json()
    att = answer["translations"][0]["attention"]
    text, weights, src, tgt = Translator.load(tiny_run, "cpu").attention(sentences[0])
    assert answer["translations"][0]["text"] == text
    assert att["source"] == readable_pieces(src) and att["target"] == readable_pieces(tgt)
    got = att["weights"]
    assert [len(got), len(got[0]), len(got[0][0]), len(got[0][0][0])] == list(weights.shape)
    assert (
        max(
            abs(a - b)
            for la, lb in zip(got, weights.tolist(), strict=True)
            for ha, hb in zip(la, lb, strict=True)
            for ra, rb in zip(ha, hb, strict=True)
            for a, b in zip(ra, rb, strict=True)
        )
        < 1e-4
    )


def test_info_and_health_describe_the_model(server, tiny_run):
    info = server.http.get("/info").json()
    assert (info["source_language"], info["target_language"]) == ("src", "tgt")
    assert info["architecture"] == "transformer" and info["training_steps"] == [60]
    assert info["decoding"]["beam"] >= 1 and info["attention"]["available"]
    import torch

    weights = torch.load(tiny_run / "best.pt", weights_only=True)["model"]
    unique = {v.data_ptr(): v.numel() for v in weights.values() if v.is_floating_point()}
    assert info["parameters"] == sum(unique.values())  # tied matrices counted once
    assert server.http.get("/health").json()["status"] == "ok"
    from mt.serve.schemas import ModelInfo

    ModelInfo.model_validate(info)  # (the documented shape, no key left out of it)
    schema = server.http.get("/openapi.json").json()
    assert schema["paths"]["/info"]["get"]["responses"]["200"]["content"]["application/json"][
        "schema"
    ] == {"$ref": "#/components/schemas/ModelInfo"}
    fields = schema["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]
    fields = fields["schema"]["properties"]
    assert fields["length_penalty"]["anyOf"][0]["maximum"] == 1000
    assert fields["seed"]["anyOf"][0]["maximum"] == float(2**63 - 1)  # (OpenAPI: a number)
    assert (
        fields["sentences"]["maxItems"] == 64 and fields["sentences"]["items"]["maxLength"] == 1000
    )


def test_the_schema_states_the_limits_the_flags_set():
    """/openapi.json gives --max-sentences and --max-chars as this server enforces them."""
    batcher = Batcher(lambda s, _, __: list(s), max_wait=0.0)
    try:
        app = create_app(Served("m", ScriptedTranslator(), INFO, batcher), Limits(3, 7))
        fields = app.openapi()["paths"]["/translate"]["post"]["requestBody"]["content"]
        fields = fields["application/json"]["schema"]["properties"]
        assert (
            fields["sentences"]["maxItems"] == 3 and fields["sentences"]["items"]["maxLength"] == 7
        )
        assert fields["prefix"]["anyOf"][0]["maxLength"] == 7
        other = create_app(Served("m", ScriptedTranslator(), INFO, batcher), Limits())
        assert other.openapi()["paths"]["/translate"] != app.openapi()["paths"]["/translate"]
    finally:
        batcher.close(5)


BAD = [
    (b"{bad", 400, None, "not valid JSON"),
    (b"\xff\xfe{}", 400, None, "not valid UTF-8"),
    (b"", 400, None, "empty"),
    ([1, 2], 422, None, "JSON object"),
    ({}, 422, "sentences", "required"),
    ({"sentences": []}, 422, "sentences", "at least one"),
    ({"sentences": "a b"}, 422, "sentences", "list"),
    ({"sentences": [1]}, 422, "sentences.0", "string"),
    ({"sentences": ["a"], "beam": 0}, 422, "beam", "greater than or equal to 1"),
    ({"sentences": ["a"], "beam": 101}, 422, "beam", "100"),
    ({"sentences": ["a"], "beam": "5"}, 422, "beam", "integer"),
    ({"sentences": ["a"], "sample": True, "topp": 1.5}, 422, "topp", "less than or equal to 1"),
    ({"sentences": ["a"], "sample": True, "temperature": 0}, 422, "temperature", "0.000001"),
    ({"sentences": ["a"], "topk": 3}, 422, "topk", "sample"),
    ({"sentences": ["a"], "sample": True, "beam": 3}, 422, "sample", "beam"),
    ({"sentences": ["a"], "nbest": 50, "beam": 4}, 422, "nbest", "beam of at least 50"),
    ({"sentences": ["a"], "colour": "red"}, 422, "colour", "unknown setting"),
    ({"sentences": ["a"] * 65}, 413, "sentences", "at most 64"),
    ({"sentences": ["a" * 1001]}, 413, "sentences.0", "at most 1000"),
    ({"sentences": ["a"], "prefix": "A naïve"}, 422, "prefix", "never occurred"),
    ({"sentences": ["a"], "sample": True, "seed": 2**64}, 422, "seed", None),
]


@pytest.mark.parametrize("body, status, field, words", BAD)
def test_a_bad_request_is_a_4xx_naming_its_field_and_the_server_keeps_serving(
    server, body, status, field, words
):
    answer = server.post(body)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert (words or "") in error["error"] and "\n" not in error["error"]
    assert error.get("field") == field
    assert server.post({"sentences": ["a b"]}).status_code == 200


def test_unknown_paths_methods_and_huge_bodies_are_4xx(server):
    assert server.http.get("/nowhere").status_code == 404
    assert server.http.get("/translate").status_code == 405
    huge = server.post(b'{"sentences": ["' + b"a" * (1 << 20) + b'"]}')
    assert huge.status_code == 413 and "--max-body" in huge.json()["error"]
    assert server.http.get("/health").status_code == 200


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(server, sentences):
    alone = [server.post({"sentences": [s]}).json()["translations"][0]["text"] for s in sentences]
    before = server.http.get("/health").json()
    with ThreadPoolExecutor(len(sentences)) as pool:
        answers = list(pool.map(lambda s: server.post({"sentences": [s]}), sentences))
    assert [a.json()["translations"][0]["text"] for a in answers] == alone
    after = server.http.get("/health").json()
    requests = after["requests_decoded"] - before["requests_decoded"]
    batches = after["batches"] - before["batches"]
    assert requests == len(sentences) and batches < requests


def test_a_sampled_request_with_a_seed_is_decoded_alone_and_repeats(server, sentences):
    body = {"sentences": sentences[:3], "sample": True, "seed": 11}
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: server.post(body).json(), range(4)))
    assert all(a == answers[0] for a in answers)


def test_the_api_key_is_required_when_set(tiny_run):
    s = Server(tiny_run, env={"MT_API_KEY": "s3cret"})
    try:
        body = {"sentences": ["a b"]}
        assert s.post(body).status_code == 401
        assert s.post(body, Authorization="Bearer wrong").status_code == 401
        assert s.post(body, Authorization="Bearer s3cret").status_code == 200
        assert s.post(body, **{"X-API-Key": "s3cret"}).status_code == 200
        assert s.http.get("/info").status_code == 401
        assert s.http.get("/health").status_code == 200
        assert "API key" in s.post(body).json()["error"]
    finally:
        assert s.stop()[0] == 0


def test_sigterm_answers_the_requests_in_flight_then_exits_0(tiny_run, sentences):
    s = Server(tiny_run)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(s.post, {"sentences": sentences * 5, "beam": 8})
        time.sleep(0.3)
        code, err = s.stop()
        answer = pending.result()
    assert answer.status_code == 200 and len(answer.json()["translations"]) == 60
    assert code == 0 and "Traceback" not in err


def test_bad_flags_are_one_line_errors(tiny_run):
    taken = free_port()
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", taken))
        busy.listen()
        proc = run_mt("serve", tiny_run, "--port", taken, timeout=60)
    assert_user_error(proc, f"--port {taken}", "cannot listen")
    assert_user_error(run_mt("serve", tiny_run, "--device", "tpu"), "--device")
    assert_user_error(run_mt("serve", tiny_run, "--cors-origin", "app.example.org"),
                      "--cors-origin", "https://")  # fmt: skip
    assert_user_error(run_mt("serve", tiny_run.parent / "nothing"), "nothing")


# -- the batcher and the app's limits, with a scripted model ----------------------------------


def _serve_in_thread(app, **settings) -> tuple[str, threading.Thread, uvicorn.Server]:
    """uvicorn serving `app` on a free loopback port in a thread (settings: more of
    uvicorn.Config's, as http=guarded(...)); its URL, thread and server."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", **settings)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", thread, server


INFO = {"architecture": "transformer", "decoding": {"beam": 5}, "source_language": "x",
        "target_language": "y", "ensemble": False,
        "attention": {"available": False, "why_not": "scripted"}}  # fmt: skip


class ScriptedTranslator:
    """What the app asks of a translator before the worker decodes: its options, and its
    source and prefix lengths (a word a subword)."""

    max_source_len = 255
    languages = None  # (a model that does not say: one pair)

    @staticmethod
    def source_lengths(lines):
        return [len(line.split()) for line in lines]

    @staticmethod
    def options(**given):
        from mt.decode.options import DecodeOptions

        return DecodeOptions().with_(**given)

    @staticmethod
    def prefix_ids(prefix):
        return [0] * len(prefix.split()) if prefix else []


def test_a_full_queue_answers_429_at_once_and_a_slow_request_times_out_alone():
    release = threading.Event()

    def decode(sentences, settings, stopped):  # the model: blocks until released, then echoes
        if sentences[0] == "slow":
            release.wait(10)
        return [{"text": s.upper(), "score": None} for s in sentences]

    batcher = Batcher(decode, max_queue=2, max_wait=0.0)
    app = create_app(Served("m", ScriptedTranslator(), INFO, batcher), Limits(timeout=1.0))
    url, thread, server = _serve_in_thread(app)
    try:
        with httpx.Client(base_url=url, timeout=30) as http, ThreadPoolExecutor(4) as pool:
            slow = pool.submit(http.post, "/translate", json={"sentences": ["slow"]})
            time.sleep(0.3)  # the worker is now busy with it
            waiting = [pool.submit(http.post, "/translate", json={"sentences": [w]})
                       for w in ("x", "y")]  # fmt: skip
            time.sleep(0.3)
            started = time.monotonic()
            full = http.post("/translate", json={"sentences": ["z"]})
            assert full.status_code == 429 and time.monotonic() - started < 0.5
            assert "waiting" in full.json()["error"]
            assert http.get("/health").json()["waiting"] == 2  # answered while the model works
            timed_out = slow.result()
            assert timed_out.status_code == 503 and "timed out" in timed_out.json()["error"]
            release.set()
            assert [w.result().json()["translations"][0]["text"] for w in waiting] == ["X", "Y"]
    finally:
        release.set()
        server.should_exit = True
        thread.join(10)
        batcher.close(5)


def test_the_batcher_merges_equal_settings_within_the_token_budget():
    calls = []

    def decode(sentences, settings, stopped):
        calls.append((list(sentences), settings))
        return list(sentences)

    async def main(batcher):
        futures = [batcher.submit([w], "beam5", [1]) for w in "abcde"]
        futures.append(batcher.submit(["f"], "beam1", [1]))
        futures.append(batcher.submit(["g"], "beam5", [1], alone=True))
        return [await f for f in futures]

    batcher = Batcher(decode, max_tokens=3, max_wait=0.2)
    try:
        results = asyncio.run(main(batcher))
    finally:
        batcher.close(5)
    assert results == [["a"], ["b"], ["c"], ["d"], ["e"], ["f"], ["g"]]
    assert calls == [(["a", "b", "c"], "beam5"), (["d", "e"], "beam5"), (["f"], "beam1"),
                     (["g"], "beam5")]  # fmt: skip

    unbatched = Batcher(decode, batching=False)
    calls.clear()
    try:
        asyncio.run(main(unbatched))
    finally:
        unbatched.close(5)
    assert len(calls) == 7


def test_the_queue_bound_holds():
    gate = threading.Event()
    batcher = Batcher(lambda s, _, __: (gate.wait(5), s)[1], max_queue=1, max_wait=0.0)

    async def main():
        first = batcher.submit(["a"], "k", [1])
        await asyncio.sleep(0.2)  # the worker holds it
        second = batcher.submit(["b"], "k", [1])
        with pytest.raises(QueueFull):
            batcher.submit(["c"], "k", [1])
        gate.set()
        return await first, await second

    try:
        assert asyncio.run(main()) == (["a"], ["b"])
    finally:
        gate.set()
        batcher.close(5)


def test_a_batch_ends_at_its_oldest_requests_deadline():
    """A request merged into a batch late does not keep the batch past the oldest one's
    deadline: the batch stops there (the worker is free for the requests behind it), the
    younger request ends with it (TimedOut), and each is told the time its batch decoded."""
    gate, steps = threading.Event(), []

    def decode(sentences, settings, stopped):
        if settings == "gate":
            gate.wait(10)
            return sentences
        while not stopped():  # a decode as long as its stopped() lets it be
            steps.append(time.monotonic())
            time.sleep(0.01)
        raise Stopped

    async def main(batcher):
        blocker = batcher.submit(["g"], "gate", [1])
        await asyncio.sleep(0.1)  # the worker is busy: the next two queue up
        old_timing, young_timing = {}, {}
        old = batcher.submit(["old"], "k", [1], timing=old_timing)
        born = time.monotonic()
        await asyncio.sleep(1.0)
        young = batcher.submit(["young"], "k", [1], timing=young_timing)
        gate.set()  # one batch of both, 1 s into the old one's 2 s
        await blocker
        results = await asyncio.gather(old, young, return_exceptions=True)
        return born, results, old_timing, young_timing

    batcher = Batcher(decode, max_wait=0.0, timeout=2.0)
    try:
        born, results, old_timing, young_timing = asyncio.run(main(batcher))
    finally:
        gate.set()
        batcher.close(5)
    old, young = results  # the old one at its own timeout, the young one by its batch's
    assert isinstance(old, asyncio.TimeoutError) and isinstance(young, TimedOut), results
    assert steps and steps[0] - born < 1.5  # (the two decoded together, after the gate)
    ended = steps[-1] - born
    assert 1.9 < ended < 2.6, ended  # the old one's deadline, not the young one's (3 s)
    for timing in (old_timing, young_timing):  # the decoding time of a batch that stopped
        assert 0.6 < decode_seconds(timing) < 1.7 and "decoding_since" not in timing, timing


# -- the web page -----------------------------------------------------------------------------


def test_the_page_needs_nothing_from_the_internet_and_parses_no_text_as_html(server):
    page = server.http.get("/").text
    assert "<canvas" in page
    for fetched in ('src="http', 'href="http', "url(http", "@import"):
        assert fetched not in page
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page


def test_the_page_translates_and_draws_the_attention_in_a_real_browser(server, tmp_path):
    from tests.webdriver import Browser, find_browser

    found = find_browser()
    if found is None:
        pytest.skip("no chromium and chromedriver (apt-get install chromium chromium-driver)")
    browser = Browser(*found, free_port())
    try:
        browser.go(server.url + "/")
        browser.wait_for("document.getElementById('model').textContent.includes('src')")
        hostile = "ZO <img src=x onerror=window.pwned=1> KA"
        browser.type("#source", hostile)
        browser.click("#translate")
        n = browser.wait_for("document.querySelectorAll('#output li').length")
        assert n == 1
        shown = browser.script("return document.querySelector('#output .text').textContent;")
        assert shown == server.post({"sentences": [hostile]}).json()["translations"][0]["text"]
        source = browser.script("return document.querySelector('#output .source').textContent;")
        assert source == hostile  # shown as text, not parsed
        rows = browser.wait_for("document.getElementById('attention').getAttribute('data-rows')")
        assert int(rows) >= 1
        assert browser.script("return document.getElementById('attention').width;") > 50
        assert browser.script("return window.pwned === undefined;")
        assert browser.script("return document.querySelectorAll('#output img').length;") == 0
        layers = browser.script("return document.getElementById('layer').options.length;")
        assert layers == 1 + json.loads(server.http.get("/info").text)["model"]["dec_layers"]
        # with n-best lists the picture is fetched on its own, for the best translation
        browser.script("document.getElementById('attention').removeAttribute('data-rows');")
        browser.script("document.getElementById('nbest').value = '2';")
        browser.script("document.getElementById('beam').value = '2';")
        browser.click("#translate")
        browser.wait_for("document.querySelectorAll('#output ul.nbest li').length == 2")
        assert browser.wait_for("document.getElementById('attention').getAttribute('data-rows')")
        browser.screenshot(tmp_path / "page.png")
        assert (tmp_path / "page.png").stat().st_size > 10_000
    finally:
        browser.close()


def test_the_picture_has_a_fixed_scale_values_on_hover_and_an_honest_failure(
    server, sentences, tmp_path
):
    """The attention picture is drawn on a fixed 0-1 scale (a cell's colour is its weight's,
    whatever the largest weight), with a legend; scaling to the largest weight is an option the
    legend then says; hovering a cell shows its weight; a long sentence scrolls inside its
    panel; a failed request clears the old results; PNG and SVG export."""
    from tests.webdriver import Browser, find_browser

    found = find_browser()
    if found is None:
        pytest.skip("no chromium and chromedriver (apt-get install chromium chromium-driver)")
    browser = Browser(*found, free_port())
    line = " ".join(sentences[:3] * 3)  # (a long sentence: wider than its panel)
    answer = server.post({"sentences": [line], "attention": True}).json()["translations"][0]
    weights = answer["attention"]["weights"]  # (L, H, T, S): the page draws their mean
    cells = [h for layer in weights for h in layer]
    mean = [[sum(h[t][s] for h in cells) / len(cells) for s in range(len(cells[0][0]))]
            for t in range(len(cells[0]))]  # fmt: skip
    try:
        browser.go(server.url + "/")
        browser.wait_for("document.getElementById('model').textContent.includes('src')")
        browser.type("#source", line)
        browser.click("#translate")
        browser.wait_for("document.getElementById('attention').getAttribute('data-rows')")
        assert browser.script("return document.getElementById('attention').dataset.peak;") == "1"
        assert browser.script("return document.getElementById('high').textContent;") == "1"
        geometry = browser.script(
            "const c = document.getElementById('attention'), p = document.getElementById("
            "'scroll'); return [c.width, p.clientWidth, p.scrollWidth];"
        )
        assert geometry[0] > geometry[1] and geometry[2] >= geometry[0]  # it scrolls
        t, s = 1, 2
        pixel = browser.script(
            "const c = document.getElementById('attention'), ctx = c.getContext('2d');"
            "const d = window.drawnForTest = drawn;"
            f"return Array.from(ctx.getImageData(d.left + {s} * d.cell + 5, d.top + {t} * d.cell"
            " + 5, 1, 1).data).slice(0, 3);"
        )
        v = mean[t][s]
        want = [round(255 - 200 * v), round(255 - 190 * v), round(255 - 80 * v)]
        assert max(abs(a - b) for a, b in zip(pixel, want, strict=True)) <= 2, (pixel, want)
        shown = browser.script(
            "const c = document.getElementById('attention'), b = c.getBoundingClientRect();"
            f"const x = b.left + drawn.left + {s} * drawn.cell + 5, y = b.top + drawn.top + "
            f"{t} * drawn.cell + 5;"
            "c.dispatchEvent(new MouseEvent('mousemove', {clientX: x, clientY: y}));"
            "return document.getElementById('hover').textContent;"
        )
        assert shown.endswith(f"{v:.4f}"), (shown, v)
        browser.click("#stretch")
        peak = float(browser.script("return document.getElementById('attention').dataset.peak;"))
        assert abs(peak - max(max(row) for row in mean)) < 1e-6 and peak < 1
        assert "largest" in browser.script("return document.getElementById('scalenote')"
                                           ".textContent;")  # fmt: skip
        browser.screenshot(tmp_path / "picture.png")
        assert (tmp_path / "picture.png").stat().st_size > 10_000
        svg = browser.script(
            "let got = null; const keep = URL.createObjectURL; URL.createObjectURL = (b) => "
            "{ got = b; return keep(b); }; exportSvg(); URL.createObjectURL = keep; "
            "return got ? got.type : null;"
        )
        assert svg == "image/svg+xml"
        browser.script("document.getElementById('beam').value = '0';")  # a 422
        browser.click("#translate")
        browser.wait_for("document.getElementById('status').className == 'error'")
        assert browser.script("return document.querySelectorAll('#output li').length;") == 0
        assert browser.script("return document.getElementById('attention').width;") == 1
    finally:
        browser.close()


def test_an_ensemble_is_served_as_mt_translate_decodes_it_and_says_why_no_picture(
    tiny_run, sentences, tmp_path
):
    members = [tiny_run / "step_30.pt", tiny_run / "step_60.pt"]
    s = Server(*members)
    try:
        info = s.http.get("/info").json()
        assert info["ensemble"] and info["training_steps"] == [30, 60]
        assert not info["attention"]["available"] and "ensemble" in info["attention"]["why_not"]
        refused = s.post({"sentences": sentences[:2], "attention": True})
        assert refused.status_code == 422 and refused.json()["field"] == "attention"
        got = [t["text"] for t in s.post({"sentences": sentences}).json()["translations"]]
        src = tmp_path / "in.txt"
        src.write_text("\n".join(sentences) + "\n")
        proc = run_mt("translate", *members, "-i", src)
        assert got == proc.stdout.splitlines()
    finally:
        assert s.stop()[0] == 0


def test_a_large_request_is_decoded_in_chunks_without_holding_later_ones():
    """A request over the token budget goes in chunks of the budget, one per batch, so that a
    request arriving after it is answered in the next batch, not after the whole large one;
    the large one's answers come back whole and in order; a seeded (alone) one is not cut."""
    calls = []

    def decode(sentences, settings, stopped):
        calls.append(list(sentences))
        time.sleep(0.05)
        return [s.upper() for s in sentences]

    async def main(batcher):
        big = batcher.submit([f"b{i}" for i in range(10)], "k", [2] * 10)
        await asyncio.sleep(0.01)  # the worker is on the big one's first chunk
        small = batcher.submit(["s"], "k", [1])
        seeded = batcher.submit([f"z{i}" for i in range(10)], "k", [2] * 10, alone=True)
        return await big, await small, await seeded

    batcher = Batcher(decode, max_tokens=6, max_wait=0.0)
    try:
        big, small, seeded = asyncio.run(main(batcher))
    finally:
        batcher.close(5)
    assert big == [f"B{i}" for i in range(10)] and small == ["S"]
    assert seeded == [f"Z{i}" for i in range(10)]
    assert calls[0] == ["b0", "b1", "b2"]  # a chunk of the budget (3 x 2 tokens)
    small_at = next(i for i, c in enumerate(calls) if "s" in c)
    big_end = next(i for i, c in enumerate(calls) if "b9" in c)
    assert small_at < big_end  # answered while the large one was still being decoded
    assert calls[1] == ["s"]  # the next batch: the large one's rest waits its turn
    assert [f"z{i}" for i in range(10)] in calls  # the seeded one whole, in one call
    assert batcher.decoded == 3
