"""The HTTP API of `mt serve` (FastAPI): translate, the models and their information, health,
metrics, and the web page. Every bad request is a 4xx whose JSON body is one line naming the
field ({"error": "...", "field": "..."}); nothing a request sends takes the server down.

Several models can be served at once, each under a name a request chooses (`model`), each
with a batcher (its own decoding worker) of its own. Browsers: POST /translate takes
application/json only (so a page of another site cannot send it without a CORS preflight, which
is refused unless --cors-origin names that site), the Host header must be one of the server's
names (DNS rebinding), and the page runs under a Content Security Policy."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from importlib import resources
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from mt.errors import MTError, shorten
from mt.serve.batcher import Batcher, QueueFull, TimedOut, decode_seconds
from mt.serve.decoding import decode_batch
from mt.serve.limits import BadRequest, Limits, admitted, check_sizes
from mt.serve.observe import ACCESS_LOG, Door, Metrics, Observe
from mt.serve.requests import (
    answer,
    as_bad_request,
    check_json_type,
    error,
    in_language,
    parse,
    read_body,
    settings_of,
    timed_out,
)
from mt.serve.schemas import (
    Health,
    ModelHealth,
    ModelInfo,
    Models,
    TranslateAnswer,
    TranslateRequest,
    errors,
    limited_openapi,
)
from mt.serve.web import LOOPBACK_NAMES, Framing, HeadAsGet, HostCheck, JsonCORS, page_policy


@dataclass
class Served:
    """One model the server translates with: its name, its translator (a model or an
    ensemble), what /info says of it, and its batcher."""

    name: str
    translator: Any
    info: dict[str, Any]
    batcher: Batcher


@dataclass
class Service:
    """What the routes share (the app's state "mt"): the models by name, the limits, the API
    key (None: none asked) and the metrics."""

    served: dict[str, Served]
    limits: Limits
    api_key: str | None
    metrics: Metrics

    def authorised(self, request: Request) -> bool:
        if not self.api_key:
            return True
        given = request.headers.get("x-api-key") or ""
        auth = request.headers.get("authorization") or ""
        if auth.lower().startswith("bearer "):
            given = given or auth[7:].strip()
        return hmac.compare_digest(given.encode(), self.api_key.encode())

    def choose(self, name: str | None) -> Served:
        """The model a request names (None: the only one), else 422 naming the choices."""
        if name is None and len(self.served) == 1:
            return next(iter(self.served.values()))
        if name in self.served:
            return self.served[name]
        names = ", ".join(self.served)
        what = "give one" if name is None else f"no model {shorten(repr(name), 60)}"
        raise BadRequest(422, f"model: {what} of {names} (GET /models)", "model")


def create_app(
    models: Served | list[Served],
    limits: Limits,
    api_key: str | None = None,
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_NAMES,
    cors_origins: tuple[str, ...] = (),
    log: Callable[[str], None] = ACCESS_LOG.info,
) -> FastAPI:
    """The app for the served models. allowed_hosts: the names the Host header may give
    (None: any); cors_origins: the other sites whose pages may call the API (none by default);
    log: where the access log's lines go."""
    served = {m.name: m for m in (models if isinstance(models, list) else [models])}
    metrics = Metrics()
    for m in served.values():  # (the batcher counts into the metrics, and ends at the timeout)
        m.batcher.on_batch = lambda n, seconds, name=m.name: metrics.batch_done(name, n, seconds)
        m.batcher.timeout = limits.timeout
    app = FastAPI(
        title="mt serve",
        version=_version(),
        description="Translate with mt models over HTTP. Errors are JSON: "
        '{"error": "one line", "field": "the field at fault"}.',
        docs_url=None,  # Swagger's page loads its scripts from the internet; /openapi.json stays
        redoc_url=None,
    )
    app.state.mt = Service(served, limits, api_key, metrics)
    app.state.door = Door(metrics, log)  # (for the connections: mt/serve/connections.py)
    app.openapi = partial(limited_openapi, app, limits.max_sentences, limits.max_chars)  # type: ignore[method-assign]
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(BadRequest, _bad)
    app.add_exception_handler(RequestValidationError, _invalid)  # (a query parameter's)
    app.add_exception_handler(Exception, _crash)
    app.include_router(router)
    if allowed_hosts is not None:
        app.add_middleware(HostCheck, names=allowed_hosts)
    if cors_origins:
        app.add_middleware(
            JsonCORS,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Content-Type", "Authorization", "X-API-Key", "X-Request-ID"],
            expose_headers=["X-Request-ID"],
        )
    app.add_middleware(HeadAsGet)
    app.add_middleware(Framing)  # (before the Host, the route, the key: on every path)
    app.add_middleware(Observe, metrics=metrics, log=log)  # (outermost: every answer counted)
    return app


# -- errors: one line of JSON each --------------------------------------------------------------


async def _http_error(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, StarletteHTTPException)
    what = {
        404: f"no such path: {shorten(request.url.path, 100)}",
        405: f"{shorten(request.method, 20)} not allowed here",
    }
    return error(e.status_code, what.get(e.status_code, str(e.detail)))


async def _bad(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, BadRequest)
    return error(e.status, e.message, e.field)


async def _invalid(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, RequestValidationError)
    return await _bad(request, as_bad_request(e.errors()))


async def _crash(request: Request, e: Exception) -> JSONResponse:
    return error(500, f"internal error: {type(e).__name__}: {e}")


# -- the routes ---------------------------------------------------------------------------------

router = APIRouter()


def _service(request: Request) -> Service:
    return request.app.state.mt


_HTML = resources.files("mt.serve").joinpath("page.html").read_text(encoding="utf-8")
_PAGE_HEADERS = {
    "Content-Security-Policy": page_policy(_HTML),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page() -> HTMLResponse:
    return HTMLResponse(_HTML, headers=_PAGE_HEADERS)


@router.get(
    "/health",
    summary="Ready for requests (503 while a model is stuck past --timeout), how busy",
    response_model=Health,
    responses={
        503: {"model": Health, "description": "a model is stuck: not ready"},
        **errors(421, 422),
    },
)
async def health(
    request: Request,
    model: str | None = Query(None, description="one model's readiness; unset: every one's"),
) -> JSONResponse:
    """?model=NAME: that model's readiness alone (a load balancer per model); else every
    model's. A decode past any request's timeout is stuck."""
    service = _service(request)
    served = service.served.values()
    asked = [service.choose(model)] if model is not None else list(served)
    each = {
        m.name: ModelHealth(
            ready=m.batcher.busy_for() <= service.limits.timeout,
            busy_seconds=round(m.batcher.busy_for(), 1),
            waiting=m.batcher.waiting,
        )
        for m in served
    }
    ready = all(each[m.name].ready for m in asked)
    body = Health(
        status="ok" if ready else "busy",
        live=True,
        ready=ready,
        busy_seconds=max(each[m.name].busy_seconds for m in asked),
        waiting=sum(m.batcher.waiting for m in served),
        requests_decoded=sum(m.batcher.decoded for m in served),
        batches=sum(m.batcher.batches for m in served),
        models=each,
    )
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get("/health/live", summary="The server answers (whatever its models are doing)")
async def live() -> dict[str, Any]:
    return {"status": "ok", "live": True}


@router.get("/metrics", summary="Prometheus metrics (text format)", response_class=Response)
async def metrics_text(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    service = _service(request)
    now = {m.name: (m.batcher.waiting, m.batcher.busy_for()) for m in service.served.values()}
    return Response(service.metrics.render(now), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/models",
    summary="The models served, by name",
    response_model=Models,
    responses=errors(401, 421),
)
async def models_list(request: Request) -> Any:
    service = _service(request)
    if not service.authorised(request):
        return _unauthorised()
    keys = ("source_language", "target_language", "architecture", "ensemble")
    return {
        "models": [
            {"name": m.name, **{k: m.info[k] for k in keys}} for m in service.served.values()
        ]
    }


@router.get(
    "/info",
    summary="A model: languages, architecture, size, training, decoding",
    response_model=None,  # (documented as ModelInfo, answered as model_info builds it)
    responses={200: {"model": ModelInfo}, **errors(401, 421, 422)},
)
async def model_info(
    request: Request,
    model: str | None = Query(None, description="the model's name; unset: the only one"),
) -> Any:
    service = _service(request)
    if not service.authorised(request):
        return _unauthorised()
    return {"name": (chosen := service.choose(model)).name, **chosen.info}


@router.post(
    "/translate",
    summary="Translate sentences",
    response_model=TranslateAnswer,
    responses=errors(400, 401, 413, 415, 421, 422, 429, 503),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}},
        }
    },
)
async def translate(request: Request) -> Any:
    service = _service(request)
    if not service.authorised(request):
        return _unauthorised()
    check_json_type(request)
    req = parse(await read_body(request, service.limits.max_body))
    request.state.sentences = len(req.sentences)
    check_sizes(req.sentences, req.prefix, service.limits)
    model = service.choose(req.model)
    request.state.model = model.name
    # (tokenizing up to 64 x 1,000 characters, off the event loop: /health/live answers)
    settings = await asyncio.to_thread(settings_of, req, model.translator, model.info)
    req, warnings = in_language(req, model.translator)
    lengths = await asyncio.to_thread(
        admitted, model.translator, model.info, req, settings.options, service.limits
    )
    return await _translated(request, model, req, settings, lengths, service.limits, warnings)


async def _translated(
    request: Request,
    model: Served,
    req: TranslateRequest,
    settings,
    lengths,
    limits: Limits,
    warnings: list[str],
) -> Response:
    """The request queued for its model's worker and answered: its translations (with the
    warnings for its client, where there are any), or 429 (a full queue), 503 (its timeout),
    499 (its client left)."""
    timing: dict[str, float] = {}
    try:
        future = model.batcher.submit(
            req.sentences,
            settings,
            [n + 1 for n in lengths],
            alone=req.seed is not None,
            timing=timing,
        )
    except QueueFull as e:
        return error(
            429, f"too many requests waiting ({e}); try again shortly", None, **{"Retry-After": "1"}
        )
    try:
        results = await answer(request, future, limits.timeout)
    except (TimedOut, asyncio.TimeoutError) as e:
        return timed_out(e, limits.timeout)
    except MTError as e:
        raise BadRequest(422, str(e)) from None
    finally:
        request.state.decode_seconds = decode_seconds(timing)
    if results is None:  # the client has gone: nobody reads this
        return Response(status_code=499)
    # (a large answer, attention weights, is written out by a thread: the event loop keeps
    # answering the others meanwhile)
    said = {
        "translations": results,
        "model": model.name,
        **({"warnings": warnings} if warnings else {}),
    }
    body = await asyncio.to_thread(json.dumps, said)
    return Response(body, media_type="application/json")


def _version() -> str:
    import mt

    return mt.__version__


def _unauthorised() -> JSONResponse:
    return error(
        401,
        "missing or wrong API key: send it as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'",
        None,
        **{"WWW-Authenticate": "Bearer"},
    )


__all__ = ["Limits", "Served", "TranslateRequest", "create_app", "decode_batch"]
