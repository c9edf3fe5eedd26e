"""The HTTP API of `mt serve` (FastAPI): translate, model information, health, and the web
page. Every bad request is a 4xx whose JSON body is one line naming the field
({"error": "...", "field": "..."}); nothing a request sends takes the server down.

Browsers: POST /translate takes application/json only (so a page of another site cannot send
it without a CORS preflight, which is refused unless --cors-origin names that site), the Host
header must be one of the server's names (DNS rebinding), and the page runs under a Content
Security Policy that allows its own inline script and style and requests to this server."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect

from mt.config.decode import MAX_BEAM
from mt.decode.options import OptionError
from mt.decode.sampling import Sampling
from mt.errors import MTError
from mt.serve.batcher import Batcher, QueueFull
from mt.serve.decoding import Settings, decode_batch
from mt.serve.limits import BadRequest, Limits, admit, attention_shape, check_sizes

# the Host names a server bound to a loopback address answers to
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class TranslateRequest(BaseModel):
    """POST /translate: sentences and the decoding settings of `mt translate` (unset: the
    model's own, as tuned on its valid split)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    sentences: list[str] = Field(description="the source sentences, one translation each")
    beam: int | None = Field(None, ge=1, le=MAX_BEAM, description="beam size; 1 = greedy")
    length_penalty: float | None = Field(None, ge=0.0, description="scores: logp / len^lp")
    nbest: int = Field(1, ge=1, le=MAX_BEAM, description="translations per sentence, best first")
    sample: bool = Field(False, description="draw each token instead of searching")
    temperature: float = Field(1.0, gt=0.0, description="sample: <1 sharper, >1 flatter")
    topk: int = Field(0, ge=0, description="sample: only the k likeliest tokens (0: all)")
    topp: float = Field(1.0, gt=0.0, le=1.0, description="sample: the nucleus of this mass")
    seed: int | None = Field(None, description="sample: repeatable draws (as mt translate --seed)")
    prefix: str | None = Field(None, description="every translation starts with this text")
    alignment: bool = Field(False, description="add source-output subword links (s-t, 0-based)")
    attention: bool = Field(False, description="add the cross-attention weights (L, H, T, S)")


def _error(status: int, message: str, field: str | None = None, **headers: str) -> JSONResponse:
    body: dict[str, Any] = {"error": " ".join(message.split())}
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status_code=status, headers=headers or None)


def create_app(
    translator: Any,
    info: dict[str, Any],
    batcher: Batcher,
    limits: Limits,
    api_key: str | None = None,
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_NAMES,
    cors_origins: tuple[str, ...] = (),
) -> FastAPI:
    """The app for one loaded translator (a model or an ensemble) and its batcher.
    allowed_hosts: the names the Host header may give (None: any); cors_origins: the other
    sites whose pages may call the API (none by default)."""
    app = FastAPI(
        title="mt serve",
        version=_version(),
        description="Translate with an mt model over HTTP. Errors are JSON: "
        '{"error": "one line", "field": "the field at fault"}.',
        docs_url=None,  # Swagger's page loads its scripts from the internet; /openapi.json stays
        redoc_url=None,
    )

    def authorised(request: Request) -> bool:
        if not api_key:
            return True
        given = request.headers.get("x-api-key") or ""
        auth = request.headers.get("authorization") or ""
        if auth.lower().startswith("bearer "):
            given = given or auth[7:].strip()
        return hmac.compare_digest(given.encode(), api_key.encode())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        what = {404: f"no such path: {request.url.path}", 405: f"{request.method} not allowed here"}
        return _error(e.status_code, what.get(e.status_code, str(e.detail)))

    @app.exception_handler(BadRequest)
    async def _bad(request: Request, e: BadRequest) -> JSONResponse:
        return _error(e.status, e.message, e.field)

    @app.exception_handler(RequestValidationError)  # FastAPI's own checks, should a route add any
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return await _bad(request, _as_bad_request(e.errors()))

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception) -> JSONResponse:
        return _error(500, f"internal error: {type(e).__name__}: {e}")

    html = resources.files("mt.serve").joinpath("page.html").read_text(encoding="utf-8")
    page_headers = {
        "Content-Security-Policy": page_policy(html),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(html, headers=page_headers)

    @app.get("/health", summary="Ready for requests (503 when the model is stuck), how busy")
    async def health() -> JSONResponse:
        busy = batcher.busy_for()
        ready = busy <= limits.timeout  # (a decode past any request's timeout is stuck)
        body = {
            "status": "ok" if ready else "busy",
            "live": True,
            "ready": ready,
            "busy_seconds": round(busy, 1),
            "waiting": batcher.waiting,
            "requests_decoded": batcher.decoded,
            "batches": batcher.batches,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/health/live", summary="The server answers (whatever its model is doing)")
    async def live() -> dict[str, Any]:
        return {"status": "ok", "live": True}

    @app.get("/info", summary="The model: languages, architecture, size, training, decoding")
    async def model_info(request: Request) -> Any:
        if not authorised(request):
            return _unauthorised()
        return info

    @app.post(
        "/translate",
        summary="Translate sentences",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}},
            }
        },
    )
    async def translate(request: Request) -> Any:
        if not authorised(request):
            return _unauthorised()
        _check_json_type(request)
        req = _parse(await _read_body(request, limits.max_body))
        check_sizes(req.sentences, req.prefix, limits)
        settings = _check(req, translator, info)
        lengths = translator.source_lengths(req.sentences)
        admit(lengths, settings.options, req.attention, translator.max_source_len,
              attention_shape(info), limits, info["architecture"] == "nat")  # fmt: skip
        tokens = [n + 1 for n in lengths]
        try:
            future = batcher.submit(req.sentences, settings, tokens, alone=req.seed is not None)
        except QueueFull as e:
            return _error(429, f"too many requests waiting ({e}); try again shortly", None,
                          **{"Retry-After": "1"})  # fmt: skip
        try:
            results = await _answer(request, future, limits.timeout)
        except asyncio.TimeoutError:
            return _error(503, f"timed out after {limits.timeout:g} s waiting for the model; "
                          "send fewer or shorter sentences, or try again", None)  # fmt: skip
        except MTError as e:
            raise BadRequest(422, str(e)) from None
        if results is None:  # the client has gone: nobody reads this
            return Response(status_code=499)
        # (a large answer, attention weights, is written out by a thread: the event loop
        # keeps answering the others meanwhile)
        body = await asyncio.to_thread(json.dumps, {"translations": results})
        return Response(body, media_type="application/json")

    if allowed_hosts is not None:
        app.add_middleware(HostCheck, names=allowed_hosts)
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Content-Type", "Authorization", "X-API-Key"],
        )
    return app


def _version() -> str:
    import mt

    return mt.__version__


def _unauthorised() -> JSONResponse:
    return _error(
        401,
        "missing or wrong API key: send it as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'",
        None,
        **{"WWW-Authenticate": "Bearer"},
    )


async def _answer(request: Request, future: asyncio.Future, timeout: float) -> Any:
    """The request's translations; None when its client went away first. Either way, or on
    timeout (asyncio.TimeoutError), the future is cancelled, which the worker sees at its next
    decoder step: a batch nobody waits for stops being decoded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise asyncio.TimeoutError
            done, _ = await asyncio.wait({future}, timeout=min(left, 0.25))
            if done:
                return future.result()
            if await request.is_disconnected():
                return None
    finally:
        future.cancel()


def _check_json_type(request: Request) -> None:
    """application/json only: a browser sends another site's JSON only after a preflight that
    CORS allows, while a form or text/plain POST would reach the server unasked."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise BadRequest(
            415,
            f"Content-Type {kind or '(none)'}: send the body as JSON with "
            f"Content-Type: application/json",
            "Content-Type",
        )


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"request body of {declared} bytes: at most {limit} (--max-body)")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise BadRequest(413, f"request body over {limit} bytes (--max-body)")
    except ClientDisconnect:  # (a client that left mid-body, or was cut off for stalling)
        raise BadRequest(400, "request body: the client closed the connection before its "
                         "end") from None  # fmt: skip
    return bytes(body)


def _not_json_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse(body: bytes) -> TranslateRequest:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(400, f"request body: not valid UTF-8 (byte {e.start})") from None
    if not text.strip():
        raise BadRequest(400, 'request body: empty; send JSON such as {"sentences": ["..."]}')
    try:
        raw = json.loads(text, parse_constant=_not_json_number)
    except json.JSONDecodeError as e:
        raise BadRequest(400, f"request body: not valid JSON ({e.msg}, line {e.lineno} "
                         f"column {e.colno})") from None  # fmt: skip
    except RecursionError:
        raise BadRequest(400, "request body: JSON nested too deeply") from None
    except ValueError as e:  # NaN/Infinity, or an integer of more digits than Python reads
        raise BadRequest(400, f"request body: {str(e).split(';')[0][:120]}") from None
    if not isinstance(raw, dict):
        raise BadRequest(422, 'request body: a JSON object is wanted, such as {"sentences": [...]}')
    try:
        return TranslateRequest.model_validate(raw)
    except ValidationError as e:
        raise _as_bad_request(e.errors()) from None


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if part != "body") or "body"


def _as_bad_request(errors: Any) -> BadRequest:
    first = errors[0]
    field = _field(first["loc"])
    got = first.get("input")
    shown = "" if first["type"] in ("missing", "extra_forbidden") else f" (got {json.dumps(got)})"
    if first["type"] == "extra_forbidden":
        return BadRequest(422, f"{field}: unknown setting", field)
    return BadRequest(422, f"{field}: {first['msg']}{shown[:80]}", field)


def _check(req: TranslateRequest, translator: Any, info: dict[str, Any]) -> Settings:
    """The checks across fields and against the model; the request's settings."""
    if not req.sample:
        given = {"temperature": req.temperature != 1.0, "topk": req.topk != 0,
                 "topp": req.topp != 1.0, "seed": req.seed is not None}  # fmt: skip
        for name, set_ in given.items():
            if set_:
                raise BadRequest(422, f"{name}: applies with sample: true only", name)
    if req.sample and (req.beam is not None or req.nbest > 1):
        raise BadRequest(422, "sample draws one translation per sentence: leave out beam and nbest",
                         "sample")  # fmt: skip
    if (req.alignment or req.attention) and not info["attention"]["available"]:
        raise BadRequest(422, f"{'attention' if req.attention else 'alignment'}: "
                         f"{info['attention']['why_not']}", "attention")  # fmt: skip
    if (req.alignment or req.attention) and (req.nbest > 1 or req.sample):
        raise BadRequest(422, "alignment and attention come with one translation per sentence "
                         "(nbest 1, no sampling)", "attention")  # fmt: skip
    if info["architecture"] == "nat" and (
        req.beam is not None
        or req.length_penalty is not None
        or req.nbest > 1
        or req.sample
        or req.prefix
    ):
        raise BadRequest(
            422,
            "this model (model.arch nat) decodes by mask-predict: beam, length_penalty, nbest, "
            "sample and prefix do not apply",
            "beam",
        )
    sampling = Sampling(req.temperature, req.topk, req.topp, req.seed) if req.sample else None
    try:
        opts = translator.options(
            beam=req.beam,
            length_penalty=req.length_penalty,
            nbest=req.nbest,
            sampling=sampling,
            prefix=req.prefix or None,
        )
    except OptionError as e:
        raise BadRequest(422, str(e), e.field) from None
    return Settings(opts, alignment=req.alignment, attention=req.attention)


class HostCheck:
    """Refuses (421) a request whose Host header is not one of `names` (any port): a page of
    another site that a DNS name was pointed at this server (DNS rebinding) cannot read it."""

    def __init__(self, app: Any, names: tuple[str, ...]) -> None:
        self.app, self.names = app, {n.lower() for n in names}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
            name = re.sub(r":\d*$", "", host).strip("[]") if host else ""
            if name and name not in self.names:
                shown = host[:60]
                response = _error(
                    421,
                    f"Host {shown!r} is not a name of this server; start mt "
                    f"serve with --allowed-host {shown.split(':')[0]!r} to allow it",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def page_policy(html: str) -> str:
    """The page's Content Security Policy: its own inline script and style (by their hashes),
    requests to this server, nothing from elsewhere, no framing."""

    def hashes(tag: str) -> str:
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)
        digests = [hashlib.sha256(body.encode()).digest() for body in found]
        return " ".join(f"'sha256-{base64.b64encode(d).decode()}'" for d in digests)

    return (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


__all__ = ["Limits", "TranslateRequest", "create_app", "decode_batch"]
