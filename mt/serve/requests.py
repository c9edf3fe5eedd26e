"""Reading and checking one POST /translate: the body (JSON only, within --max-body, a
client that leaves mid-body), its parse into TranslateRequest, the checks across its fields
and against the model (its DecodeOptions, its language pairs), and the wait for its answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from mt.data.pairs import SourceError, lead_token, tagged
from mt.decode.options import OptionError
from mt.decode.sampling import Sampling
from mt.errors import MTError, shorten
from mt.serve.decoding import Settings
from mt.serve.limits import BadRequest
from mt.serve.schemas import TranslateRequest


def error(status: int, message: str, field: str | None = None, **headers: str) -> JSONResponse:
    body: dict[str, Any] = {"error": " ".join(message.split())}
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status_code=status, headers=headers or None)


async def answer(request: Request, future: asyncio.Future, timeout: float) -> Any:
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


def check_json_type(request: Request) -> None:
    """application/json only: a browser sends another site's JSON only after a preflight that
    CORS allows, while a form or text/plain POST would reach the server unasked. A body in an
    encoding (gzip, br) would be read as JSON without being decoded: refused too."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise BadRequest(
            415,
            f"Content-Type {shorten(kind, 60) or '(none)'}: send the body as JSON with "
            f"Content-Type: application/json",
            "Content-Type",
        )
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise BadRequest(
            415,
            f"Content-Encoding {shorten(encoding, 60)}: send the JSON body uncompressed",
            "Content-Encoding",
        )


async def read_body(request: Request, limit: int) -> bytes:
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
        raise BadRequest(
            400, "request body: the client closed the connection before its end"
        ) from None
    return bytes(body)


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, with each key once: of two "sentences" one would be dropped unseen."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise BadRequest(
                400,
                f"request body: the key {shorten(json.dumps(key), 60)} is "
                f"given twice; give each setting once",
                key[:60],
            )
        seen.add(key)
    return dict(pairs)


def _not_json_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse(body: bytes) -> TranslateRequest:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(400, f"request body: not valid UTF-8 (byte {e.start})") from None
    if not text.strip():
        raise BadRequest(400, 'request body: empty; send JSON such as {"sentences": ["..."]}')
    try:
        raw = json.loads(text, parse_constant=_not_json_number, object_pairs_hook=_no_repeats)
    except json.JSONDecodeError as e:
        raise BadRequest(
            400, f"request body: not valid JSON ({e.msg}, line {e.lineno} column {e.colno})"
        ) from None
    except RecursionError:
        raise BadRequest(400, "request body: JSON nested too deeply") from None
    except ValueError as e:  # NaN/Infinity, or an integer of more digits than Python reads
        raise BadRequest(400, f"request body: {str(e).split(';')[0][:120]}") from None
    if not isinstance(raw, dict):
        raise BadRequest(422, 'request body: a JSON object is wanted, such as {"sentences": [...]}')
    try:
        return TranslateRequest.model_validate(raw)
    except ValidationError as e:
        raise as_bad_request(e.errors()) from None


def _field(loc: tuple[Any, ...]) -> str:
    """The field at fault, as the request names it: bounded (an unknown key may be any size)."""
    return shorten(".".join(str(part) for part in loc if part != "body") or "body", 60)


def as_bad_request(errors: Any) -> BadRequest:
    first = errors[0]
    field = _field(first["loc"])
    got = first.get("input")
    shown = "" if first["type"] in ("missing", "extra_forbidden") else f" (got {json.dumps(got)})"
    if first["type"] == "extra_forbidden":
        return BadRequest(422, f"{field}: unknown setting", field)
    return BadRequest(422, f"{field}: {first['msg']}{shown[:80]}", field)


def settings_of(req: TranslateRequest, translator: Any, info: dict[str, Any]) -> Settings:
    """The checks across fields and against the model; the request's settings."""
    _check_together(req, info)
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


def _check_together(req: TranslateRequest, info: dict[str, Any]) -> None:
    """Fields that do not go together, or not with this model (/info's)."""
    if not req.sample:
        given = {
            "temperature": req.temperature != 1.0,
            "topk": req.topk != 0,
            "topp": req.topp != 1.0,
            "seed": req.seed is not None,
        }
        for name, set_ in given.items():
            if set_:
                raise BadRequest(422, f"{name}: applies with sample: true only", name)
    if req.sample and (req.beam is not None or req.nbest > 1):
        raise BadRequest(
            422, "sample draws one translation per sentence: leave out beam and nbest", "sample"
        )
    if (req.alignment or req.attention) and not info["attention"]["available"]:
        raise BadRequest(
            422,
            f"{'attention' if req.attention else 'alignment'}: {info['attention']['why_not']}",
            "attention",
        )
    if (req.alignment or req.attention) and (req.nbest > 1 or req.sample):
        raise BadRequest(
            422,
            "alignment and attention come with one translation per sentence (nbest 1, no sampling)",
            "attention",
        )
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


def in_language(req: TranslateRequest, translator) -> tuple[TranslateRequest, list[str]]:
    """The request with its sentences led by the target-language token its src_lang and
    tgt_lang ask for (a model of several pairs; mt/data/pairs.py), and the warnings for its
    client (a direction never trained); a pair the model cannot translate is a 422 naming
    the field."""
    said: list[str] = []
    try:
        lang = lead_token(translator.languages, req.src_lang, req.tgt_lang, said.append)
    except MTError as e:
        given = "tgt_lang" if req.tgt_lang is not None else "src_lang"
        raise BadRequest(422, str(e), "src_lang" if isinstance(e, SourceError) else given) from None
    warnings = [x.removeprefix("warning: ") for x in said]
    if lang is None:
        return req, warnings
    return req.model_copy(update={"sentences": tagged(req.sentences, lang)}), warnings


def timed_out(e: Exception, timeout: float) -> JSONResponse:
    """503 for a request whose answer did not come within `timeout` (asyncio.TimeoutError), or
    whose batch ended at an older request's deadline (the batcher's TimedOut)."""
    if isinstance(e, asyncio.TimeoutError):
        why = (
            f"timed out after {timeout:g} s waiting for the model; send fewer or shorter "
            f"sentences, or try again"
        )
    else:  # merged into a batch that an older request's deadline ended
        why = (
            f"the batch this request shared reached an earlier request's timeout "
            f"({timeout:g} s); try again"
        )
    return error(503, why, None)
