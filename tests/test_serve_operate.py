"""`mt serve` as a service is run: two models chosen by name in one server, an access-log line
and a request id per request, Prometheus metrics that move with the requests, and OpenAPI
schemas for every answer and error."""

from __future__ import annotations

import re

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
prometheus = pytest.importorskip("prometheus_client.parser")

from tests.test_serve import Server, _translate_cli  # noqa: E402


@pytest.fixture(scope="module")
def two(tiny_run):
    """The run's best model as "best" and its step-30 snapshot as "early"."""
    s = Server("--model", f"best={tiny_run}", "--model", f"early={tiny_run / 'step_30.pt'}")
    yield s
    code, err = s.stop()
    assert code == 0, err


@pytest.fixture(scope="module")
def sentences(tiny_run) -> list[str]:
    return (tiny_run.parent / "data" / "test.src").read_text().splitlines()[:6]


def test_two_models_answer_by_name(two, tiny_run, sentences, tmp_path):
    """Each name translates as `mt translate` does with its checkpoint; a request without a
    name, or with an unknown one, is a 422 naming the choices; /models lists both and /info
    describes the one asked for."""
    for name, path in (("best", tiny_run), ("early", tiny_run / "step_30.pt")):
        answer = two.post({"sentences": sentences, "model": name})
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == name
        got = [t["text"] for t in answer.json()["translations"]]
        assert got == _translate_cli(path, tmp_path, sentences)
    for body in ({"sentences": ["a b"]}, {"sentences": ["a b"], "model": "late"}):
        error = two.post(body)
        assert error.status_code == 422 and error.json()["field"] == "model"
        assert "best, early" in error.json()["error"]
    listed = two.http.get("/models").json()["models"]
    assert [m["name"] for m in listed] == ["best", "early"]
    assert listed[0]["source_language"] == "src" and not listed[1]["ensemble"]
    assert two.http.get("/info", params={"model": "early"}).json()["training_steps"] == [30]
    assert two.http.get("/info").status_code == 422


def test_a_log_line_and_an_id_per_request(two):
    """Every answer carries X-Request-ID (the client's when it sends a sane one), and the
    server logs one line per request with its method, path, status, sentences, decoding time,
    model and id."""
    mine = two.post({"sentences": ["a b", "c"], "model": "best"}, **{"X-Request-ID": "job-7.1"})
    assert mine.headers["x-request-id"] == "job-7.1"
    for bad in ("two words", "x" * 300):
        given = two.http.get("/health", headers={"X-Request-ID": bad}).headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", given), given
    refused = two.post({"sentences": []})
    rid = refused.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid)
    lines = _log_lines(two)
    (line,) = [x for x in lines if "id=job-7.1" in x]
    assert '"POST /translate" 200' in line and "2 sentences" in line and "model best" in line
    decoding = float(re.search(r"decoding ([\d.]+) ms", line).group(1))
    total = float(re.search(r" 200 ([\d.]+) ms", line).group(1))
    assert 0 < decoding <= total
    (line,) = [x for x in lines if f"id={rid}" in x]
    assert '"POST /translate" 422' in line
    health = [x for x in lines if '"GET /health" 200' in x]
    assert len(health) >= 2


def test_the_access_log_cannot_be_forged(two):
    """A client that names itself in X-Forwarded-For (trusted only from --forwarded-allow-ips
    proxies) is logged by its connection's address; a quote, a line break or a long method in
    what it sends is escaped and bounded, so a line is one request's."""
    two.http.get("/health", headers={"X-Forwarded-For": '6.6.6.6" 200 0.1 ms id=x',
                                     "X-Request-ID": "forged-1"})  # fmt: skip
    two.http.get('/a"%20200%201.0%20ms%0a', headers={"X-Request-ID": "forged-2"})
    two.http.request("A" * 200, "/health", headers={"X-Request-ID": "forged-3"})
    lines = _log_lines(two)
    (first,) = [x for x in lines if "id=forged-1" in x]
    assert ' 127.0.0.1 "GET /health" 200' in first and "6.6.6.6" not in first, first
    (second,) = [x for x in lines if "id=forged-2" in x]
    assert second.count('"') - second.count('\\"') == 2 and "\\n" in second, second
    (third,) = [x for x in lines if "id=forged-3" in x]
    assert len(third) < 200 and '"' + "A" * 16 + "..." in third, third


def _log_lines(server) -> list[str]:
    import time

    time.sleep(0.2)  # (the last lines on their way through the pipe)
    return [line for line in server.lines if " ms" in line and "id=" in line]


def test_metrics_move_with_the_requests(two, sentences):
    def sample(name: str, **labels: str) -> float:
        text = two.http.get("/metrics").text
        for family in prometheus.text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        return 0.0

    before = {
        "ok": sample("mt_requests_total", path="/translate", status="200"),
        "bad": sample("mt_requests_total", path="/translate", status="422"),
        "sentences": sample("mt_sentences_total", model="early"),
        "batches": sample("mt_batch_sentences_count", model="early"),
        "latency": sample("mt_request_seconds_count", path="/translate"),
    }
    for _ in range(3):
        assert two.post({"sentences": sentences[:4], "model": "early"}).status_code == 200
    assert two.post({"sentences": ["a"], "model": "nobody"}).status_code == 422
    assert sample("mt_requests_total", path="/translate", status="200") == before["ok"] + 3
    assert sample("mt_requests_total", path="/translate", status="422") == before["bad"] + 1
    assert sample("mt_sentences_total", model="early") == before["sentences"] + 12
    assert sample("mt_batch_sentences_count", model="early") >= before["batches"] + 1
    assert sample("mt_request_seconds_count", path="/translate") == before["latency"] + 4
    assert sample("mt_waiting_requests", model="early") == 0
    assert two.http.get("/nowhere/at/all").status_code == 404
    assert sample("mt_requests_total", path="other", status="404") >= 1  # (no label per path)
    # translation requests by model and outcome: answered, refused before a model was chosen
    # ("-": no label from what a client sends), too costly for a model
    outcomes = {
        (m, o): sample("mt_translate_requests_total", model=m, outcome=o)
        for m, o in (("early", "answered"), ("-", "refused"), ("best", "too_costly"))
    }
    assert outcomes[("early", "answered")] >= 3 and outcomes[("-", "refused")] >= 1
    costly = two.post({"sentences": [" ".join(sentences)] * 64, "beam": 100, "model": "best"})
    assert costly.status_code == 413
    assert sample("mt_translate_requests_total", model="best", outcome="too_costly") == (
        outcomes[("best", "too_costly")] + 1
    )
    assert sample("mt_translate_request_seconds_count", model="early") >= 3


def test_each_way_a_translation_request_ends_has_its_outcome():
    """The statuses the /translate route answers with, each its own outcome in the metrics."""
    from mt.serve.observe import outcome

    ends = {200: "answered", 499: "cancelled", 503: "timeout", 429: "queue_full",
            401: "unauthorised", 413: "too_costly", 422: "refused", 400: "refused",
            415: "refused", 500: "failed"}  # fmt: skip
    assert {status: outcome(status) for status in ends} == ends


def test_the_schema_describes_every_answer_and_error(two):
    schema = two.http.get("/openapi.json").json()
    translate = schema["paths"]["/translate"]["post"]["responses"]
    assert {"200", "400", "401", "413", "415", "421", "422", "429", "503"} <= set(translate)
    ok = translate["200"]["content"]["application/json"]["schema"]["$ref"]
    assert ok.endswith("/TranslateAnswer")
    error = translate["429"]["content"]["application/json"]["schema"]["$ref"]
    assert error.endswith("/ErrorBody")
    parts = schema["components"]["schemas"]
    named = {"Translation", "Attention", "Alternative", "ErrorBody", "Health", "Models"}
    assert named <= set(parts)
    assert "models" in parts["Models"]["properties"]
    assert schema["paths"]["/models"]["get"]["responses"]["200"]
