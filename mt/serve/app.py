"""The HTTP API of `mt serve` (FastAPI): translate, model information, health, and the web
page. Every bad request is a 4xx whose JSON body is one line naming the field
({"error": "...", "field": "..."}); nothing a request sends takes the server down."""

from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mt.config.decode import MAX_BEAM
from mt.decode.options import OptionError
from mt.decode.sampling import Sampling
from mt.errors import MTError
from mt.serve.batcher import Batcher, QueueFull
from mt.serve.decoding import Settings, decode_batch


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; each is a flag of `mt serve`."""

    max_sentences: int = 64
    max_chars: int = 1000  # per sentence
    max_body: int = 1 << 20  # bytes
    timeout: float = 30.0  # seconds a request may wait for its answer


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


class BadRequest(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


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
) -> FastAPI:
    """The app for one loaded translator (a model or an ensemble) and its batcher."""
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

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(html)

    @app.get("/health", summary="Is the server up, and how busy")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "waiting": batcher.waiting,
            "requests_decoded": batcher.decoded,
            "batches": batcher.batches,
        }

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
        req = _parse(await _read_body(request, limits.max_body))
        settings = _check(req, translator, info, limits)
        tokens = [len(s.split()) + 1 for s in req.sentences]  # an estimate: words + EOS
        try:
            future = batcher.submit(req.sentences, settings, tokens, alone=req.seed is not None)
        except QueueFull as e:
            return _error(429, f"too many requests waiting ({e}); try again shortly", None,
                          **{"Retry-After": "1"})  # fmt: skip
        try:
            results = await asyncio.wait_for(future, limits.timeout)
        except asyncio.TimeoutError:
            return _error(503, f"timed out after {limits.timeout:g} s waiting for the model; "
                          "send fewer or shorter sentences, or try again", None)  # fmt: skip
        except MTError as e:
            raise BadRequest(422, str(e)) from None
        return {"translations": results}

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


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"request body of {declared} bytes: at most {limit} (--max-body)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BadRequest(413, f"request body over {limit} bytes (--max-body)")
    return bytes(body)


def _parse(body: bytes) -> TranslateRequest:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(400, f"request body: not valid UTF-8 (byte {e.start})") from None
    if not text.strip():
        raise BadRequest(400, 'request body: empty; send JSON such as {"sentences": ["..."]}')
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(400, f"request body: not valid JSON ({e.msg}, line {e.lineno} "
                         f"column {e.colno})") from None  # fmt: skip
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


def _check(
    req: TranslateRequest, translator: Any, info: dict[str, Any], limits: Limits
) -> Settings:
    """The checks across fields and against the limits and the model; the request's settings."""
    if not req.sentences:
        raise BadRequest(422, "sentences: give at least one sentence", "sentences")
    if len(req.sentences) > limits.max_sentences:
        raise BadRequest(
            413,
            f"sentences: {len(req.sentences)} in one request, at most {limits.max_sentences} "
            f"(--max-sentences); send several requests",
            "sentences",
        )
    for i, s in enumerate(req.sentences):
        if len(s) > limits.max_chars:
            raise BadRequest(
                413,
                f"sentences.{i}: {len(s)} characters, at most {limits.max_chars} (--max-chars)",
                f"sentences.{i}",
            )
    if req.prefix is not None and len(req.prefix) > limits.max_chars:
        raise BadRequest(413, f"prefix: at most {limits.max_chars} characters", "prefix")
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


__all__ = ["Limits", "TranslateRequest", "create_app", "decode_batch"]
