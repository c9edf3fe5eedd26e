"""`mt serve` against careless and hostile clients, on loopback: a bad sentence fails alone, a
costly request is refused before any work and one nobody waits for stops being decoded,
malformed numbers and JSON are 4xx, slow clients are cut off and cannot lock others out,
other web pages cannot drive the server, and no input is cut in silence."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from mt.serve.app import Limits, Served, create_app  # noqa: E402
from mt.serve.batcher import Batcher, Stopped  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.test_serve import INFO, ScriptedTranslator, Server, _serve_in_thread  # noqa: E402

# (timeouts short enough to test, long enough that a busy test machine's own clients meet them)
FLAGS = ["--timeout", "5", "--header-timeout", "2", "--body-timeout", "2", "--keep-alive", "1",
         "--max-connections", "60", "--max-attention-cells", "50000"]  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_run):
    s = Server(tiny_run, *FLAGS)
    yield s
    code, err = s.stop()
    assert code == 0, err
    assert "Traceback" not in err, err  # (a client that left mid-body included)


@pytest.fixture(scope="module")
def sentences(tiny_run) -> list[str]:
    return (tiny_run.parent / "data" / "test.src").read_text().splitlines()[:24]


def _one_line(answer, status: int, *words: str) -> dict:
    assert answer.status_code == status, answer.text[:300]
    error = answer.json()
    assert "\n" not in error["error"], error
    for word in words:
        assert word in error["error"], (word, error)
    return error


# -- a bad sentence fails alone ---------------------------------------------------------------


def test_a_poisoned_sentence_among_concurrent_requests_fails_alone(server, sentences):
    """24 good requests and one with a lone surrogate, sent together: 24 answers of 200, one
    400 naming the sentence."""
    poisoned = json.dumps({"sentences": ["a b", "abc \ud800"]}).encode()  # ("\ud800" in JSON)
    bodies = [{"sentences": [s]} for s in sentences]
    bodies.insert(12, poisoned)
    with ThreadPoolExecutor(25) as pool:
        answers = list(pool.map(server.post, bodies))
    statuses = [a.status_code for a in answers]
    assert statuses.count(200) == 24 and statuses[12] == 400, statuses
    assert _one_line(answers[12], 400, "surrogate")["field"] == "sentences.1"


def test_a_batch_that_fails_is_decoded_again_request_by_request():
    """A fault only the model finds: the requests batched with it get their translations;
    the one at fault alone gets the error."""
    calls = []

    def decode(sentences, settings, stopped):
        calls.append(list(sentences))
        if "poison" in sentences:
            raise ValueError("the model cannot take 'poison'")
        return [s.upper() for s in sentences]

    async def main(batcher):
        futures = [batcher.submit([w], "k", [1]) for w in ("a", "b", "poison", "c")]
        return await asyncio.gather(*futures, return_exceptions=True)

    batcher = Batcher(decode, max_wait=0.2)
    try:
        results = asyncio.run(main(batcher))
    finally:
        batcher.close(5)
    assert results[:2] == [["A"], ["B"]] and results[3] == ["C"]
    assert isinstance(results[2], ValueError)
    assert calls[0] == ["a", "b", "poison", "c"] and len(calls) == 5  # once together, then alone


# -- cost, cancellation, readiness ------------------------------------------------------------


def test_a_costly_request_is_refused_before_any_work(server, sentences):
    """64 long sentences at beam 100 (the server's worker would decode it for minutes): 413
    at once, naming --max-cost; a sentence longer than the model reads is refused, never cut
    in silence; attention for many long sentences is refused by its size."""
    words = " ".join(sentences[:6])
    started = time.monotonic()
    costly = server.post({"sentences": [words] * 64, "beam": 100})
    _one_line(costly, 413, "--max-cost", "beam")
    assert time.monotonic() - started < 2
    digits = " ".join("7" * 400)  # (400 words, each a subword or more: over the 255)
    error = _one_line(server.post({"sentences": ["a b", digits]}), 413, "at most 255")
    assert error["field"] == "sentences.1"
    attention = server.post({"sentences": [words] * 12, "attention": True, "beam": 1})
    assert _one_line(attention, 413, "--max-attention-cells")["field"] == "attention"
    small = server.post({"sentences": ["a b c"], "attention": True})
    assert small.status_code == 200 and small.json()["translations"][0]["attention"]
    assert server.http.get("/health").json()["ready"]


def test_a_forced_prefix_is_priced_by_the_steps_it_forces(server, tiny_run):
    """A prefix longer than any sentence's length limit makes the search take as many steps
    for every sentence: the request is priced by them (it was priced by its one-word
    sentences, 64 x 100 x 2, and held the model for 30 s), and so is its attention."""
    from mt.decode.translator import Translator

    prefix = "VIFO " * 199
    forced = len(Translator.load(tiny_run, "cpu").tokenizer.encode_tgt([prefix])[0])
    assert forced >= 199  # (the case holds what it is about)
    started = time.monotonic()
    heavy = server.post({"sentences": ["a"] * 64, "beam": 100, "prefix": prefix})
    error = _one_line(heavy, 413, "--max-cost", "the prefix included")
    steps = forced + 1  # (each step t counted 1 + t/32: the sum of 1..steps, over 32)
    assert f"{64 * 100 * (steps + steps * (steps + 1) // 64):,}" in error["error"]
    assert time.monotonic() - started < 2
    looking = server.post({"sentences": ["a"] * 32, "beam": 1, "prefix": prefix, "attention": True})
    _one_line(looking, 413, "--max-attention-cells")


@pytest.mark.slow
def test_a_stream_of_prefixed_requests_does_not_starve_a_normal_client(
    server, tiny_run, sentences, tmp_path
):
    """For 30 s, one request a second of 64 one-word sentences at beam 100 with a 199-word
    prefix (it held the model for 30 s each when priced by its source), beside a client
    translating four sentences after another: every heavy request refused (413), the normal
    client's 99th percentile under 2 s, and each of its answers what `mt translate` writes."""
    from tests.test_serve import _translate_cli

    heavy_body = {"sentences": ["a"] * 64, "beam": 100, "prefix": "VIFO " * 199}
    lines = sentences[:4]
    expected = _translate_cli(tiny_run, tmp_path, lines)
    heavy, normal, wrong = [], [], []
    end = time.monotonic() + 30

    def heavy_client() -> None:  # (a connection each: a second's pause meets --keep-alive 1)
        while (now := time.monotonic()) < end:
            answer = httpx.post(f"{server.url}/translate", json=heavy_body, timeout=60)
            heavy.append(answer.status_code)
            time.sleep(max(0.0, now + 1.0 - time.monotonic()))

    def normal_client() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            while time.monotonic() < end:
                started = time.monotonic()
                answer = http.post("/translate", json={"sentences": lines})
                normal.append(time.monotonic() - started)
                ok = answer.is_success
                got = [t["text"] for t in answer.json()["translations"]] if ok else answer.text
                if got != expected:
                    wrong.append(got)

    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(heavy_client), pool.submit(normal_client)]:
            done.result()
    assert len(heavy) >= 25 and set(heavy) == {413}, heavy
    assert len(normal) >= 30 and not wrong, wrong[:2]
    p99 = sorted(normal)[int(0.99 * (len(normal) - 1))]
    assert p99 < 2.0, (p99, len(normal))


@pytest.mark.slow
def test_every_request_admitted_under_the_cap_is_answered_within_the_timeout(tiny_run, sentences):
    """The default limits (--max-cost 100,000, --timeout 30) over prefix lengths x beams x
    sentence counts: each request is refused at once (413) or answered within --timeout (a
    request at the old price's cap, 5 one-word sentences at beam 100 behind a 199-word prefix,
    ran past it), and a neighbour translating one sentence meanwhile is answered within it
    too; the slowest admitted request and the neighbour's 99th percentile are printed."""
    server = Server(tiny_run)
    long = " ".join(sentences[:4])
    grid = [
        (prefix, beam, count)
        for prefix in ("", "VIFO " * 20, "VIFO " * 60, "VIFO " * 199)
        for beam in (1, 10, 100)
        for count in (1, 8, 64)
    ]
    waits: list[float] = []
    done = threading.Event()

    def neighbour() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            while not done.is_set():
                started = time.monotonic()
                assert http.post("/translate", json={"sentences": ["a b c"]}).status_code == 200
                waits.append(time.monotonic() - started)

    admitted = []
    try:
        with ThreadPoolExecutor(1) as pool:
            beside = pool.submit(neighbour)
            for prefix, beam, count in grid:
                body = {"sentences": [long] * count, "beam": beam, "prefix": prefix or None}
                started = time.monotonic()
                answer = server.post(body)
                seconds = time.monotonic() - started
                assert answer.status_code in (200, 413), (body, answer.text[:200])
                assert seconds < (30 if answer.status_code == 200 else 2), (body, seconds)
                if answer.status_code == 200:
                    admitted.append((seconds, len(prefix.split()), beam, count))
            done.set()
            beside.result()
    finally:
        done.set()
        server.stop()
    p99 = sorted(waits)[int(0.99 * (len(waits) - 1))]
    print(
        f"admitted {len(admitted)} of {len(grid)}; slowest {max(admitted)}; neighbour: "
        f"{len(waits)} requests, p99 {p99:.2f} s, slowest {max(waits):.2f} s"
    )
    assert len(admitted) >= 9 and max(waits) < 30


def test_the_price_is_the_hypotheses_times_each_sentences_steps():
    """Counted by hand: sources of 3 and 5 subwords (4 and 6 with EOS) at max_len 1.5 x + 10
    may take 16 and 19 steps; a 30-subword prefix makes each take 31; step t counts
    1 + t/32, so 16 steps are 16 + 136/32 = 20 (rounded down), 19 are 19 + 190/32 = 24 and
    31 are 31 + 496/32 = 46; a beam of 4 keeps 4 hypotheses for each: 4 x (20 + 24) without
    the prefix, 4 x (46 + 46) with it."""
    from mt.decode.options import DecodeOptions
    from mt.serve.limits import BadRequest, Limits, admit

    opts = DecodeOptions(beam=4, max_len_a=1.5, max_len_b=10)
    for forced, price in ((0, 4 * (20 + 24)), (30, 4 * (46 + 46))):
        admit([3, 5], opts, False, 255, (1, 1), Limits(max_cost=price), forced=forced)
        with pytest.raises(BadRequest, match=f"request cost {price:,}"):
            admit([3, 5], opts, False, 255, (1, 1), Limits(max_cost=price - 1), forced=forced)


def test_a_request_nobody_waits_for_stops_being_decoded_and_health_says_when_stuck():
    """The worker decodes step by step: a request that timed out, or whose client left,
    stops within a step, and the next request is answered; a decode that never looks (a
    stuck model) makes /health 503 (not ready) while /health/live stays 200, and the other
    model's own readiness (/health?model=) stays 200."""
    steps, stopped_after, release = [], [], threading.Event()

    def decode(sentences, settings, stopped):
        if sentences[0] == "stuck":
            release.wait(10)
            return ["done"]
        for step in range(2000):  # 20 s of steps unless stopped
            if stopped():
                stopped_after.append(time.monotonic())
                raise Stopped
            steps.append(step)
            time.sleep(0.01)
        return [s.upper() for s in sentences]

    batcher = Batcher(decode, max_wait=0.0)
    other = Batcher(lambda sentences, settings, stopped: sentences, max_wait=0.0)
    models = [Served("m", ScriptedTranslator(), INFO, batcher),
              Served("n", ScriptedTranslator(), INFO, other)]  # fmt: skip
    lines: list[str] = []
    app = create_app(models, Limits(timeout=1.0), log=lines.append)
    url, thread, server = _serve_in_thread(app)
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            started = time.monotonic()
            answer = http.post("/translate", json={"sentences": ["long"], "model": "m"})
            assert answer.status_code == 503 and "timed out" in answer.json()["error"]
            time.sleep(0.3)
            assert len(stopped_after) == 1 and stopped_after[0] - started < 2.0
            # the log tells the decoding time it had when it timed out, not 0
            decoding = float(re.search(r"decoding ([0-9.]+) ms", lines[-1]).group(1))
            assert " 503 " in lines[-1] and 800 < decoding < 1500, lines[-1]

            with httpx.Client(base_url=url, timeout=0.4) as impatient:  # the client leaves
                with pytest.raises(httpx.TimeoutException):
                    impatient.post("/translate", json={"sentences": ["long"], "model": "m"})
                left = time.monotonic()
            deadline = time.monotonic() + 3
            while len(stopped_after) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(stopped_after) == 2 and stopped_after[1] - left < 1.0
            # each counted with the model's name, the stopped batches' decoding time too
            metrics = http.get("/metrics").text
            for outcome in ("timeout", "cancelled"):
                assert f'mt_translate_requests_total{{model="m",outcome="{outcome}"}} 1.0' in (
                    metrics
                ), metrics
            assert 'mt_batch_decode_seconds_count{model="m"} 2.0' in metrics, metrics

            with ThreadPoolExecutor(1) as pool:
                stuck = pool.submit(
                    http.post, "/translate", json={"sentences": ["stuck"], "model": "m"}
                )
                time.sleep(1.5)  # past the timeout, and the decode does not look
                busy = {m: _gauge(http, "mt_busy_seconds", m) for m in ("m", "n")}
                assert busy["m"] > 1.2 and busy["n"] == 0, busy  # the gauge is per model
                health = http.get("/health")
                assert health.status_code == 503 and health.json()["ready"] is False
                assert http.get("/health/live").status_code == 200
                # each model answers for itself: the other one stays ready, and answers
                assert http.get("/health", params={"model": "m"}).status_code == 503
                fine = http.get("/health", params={"model": "n"})
                assert fine.status_code == 200 and fine.json()["models"]["m"]["ready"] is False
                assert http.post("/translate", json={"sentences": ["x"], "model": "n"}).is_success
                release.set()
                assert stuck.result().status_code == 503
            assert http.get("/health").status_code == 200
    finally:
        release.set()
        server.should_exit = True
        thread.join(10)
        batcher.close(5)


def _gauge(http, name: str, model: str) -> float:
    found = re.search(rf'^{name}{{model="{model}"}} (\S+)$', http.get("/metrics").text, re.M)
    assert found, name
    return float(found.group(1))


def test_the_real_search_stops_at_its_next_step(tiny_run):
    """decode_batch through the Translator's per-step hook: once stopped() says so, the
    search raises Stopped at its next decoder step."""
    from mt.decode.translator import Translator
    from mt.serve.decoding import Settings, decode_batch

    translator = Translator.load(tiny_run / "best.pt", "cpu")
    asked = []

    def stopped():
        asked.append(1)
        return len(asked) > 3

    settings = Settings(translator.options(beam=4))
    with pytest.raises(Stopped):
        decode_batch(translator, ["a b c d e f"] * 4, settings, stopped)
    assert len(asked) == 4
    assert decode_batch(translator, ["a b"], settings)[0]["text"] is not None


# -- numbers and JSON -------------------------------------------------------------------------

HOSTILE = [
    (b'{"sentences": ["a"], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nested"),
    (b'{"sentences": ["a"], "beam": ' + b"9" * 5000 + b"}", 400, "digits"),
    (b'{"sentences": ["a"], "sample": true, "temperature": Infinity}', 400, "Infinity"),
    (b'{"sentences": ["a"], "length_penalty": NaN}', 400, "NaN"),
    ({"sentences": ["a"], "sample": True, "seed": 2**64}, 422, "seed"),
    ({"sentences": ["a"], "sample": True, "seed": 10**4000}, 422, "seed"),
    ({"sentences": ["a"], "beam": 10**4000}, 422, "beam"),
    ({"sentences": ["a"], "sample": True, "topk": -(10**4000)}, 422, "topk"),
    ({"sentences": ["a"], "length_penalty": 1e308}, 422, "length_penalty"),
    ({"sentences": ["a"], "sample": True, "temperature": 1e-300}, 422, "temperature"),
    ({"sentences": ["a"], "sample": True, "temperature": 1e308}, 422, "temperature"),
    ({"sentences": ["a"], "sample": True, "topk": 10**30}, 422, "topk"),
    ({"sentences": ["a"], "prefix": "ok 😀"}, 422, "never occurred"),
]


@pytest.mark.parametrize("body, status, words", HOSTILE, ids=[h[2] for h in HOSTILE])
def test_hostile_numbers_and_json_are_4xx(server, body, status, words):
    _one_line(server.post(body), status, words)
    assert server.post({"sentences": ["a b"]}).status_code == 200


def test_a_tiny_nucleus_keeps_the_top_token(server):
    answer = server.post({"sentences": ["a b"], "sample": True, "topp": 1e-300, "seed": 1})
    assert answer.status_code == 200, answer.text


# -- connections ------------------------------------------------------------------------------


def _connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """The server closed the socket (read gives EOF or a reset) within `seconds`."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_slow_clients_are_cut_off(server):
    """Half the headers, a stalled body, and an idle keep-alive connection are each closed
    after their limit (--header-timeout 2, --body-timeout 2, --keep-alive 1); the body stall
    ends its request without a traceback."""
    half = _connect(server)
    half.sendall(b"POST /translate HTTP/1.1\r\nHost: localhost\r\n")
    stalled = _connect(server)
    stalled.sendall(b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                    b"application/json\r\nContent-Length: 100\r\n\r\n{\"sent")  # fmt: skip
    gone = _connect(server)  # a client that leaves mid-body (no traceback in the log)
    gone.sendall(b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 100\r\n\r\n{\"sent")  # fmt: skip
    gone.close()
    idle = _connect(server)
    idle.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert b"200 OK" in idle.recv(4096)
    idle.sendall(b"GET /health HTTP/1.1\r\n")  # half the next request, then nothing
    started = time.monotonic()
    for sock in (half, stalled, idle):
        assert _closed_within(sock, 6), sock
        sock.close()
    assert time.monotonic() - started < 6
    assert server.post({"sentences": ["a b"]}).status_code == 200


@pytest.mark.slow
def test_stalled_connections_do_not_lock_out_other_clients(server, sentences):
    """500 connections that send half their headers and stall (against --max-connections 60):
    the oldest are closed as new ones come, and 20 normal clients meanwhile are answered
    within their timeout; the server never holds more than about 60 sockets."""
    stalled = []
    try:
        for _ in range(500):
            sock = _connect(server)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: loc")
            stalled.append(sock)
        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda s: server.post({"sentences": [s]}), sentences[:20]))
        assert [a.status_code for a in answers] == [200] * 20
        sockets = _open_sockets(server.proc.pid)
        assert sockets <= 60 + 10, sockets
    finally:
        for sock in stalled:
            sock.close()


def _open_sockets(pid: int) -> int:
    import os

    fds = os.listdir(f"/proc/{pid}/fd")
    return sum(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in fds)


# -- browsers ---------------------------------------------------------------------------------


def test_other_web_pages_cannot_drive_the_server(server, tiny_run):
    """A form or text/plain POST (which a browser sends to any site without asking) is 415;
    a Host that is not the server's (DNS rebinding) is 421; no CORS header is given to another
    origin; /info names no path of the machine; the page carries a restrictive CSP."""
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": kind} if kind else {}
        answer = server.http.post("/translate", content=b'{"sentences": ["a"]}', headers=headers)
        assert _one_line(answer, 415, "application/json")["field"] == "Content-Type"
    for host in ("evil.example", "evil.example:8000", "127.0.0.2"):
        answer = server.http.get("/info", headers={"Host": host})
        _one_line(answer, 421, "--allowed-host")
    for host in ("localhost", f"localhost:{server.port}", f"127.0.0.1:{server.port}"):
        assert server.http.get("/info", headers={"Host": host}).status_code == 200
    preflight = server.http.options("/translate", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})  # fmt: skip
    assert "access-control-allow-origin" not in preflight.headers
    info = server.http.get("/info").text
    assert str(tiny_run) not in info and str(tiny_run.parent) not in info
    assert json.loads(info)["models"] == [f"{tiny_run.name}/best.pt"]
    policy = server.http.get("/").headers["content-security-policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert "'unsafe-inline'" not in policy and "connect-src 'self'" in policy


def test_cors_origins_and_hosts_named_by_flags_are_allowed():
    batcher = Batcher(lambda s, _, __: list(s), max_wait=0.0)
    app = create_app(Served("m", ScriptedTranslator(), INFO, batcher), Limits(), None,
                     ("mt.example",), ("https://ok.example",))  # fmt: skip
    url, thread, server = _serve_in_thread(app)
    try:
        with httpx.Client(base_url=url, timeout=10) as http:
            asks = {"Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type"}  # fmt: skip
            ok = http.options("/translate", headers={"Origin": "https://ok.example", **asks,
                                                     "Host": "mt.example"})  # fmt: skip
            assert ok.headers.get("access-control-allow-origin") == "https://ok.example"
            other = http.options("/translate", headers={"Origin": "https://evil.example",
                                                        **asks, "Host": "mt.example"})  # fmt: skip
            assert "access-control-allow-origin" not in other.headers
            assert other.status_code == 400 and other.json()["field"] == "Origin", other.text
            assert http.get("/health", headers={"Host": "mt.example:80"}).status_code == 200
            assert http.get("/health", headers={"Host": "localhost"}).status_code == 421
    finally:
        server.should_exit = True
        thread.join(10)
        batcher.close(5)


def _response(sock: socket.socket) -> bytes:
    """One whole HTTP answer from the socket: its head, then as many body bytes as its
    Content-Length says (a head and its body may come in separate reads)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += sock.recv(4096)
    return head + b"\r\n\r\n" + body


def test_over_the_cap_a_stalled_connection_goes_before_an_answered_idle_one():
    """With 3 connections allowed: an answered client's idle keep-alive connection (the oldest)
    survives a fourth connection, which closes the oldest never-answered (stalled) one; the
    answered client then sends again on its connection and is answered."""
    from mt.serve.connections import guarded

    batcher = Batcher(lambda s, _, __: list(s), max_wait=0.0)
    app = create_app(Served("m", ScriptedTranslator(), INFO, batcher), Limits())
    url, thread, server = _serve_in_thread(app, timeout_keep_alive=30, http=guarded(30, 30, 3))
    port = int(url.rsplit(":", 1)[1])
    ask = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
    socks = []
    try:
        answered = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks.append(answered)
        answered.sendall(ask)
        assert _response(answered).startswith(b"HTTP/1.1 200 OK")
        stalled = []
        for _ in range(2):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: loc")
            stalled.append(sock)
            socks.append(sock)
            time.sleep(0.2)  # (each one waiting longer than the next)
        newest = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks.append(newest)
        assert _closed_within(stalled[0], 3)  # the oldest stalled one, not the answered one
        assert not _closed_within(stalled[1], 0.3)
        answered.sendall(ask)
        assert _response(answered).startswith(b"HTTP/1.1 200 OK")
    finally:
        for sock in socks:
            sock.close()
        server.should_exit = True
        thread.join(10)
        batcher.close(5)


def test_a_connection_refused_at_the_cap_is_told_to_the_door():
    """With 2 connections allowed and both busy with a request, a third is answered 503 and
    closed, and the refusal is told (counted and logged by mt serve: mt.serve.observe.Door)."""
    from mt.serve.connections import guarded

    gate, told = threading.Event(), []
    batcher = Batcher(lambda s, _, __: (gate.wait(10), list(s))[1], max_wait=0.0, batching=False)
    app = create_app(Served("m", ScriptedTranslator(), INFO, batcher), Limits())
    protocol = guarded(30.0, 30.0, 2, lambda *refusal: told.append(refusal))
    url, thread, server = _serve_in_thread(app, http=protocol)
    port = int(url.rsplit(":", 1)[1])
    body = b'{"sentences": ["a"]}'
    ask = b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    ask += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
    try:
        for sock in socks:
            sock.sendall(ask)
        time.sleep(0.3)  # (both requests are in)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as third:
            assert _response(third).startswith(b"HTTP/1.1 503 ")
        assert told == [(told[0][0], 503, "max_connections")], told
        gate.set()
        assert all(_response(sock).startswith(b"HTTP/1.1 200 OK") for sock in socks)
    finally:
        gate.set()
        for sock in socks:
            sock.close()
        server.should_exit = True
        thread.join(10)
        batcher.close(5)


# -- strict input -----------------------------------------------------------------------------


def test_what_a_request_says_twice_or_encoded_or_unnamed_is_refused(server):
    """A key given twice (the first value would be dropped unseen), a compressed body (read as
    JSON without being decoded) and a request naming no host (the Host check passed it) are
    each refused in one line."""
    twice = server.post(b'{"sentences": ["a b"], "sentences": ["c d"]}')
    assert _one_line(twice, 400, '"sentences"', "twice")["field"] == "sentences"
    nested = server.post(b'{"sentences": ["a b"], "beam": 2, "beam": 3}')
    _one_line(nested, 400, '"beam"', "twice")
    packed = server.post(b'{"sentences": ["a b"]}', **{"Content-Encoding": "br"})
    _one_line(packed, 415, "Content-Encoding br")
    assert server.post(b'{"sentences": ["a b"]}', **{"Content-Encoding": "identity"}).is_success
    for host in (b"Host: \r\n", b""):  # an empty Host, and HTTP/1.0 without one
        with _connect(server) as sock:
            version = b"1.1" if host else b"1.0"
            sock.sendall(b"GET /health HTTP/" + version + b"\r\n" + host + b"\r\n")
            head = sock.recv(4096).split(b"\r\n")[0]
        assert b" 421 " in head, (host, head)


@pytest.mark.parametrize("key,needle", [("", "is empty"), ("clé", "printable ASCII"),
                                        (" key", "printable ASCII")])  # fmt: skip
def test_a_key_no_client_could_send_is_refused_at_start(tiny_run, key, needle):
    from tests.conftest import run_mt

    # (a subprocess with a time limit: a server that started anyway would never return)
    proc = run_mt("serve", tiny_run, "--api-key", key, "--port", free_port(), timeout=60)
    err = proc.stderr
    assert proc.returncode == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_an_empty_key_in_the_environment_is_refused_at_start(tiny_run):
    """MT_API_KEY="$KEY" with KEY unset: the flag's parser reads an empty variable as none,
    which once started an open server without a word."""
    import subprocess
    import sys

    from tests.conftest import cli_env

    args = [sys.executable, "-m", "mt", "serve", str(tiny_run), "--port", str(free_port())]
    proc = subprocess.run(
        args, env=cli_env(MT_API_KEY=""), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "MT_API_KEY) is empty" in proc.stderr, proc.stderr


def test_an_error_quotes_a_bounded_part_of_what_it_refuses(server):
    """A refused value of any length is quoted in at most ~100 characters: a long prefix the
    model cannot write, an unknown model name, a long path (a 1,197-byte message before), an
    unknown key of 100,000 characters (echoed whole in the message and the field before)."""
    answers = [
        server.post({"sentences": ["a b"], "prefix": "é" * 900}),
        server.post({"sentences": ["a b"], "model": "m" * 900}),
        server.http.get("/" + "p" * 900),
        server.post({"sentences": ["a b"], "k" * 100_000: 1}),
    ]
    for answer in answers:
        assert 400 <= answer.status_code < 500, answer.text[:200]
        message = answer.json()["error"]
        assert len(message) < 300 and "..." in message, message
        assert len(answer.content) < 600, answer.content[:200]


SMUGGLED = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-ID: SMUGGLED\r\n\r\n"


@pytest.mark.parametrize(
    "head",
    [
        b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json",
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1",
        b"GET /info HTTP/1.1\r\nHost: 127.0.0.1",
        b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain",  # 415
        b"GET /health HTTP/1.1\r\nHost: rebound.example",  # 421
        b"GET /nowhere HTTP/1.1\r\nHost: 127.0.0.1",  # 404
        b"DELETE /health HTTP/1.1\r\nHost: 127.0.0.1",  # 405
    ],
)
@pytest.mark.parametrize(
    "chunked", [b"Transfer-Encoding: chunked", b"transfer-encoding:  Chunked "]
)
def test_a_body_with_two_lengths_is_refused_on_every_path_and_hides_nothing(server, head, chunked):
    """Content-Length beside Transfer-Encoding (a request smuggled past a proxy that reads the
    other one): on every path and whatever the answer would have been, 400, the connection
    closed, and the request after the body's last chunk never answered."""
    body = b'{"sentences": ["a b"]}'
    framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    with _connect(server) as sock:
        sock.sendall(
            head + b"\r\nContent-Length: 5\r\n" + chunked + b"\r\n\r\n" + framed + SMUGGLED
        )
        answer = b""
        sock.settimeout(5)
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except TimeoutError:
            pytest.fail(f"the connection stayed open: {answer[:300]!r}")
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b"SMUGGLED" not in answer and answer.count(b"HTTP/1.1") == 1, answer


def test_a_request_the_parser_refuses_is_counted_and_logged(server):
    """A request h11 cannot parse is answered 400 by uvicorn before the app sees it: it is
    counted (mt_refused_connections, mt_requests under the path "-") and logged as a
    request is, with an id."""

    def refused() -> float:
        text = server.http.get("/metrics").text
        name = 'mt_refused_connections_total{reason="malformed_request"}'
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    before = refused()
    with _connect(server) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(4096).startswith(b"HTTP/1.1 400 ")
    assert refused() == before + 1
    deadline = time.monotonic() + 5
    while not any('"- -" 400' in line and "malformed_request id=" in line for line in server.lines):
        assert time.monotonic() < deadline, server.lines[-5:]
        time.sleep(0.05)


def test_head_probes_get_routes_and_odd_expectations_and_hosts_are_answered_usefully(server):
    """HEAD on every GET route answers as GET without a body (load balancers probe so); an
    Expect other than 100-continue is 417; an IPv6 loopback Host is a name of the server, and
    the 421 for another name or for none says a usable fix."""
    for path in ("/", "/health", "/health/live", "/metrics", "/models", "/info"):
        got, head = server.http.get(path), server.http.head(path)
        assert head.status_code == got.status_code == 200 and head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
    odd = server.http.get("/health", headers={"Expect": "200-ok"})
    assert odd.status_code == 417 and odd.json()["field"] == "Expect", odd.text
    assert server.http.post("/translate", json={"sentences": ["a b"]},
                            headers={"Expect": "100-continue"}).is_success  # fmt: skip
    for host in ("::1", "[::1]:8000", "[::1]"):
        assert server.http.get("/health", headers={"Host": host}).status_code == 200, host
    other = server.http.get("/health", headers={"Host": "mt.example.org:8080"})
    assert other.status_code == 421 and "--allowed-host 'mt.example.org'" in other.json()["error"]
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: \r\n\r\n")
        answer = _response(sock)
    assert b" 421 " in answer.split(b"\r\n")[0] and b"Host: 127.0.0.1" in answer, answer


@pytest.mark.slow
def test_a_flood_of_requests_to_tokenize_leaves_the_server_answering(server):
    """Ten requests of 5 sentences and a 1,000-character prefix of a character the model never
    saw: their tokenizing and checks run off the event loop, so /health/live still answers at
    once (3.1 s at worst while they were checked on the loop; 71 ms after, on a busy 2-core
    machine: the bound leaves room for a slower one)."""
    import concurrent.futures

    body = {"sentences": ["a b c"] * 5, "prefix": "一" * 1000}
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        sent = [pool.submit(server.http.post, "/translate", json=body) for _ in range(10)]
        worst = 0.0
        while not all(f.done() for f in sent):
            start = time.perf_counter()
            assert server.http.get("/health/live").status_code == 200
            worst = max(worst, time.perf_counter() - start)
            time.sleep(0.02)
    assert all(f.result().status_code == 422 for f in sent)
    assert worst < 0.5, worst


def test_a_direction_never_trained_is_answered_with_a_warning_the_client_reads():
    """A model of en-de, en-fr and de-en asked for de->fr translates zero-shot and says so in the
    answer's warnings (the server once dropped what mt translate warns); a tgt_lang given
    empty is refused naming tgt_lang; a language token typed into a sentence or the prefix
    (which would choose the language against tgt_lang) is a 422 naming that field."""
    from tests.conftest import tagged_translator

    batcher = Batcher(lambda s, _, __: list(s), max_wait=0.0)
    app = create_app(Served("m", tagged_translator(more=[("de", "en")]), INFO, batcher), Limits())
    url, thread, server = _serve_in_thread(app)
    try:
        with httpx.Client(base_url=url, timeout=10) as http:
            asked = {"sentences": ["a b"], "src_lang": "de", "tgt_lang": "fr"}
            zero = http.post("/translate", json=asked)
            assert zero.status_code == 200 and "zero-shot" in zero.json()["warnings"][0], zero.text
            trained = http.post("/translate", json={**asked, "src_lang": "en"})
            assert trained.status_code == 200 and "warnings" not in trained.json()
            empty = http.post("/translate", json={**asked, "tgt_lang": ""})
            assert empty.status_code == 422 and empty.json()["field"] == "tgt_lang", empty.text
            unread = http.post("/translate", json={**asked, "src_lang": "fr"})
            assert unread.status_code == 422 and "never translated from fr" in unread.text
            assert unread.json()["field"] == "src_lang"  # (the source at fault, tgt_lang given)
            typed = http.post("/translate", json={"sentences": ["a b", ">>de<< a b"]})
            assert typed.status_code == 422 and typed.json()["field"] == "sentences.1", typed.text
            assert ">>de<<" in typed.json()["error"]
            prefixed = http.post("/translate", json={"sentences": ["a"], "prefix": ">>de<< a"})
            assert prefixed.status_code == 422 and prefixed.json()["field"] == "prefix"
    finally:
        server.should_exit = True
        thread.join(10)
        batcher.close(5)
