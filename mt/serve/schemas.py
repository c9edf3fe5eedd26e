"""The bodies `mt serve` takes and gives, as pydantic models: the request is validated with them,
and the answers and errors are described by them in the OpenAPI schema (/openapi.json and the
generated HTTP reference page)."""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mt.config.decode import MAX_BEAM, MAX_LENGTH_PENALTY
from mt.decode.options import MAX_SEED, MAX_TEMPERATURE, MAX_TOPK, MIN_TEMPERATURE


class TranslateRequest(BaseModel):
    """POST /translate: sentences and the decoding settings of `mt translate` (unset: the
    model's own, as tuned on its valid split)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    sentences: list[str] = Field(description="the source sentences, one translation each")
    model: str | None = Field(
        None, description="the model's name (GET /models); unset: the server's only model"
    )
    beam: int | None = Field(None, ge=1, le=MAX_BEAM, description="beam size; 1 = greedy")
    length_penalty: float | None = Field(
        None, ge=0.0, le=MAX_LENGTH_PENALTY, description="scores: logp / len^lp"
    )
    nbest: int = Field(1, ge=1, le=MAX_BEAM, description="translations per sentence, best first")
    sample: bool = Field(False, description="draw each token instead of searching")
    temperature: float = Field(
        1.0, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE, description="sample: <1 sharper, >1 flatter"
    )
    topk: int = Field(
        0, ge=0, le=MAX_TOPK, description="sample: only the k likeliest tokens (0: all)"
    )
    topp: float = Field(1.0, gt=0.0, le=1.0, description="sample: the nucleus of this mass")
    seed: int | None = Field(
        None, ge=0, le=MAX_SEED, description="sample: repeatable draws (as mt translate --seed)"
    )
    prefix: str | None = Field(None, description="every translation starts with this text")
    src_lang: str | None = Field(
        None,
        max_length=32,
        description="a model of several pairs (GET /info's pairs): the "
        "source language; unset: the model's default direction's, or the one pair into tgt_lang's",
    )
    tgt_lang: str | None = Field(
        None,
        max_length=32,
        description="a model of several pairs: the language to translate "
        "into; unset: the model's default",
    )
    alignment: bool = Field(False, description="add source-output subword links (s-t, 0-based)")
    attention: bool = Field(False, description="add the cross-attention weights (L, H, T, S)")


class Alternative(BaseModel):
    text: str
    score: float | None = Field(description="log-probability / length^length_penalty")


class Attention(BaseModel):
    source: list[str] = Field(description="source subwords (##piece: inside a word), then </s>")
    target: list[str] = Field(description="output subwords, then </s>")
    weights: list[list[list[list[float]]]] = Field(
        description="by decoder layer, head, output subword and source subword; each row sums to 1"
    )


class Translation(BaseModel):
    text: str
    score: float | None = Field(description="the beam's score; null for greedy and sampling")
    nbest: list[Alternative] | None = Field(None, description="with nbest > 1, best first")
    alignment: str | None = Field(None, description="with alignment: 's-t' pairs, 0-based")
    attention: Attention | None = Field(None, description="with attention")


class TranslateAnswer(BaseModel):
    translations: list[Translation] = Field(description="one per sentence, in their order")
    model: str = Field(description="the name of the model that translated them")
    warnings: list[str] | None = Field(
        None,
        description="what the client should know, where there is any: a direction the "
        "model was never trained on (zero-shot), say",
    )


class DecodingInfo(BaseModel):
    """The settings a request's unset fields take: the model's own, as tuned on valid."""

    beam: int
    length_penalty: float
    max_len_a: float = Field(description="outputs of at most max_len_a * source length ...")
    max_len_b: int = Field(description="... + max_len_b subwords")
    nat_iterations: int | None = Field(None, description="mask-predict models only")
    nat_length_beam: int | None = Field(None, description="mask-predict models only")


class AttentionInfo(BaseModel):
    available: bool = Field(description="whether a request may ask for attention: true")
    why_not: str | None = Field(description="why not, where it is not available")
    shape: list[int] | None = Field(description="[decoder layers, heads] of the weights")


class ModelInfo(BaseModel):
    """GET /info: what the server translates with."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="the model's name (a request's model field)")
    mt_version: str
    models: list[str] = Field(description="its checkpoints (run/file), several: an ensemble")
    ensemble: bool
    source_language: str = Field(description="several pairs: the default direction's")
    target_language: str
    pairs: list[str] = Field(description="the directions it was trained on (src-tgt)")
    architecture: str = Field(description="model.arch: transformer, rnn, nat, ...")
    model: dict[str, Any] = Field(description="its shape: d_model, layers, heads, ...")
    parameters: int
    training_steps: list[int] = Field(description="each checkpoint's updates")
    trained_precision: str = Field(description="what training computed in: fp32, bf16, ...")
    device: str
    threads: int = Field(description="torch's threads on a CPU")
    decoding: DecodingInfo
    attention: AttentionInfo


class ErrorBody(BaseModel):
    """Every error: one line, and the request field at fault when there is one."""

    error: str = Field(description="what is wrong and what to do, in one line")
    field: str | None = Field(None, description="the field at fault (sentences.3, beam, ...)")


class ModelHealth(BaseModel):
    ready: bool = Field(description="false while this model decodes one batch past --timeout")
    busy_seconds: float = Field(description="its decode under way, in seconds")
    waiting: int = Field(description="its requests queued or part-way decoded")


class Health(BaseModel):
    status: str = Field(
        description="ok, or busy: a model asked about (?model=, else any) has "
        "decoded one batch past --timeout"
    )
    live: bool
    ready: bool = Field(description="false (with status 503) while a model asked about is stuck")
    busy_seconds: float = Field(description="the longest decode under way, in seconds")
    waiting: int = Field(description="requests queued or part-way decoded")
    requests_decoded: int
    batches: int
    models: dict[str, ModelHealth] = Field(
        default_factory=dict, description="each served model's own readiness, by name"
    )


class ModelEntry(BaseModel):
    name: str = Field(description="what a request's model field gives to choose it")
    source_language: str
    target_language: str
    architecture: str
    ensemble: bool


class Models(BaseModel):
    models: list[ModelEntry]


# the errors each route may answer, for the OpenAPI schema
_ERRORS = {
    400: "malformed body: not JSON, not UTF-8, nested too deeply, a lone surrogate",
    401: "missing or wrong API key (--api-key)",
    413: "too large: sentences, characters, body, a sentence longer than the model reads, "
    "the request's cost or its attention",
    415: "the body is not Content-Type: application/json",
    421: "the Host header is not a name of this server (--allowed-host)",
    422: "a field out of its range, settings that do not go together, an unknown model",
    429: "too many requests waiting (--max-queue); Retry-After says when to try again",
    503: "no answer within --timeout, or every connection busy (--max-connections)",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """FastAPI's `responses` for these error statuses, each with the ErrorBody schema."""
    return {s: {"model": ErrorBody, "description": _ERRORS[s]} for s in statuses}


def limited_openapi(app: Any, max_sentences: int, max_chars: int) -> dict[str, Any]:
    """The app's OpenAPI schema (FastAPI's, made once) with the request limits this server
    enforces, its --max-sentences and --max-chars: FastAPI.openapi in its place."""
    if app.openapi_schema is None:
        schema = copy.deepcopy(type(app).openapi(app))  # (its request schema is shared)
        fields = schema["paths"]["/translate"]["post"]["requestBody"]["content"]
        fields = fields["application/json"]["schema"]["properties"]
        fields["sentences"].update(minItems=1, maxItems=max_sentences)
        fields["sentences"]["items"]["maxLength"] = max_chars
        fields["prefix"]["anyOf"][0]["maxLength"] = max_chars
        app.openapi_schema = schema
    return app.openapi_schema
