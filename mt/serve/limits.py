"""What one request of `mt serve` may ask for, checked before any decoding: its size, the text
a tokenizer can read, inputs the model takes whole, and its cost (the decoding work and the
attention it would return), each refused with a 4xx that names the limit and its flag."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mt.data.tokenizer import HeldToken
from mt.decode.options import DecodeOptions
from mt.decode.search import decoding_steps


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; each is a flag of `mt serve`."""

    max_sentences: int = 64
    max_chars: int = 1000  # per sentence
    max_body: int = 1 << 20  # bytes
    timeout: float = 30.0  # seconds a request may wait for its answer
    # the decoding work: hypotheses kept (the beam) x the work of the decoding steps a
    # sentence may take (its length limit or the forced prefix: step_work), summed over
    # sentences
    max_cost: int = 100_000
    # the attention weights returned: layers x heads x target x source, summed over sentences
    max_attention_cells: int = 500_000


# A decoder step of one hypothesis costs more as its cache grows: it attends over, and a beam
# reorder copies, every past position's keys and values. Timed on the tiny config's model on a
# CPU core (docs/deployment.md), a step with t positions behind it costs about 1 + t / 32 of a
# first step's work; a wider model spends more of each step in its layers and output, so this
# overstates its growth, never understates it.
CACHE_DOUBLING = 32


def step_work(steps: int) -> int:
    """The work of `steps` decoder steps of one hypothesis, in first steps: the sum over
    t = 1..steps of 1 + t / CACHE_DOUBLING, rounded down."""
    return steps + steps * (steps + 1) // (2 * CACHE_DOUBLING)


class BadRequest(Exception):
    """A request the server refuses: its status, one line, and the field at fault."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def check_sizes(sentences: list[str], prefix: str | None, limits: Limits) -> None:
    """Counts and lengths within the limits; text a tokenizer can read (JSON can carry a lone
    surrogate, "\\ud800", which is no character and which no encoder takes)."""
    if not sentences:
        raise BadRequest(422, "sentences: give at least one sentence", "sentences")
    if len(sentences) > limits.max_sentences:
        raise BadRequest(
            413,
            f"sentences: {len(sentences)} in one request, at most {limits.max_sentences} "
            f"(--max-sentences); send several requests",
            "sentences",
        )
    named = [(f"sentences.{i}", s) for i, s in enumerate(sentences)]
    for field, text in [*named, *([("prefix", prefix)] if prefix is not None else [])]:
        if len(text) > limits.max_chars:
            raise BadRequest(
                413,
                f"{field}: {len(text)} characters, at most {limits.max_chars} (--max-chars)",
                field,
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise BadRequest(
                400,
                f"{field}: character {e.start} is a lone surrogate ({text[e.start]!a}), not "
                f"text; send the sentence as valid Unicode",
                field,
            ) from None


def admitted(
    translator: Any, info: dict[str, Any], req: Any, opts: DecodeOptions, limits: Limits
) -> list[int]:
    """The request's sentences' source lengths, once its price is within the limits (admit);
    a sentence that holds a target-language token as text is a 422 naming it."""
    try:
        lengths = translator.source_lengths(req.sentences)
    except HeldToken as e:
        field = f"sentences.{e.index}"
        raise BadRequest(
            422,
            f"{field}: holds {e.token!r}, a target-language token of this model, as text: "
            f"remove it (tgt_lang chooses the target language)",
            field,
        ) from None
    forced = len(translator.prefix_ids(opts.prefix))
    admit(
        lengths,
        opts,
        req.attention,
        translator.max_source_len,
        attention_shape(info),
        limits,
        info["architecture"] == "nat",
        forced,
    )
    return lengths


def admit(
    lengths: list[int],
    opts: DecodeOptions,
    attention: bool,
    max_source_len: int,
    attention_shape: tuple[int, int],
    limits: Limits,
    non_autoregressive: bool = False,
    forced: int = 0,
) -> None:
    """Refuse a request the model would cut (a sentence longer than it reads) or whose cost
    is over the limits, priced by the most the search may do: the work (step_work) of each
    sentence's decoding steps (its length limit, or the forced prefix when that is longer) x
    the hypotheses kept. (A search may run to its limit: a forced prefix always does.)
    lengths: each sentence's source subwords; attention_shape: the decoder's (layers, heads)
    of cross-attention; forced: the prefix's target subwords."""
    _check_lengths(lengths, max_source_len)
    width = opts.nat_length_beam if non_autoregressive else _hypotheses(opts)
    steps = [decoding_steps(n, opts, forced, max_source_len) for n in lengths if n]
    cost = width * sum(map(step_work, steps))
    if cost > limits.max_cost:
        raise BadRequest(
            413,
            f"request cost {cost:,} (the beam, {width}, x the work of the {sum(steps):,} "
            f"decoding steps its sentences may take{', the prefix included' if forced else ''}, "
            f"each dearer as the output grows): at most {limits.max_cost:,} (--max-cost); send "
            f"fewer or shorter sentences, a shorter prefix, or a smaller beam",
            "sentences",
        )
    if attention:
        layers, heads = attention_shape
        cells = sum(
            layers * heads * (n + 1) * (decoding_steps(n, opts, forced, max_source_len) + 1)
            for n in lengths
            if n
        )
        if cells > limits.max_attention_cells:
            raise BadRequest(
                413,
                f"attention: up to {cells:,} weights to return, at most "
                f"{limits.max_attention_cells:,} (--max-attention-cells); ask for the "
                f"attention of fewer or shorter sentences",
                "attention",
            )


def _check_lengths(lengths: list[int], max_source_len: int) -> None:
    """No sentence longer than the model reads (the server never cuts one in silence)."""
    for i, n in enumerate(lengths):
        if n > max_source_len:
            raise BadRequest(
                413,
                f"sentences.{i}: {n} subwords, the model reads at most {max_source_len}; split "
                f"it into shorter sentences",
                f"sentences.{i}",
            )


def _hypotheses(opts: DecodeOptions) -> int:
    """Hypotheses decoded side by side for each sentence."""
    if opts.sampling is not None:
        return 1
    return max(opts.beam, 1)


def attention_shape(info: dict[str, Any]) -> tuple[int, int]:
    """(layers, heads) of the weights the attention answer holds, as /info measured them."""
    shape = info["attention"].get("shape") or (1, 1)
    return int(shape[0]), int(shape[1])
