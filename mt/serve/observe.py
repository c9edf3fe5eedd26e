"""What `mt serve` tells its operator: a request id on every answer (the client's X-Request-ID
when it sends a sane one), an access log line per request, and Prometheus metrics at /metrics
(prometheus_client's text format)."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from mt.errors import shorten

ACCESS_LOG = logging.getLogger("mt.serve.access")
_SANE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
# the paths metrics are labelled with (any other path counts as "other": a scan of random
# paths must not grow the metrics without bound)
ROUTES = (
    "/",
    "/translate",
    "/info",
    "/models",
    "/health",
    "/health/live",
    "/metrics",
    "/openapi.json",
)
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_SENTENCES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """The server's metrics in a registry of their own (several servers in one process, as in
    tests, do not share counts)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()

        def counter(name: str, what: str, *labels: str) -> Counter:
            return Counter(name, what, list(labels), registry=r)

        def histogram(name: str, what: str, label: str, buckets=_SECONDS) -> Histogram:
            return Histogram(name, what, [label], buckets=buckets, registry=r)

        self.requests = counter("mt_requests", "HTTP requests answered", "path", "status")
        self.latency = histogram(
            "mt_request_seconds", "from a request's arrival to its answer", "path"
        )
        self.decode = histogram("mt_batch_decode_seconds", "the decoding time of a batch", "model")
        self.batch = histogram(
            "mt_batch_sentences", "sentences in a decoded batch", "model", _SENTENCES
        )
        self.sentences = counter("mt_sentences", "sentences translated", "model")
        self.waiting = Gauge(
            "mt_waiting_requests", "requests queued or part-way decoded", ["model"], registry=r
        )
        self.busy = Gauge(
            "mt_busy_seconds",
            "how long the model's batch under way has decoded (0: idle)",
            ["model"],
            registry=r,
        )
        # /translate by model (a configured name; "-" before one was chosen) and by how it
        # ended: what the expensive and the refused requests cost is seen per model
        self.translations = counter(
            "mt_translate_requests", "translation requests by model and outcome", "model", "outcome"
        )
        self.translate_latency = histogram(
            "mt_translate_request_seconds", "a translation request's time, by model", "model"
        )
        # connections refused before a request reached the app: a request h11 could not
        # parse (400), a connection over --max-connections with every other one busy (503)
        self.refused = counter(
            "mt_refused_connections", "connections refused before a request was read", "reason"
        )

    def batch_done(self, model: str, sentences: int, seconds: float) -> None:
        self.decode.labels(model).observe(seconds)
        self.batch.labels(model).observe(sentences)
        self.sentences.labels(model).inc(sentences)

    def render(self, models: dict[str, tuple[int, float]]) -> bytes:
        """The metrics' text; models: each model's (requests waiting, seconds busy) now."""
        from prometheus_client import generate_latest

        for model, (waiting, busy) in models.items():
            self.waiting.labels(model).set(waiting)
            self.busy.labels(model).set(busy)
        return generate_latest(self.registry)


def request_id(scope: dict) -> str:
    given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
    return given if _SANE_ID.fullmatch(given) else uuid.uuid4().hex


class Observe:
    """ASGI middleware, outermost: gives each request its id (scope state "request_id", and
    the X-Request-ID header of the answer), counts and times it, and logs one line when it is
    answered. What a route knows (sentences, model, decoding time) it leaves in the request's
    state."""

    def __init__(self, app: Any, metrics: Metrics, log: Callable[[str], None]) -> None:
        self.app, self.metrics, self.log = app, metrics, log

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        rid = request_id(scope)
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        status = 500

        async def send_with_id(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", []), (b"x-request-id", rid.encode())]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            seconds = time.perf_counter() - started
            path = scope["path"] if scope["path"] in ROUTES else "other"
            self.metrics.requests.labels(path, str(status)).inc()
            self.metrics.latency.labels(path).observe(seconds)
            if path == "/translate":
                model = str(state.get("model", "-"))
                self.metrics.translations.labels(model, outcome(status)).inc()
                self.metrics.translate_latency.labels(model).observe(seconds)
            self.log(_line(scope, state, status, seconds, rid))


class Door:
    """What the connections (mt/serve/connections.py) refuse before the app sees a request,
    counted (mt_refused_connections by reason, mt_requests under the path "-") and logged as
    an access line of its own: `client "- -" STATUS 0.0 ms refused: REASON id=ID`."""

    def __init__(self, metrics: Metrics, log: Callable[[str], None]) -> None:
        self.metrics, self.log = metrics, log

    def __call__(self, client: tuple[str, int] | None, status: int, reason: str) -> None:
        self.metrics.refused.labels(reason).inc()
        self.metrics.requests.labels("-", str(status)).inc()
        address = _field(str((client or ("-", 0))[0]), 64)
        self.log(f'{address} "- -" {status} 0.0 ms refused: {reason} id={uuid.uuid4().hex}')


# how a translation request ended, by its status (mt.serve.app answers each case so)
OUTCOMES = {
    200: "answered",
    499: "cancelled",
    503: "timeout",
    429: "queue_full",
    401: "unauthorised",
    413: "too_costly",
}


def outcome(status: int) -> str:
    """answered, cancelled (the client left), timeout, queue_full, unauthorised, too_costly,
    refused (another 4xx: a bad request) or failed (a 5xx)."""
    if status in OUTCOMES:
        return OUTCOMES[status]
    return "refused" if 400 <= status < 500 else "failed"


def _line(scope: dict, state: dict, status: int, seconds: float, rid: str) -> str:
    """One access-log line: client, request, status, sentences, time, decoding time, model, id.
    What a client chose (the method, the path; the client's address where a trusted proxy
    gave it) is escaped and bounded: no line break, no quote that would end the request's
    field, no field that grows the line without end."""
    client = (scope.get("client") or ("-", 0))[0]
    method, path = _field(scope["method"], 16), _field(scope["path"], 80)
    what = f'{_field(str(client), 64)} "{method} {path}" {status} {seconds * 1000:.1f} ms'
    if "sentences" in state:
        what += (
            f" {state['sentences']} sentence{'s' * (state['sentences'] != 1)}, decoding "
            f"{state.get('decode_seconds', 0.0) * 1000:.1f} ms, model {state.get('model', '-')}"
        )
    return f"{what} id={rid}"


def _field(text: str, limit: int) -> str:
    """A client's text as one log field: non-ASCII and control characters escaped (no line
    break from a URL), a quote escaped, at most `limit` characters."""
    escaped = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return shorten(escaped, limit)
