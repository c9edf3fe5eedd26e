"""How a translation is decoded: `DecodeOptions`, one frozen object that `mt translate`'s flags,
the server's request fields and the Python API all become, with every bound checked here."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from mt.config.decode import MAX_BEAM, MAX_LENGTH_PENALTY
from mt.decode.sampling import Sampling
from mt.errors import MTError, shorten
from mt.tokens import UNK

if TYPE_CHECKING:
    from mt.config import DecodeConfig
    from mt.data.tokenizer import Tokenizer


MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-6, 1e3
MAX_TOPK = 1 << 30
MAX_SEED = 2**63 - 1  # (what a torch.Generator takes, and JSON's integers safely hold)


class OptionError(MTError):
    """A decoding option out of its bounds: "FIELD DETAIL" (the server's 422 names the field;
    `as_flag` says it as mt translate's flag)."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field} {detail}")
        self.field, self.detail = field, detail

    def as_flag(self) -> MTError:
        return MTError(f"--{self.field.replace('_', '-')} {self.detail}")


@dataclass(frozen=True)
class DecodeOptions:
    """beam 1 is greedy search; sampling draws each token instead of searching (one output
    per line). Hashable: requests with equal options can share a batch."""

    beam: int = 5
    length_penalty: float = 1.0  # beam scores: log-probability / length ** length_penalty
    nbest: int = 1  # outputs per line, best first (at most the beam)
    max_len_a: float = 1.5  # at most a * source length + b output tokens
    max_len_b: int = 10
    min_len: int = 0  # no EOS before this many tokens (benchmarks force equal lengths)
    sampling: Sampling | None = None
    prefix: str | None = None  # every output starts with this text
    use_cache: bool = True  # False: the reference, recomputing the whole prefix every step
    nat_iterations: int = 10  # model.arch nat: Mask-Predict's passes
    nat_length_beam: int = 3  # model.arch nat: candidate lengths

    def __post_init__(self) -> None:
        _within("beam", self.beam, 1, MAX_BEAM)
        _within("nbest", self.nbest, 1, MAX_BEAM)
        _within("length_penalty", self.length_penalty, 0.0, MAX_LENGTH_PENALTY)
        _within("max_len_a", self.max_len_a, 0.0, 1e3)
        _within("max_len_b", self.max_len_b, 1, 1 << 20)
        _within("min_len", self.min_len, 0, 1 << 20)
        _within("nat_iterations", self.nat_iterations, 1, 1000)
        _within("nat_length_beam", self.nat_length_beam, 1, MAX_BEAM)
        if self.sampling is not None:
            s = self.sampling
            _within("temperature", s.temperature, MIN_TEMPERATURE, MAX_TEMPERATURE)
            _within("topk", s.topk, 0, MAX_TOPK)
            if not 0.0 < s.topp <= 1.0:
                raise OptionError("topp", f"{s.topp}: must be in (0, 1]")
            if s.seed is not None:
                _within("seed", s.seed, 0, MAX_SEED)
            if self.nbest > 1:
                raise OptionError("nbest", f"{self.nbest}: sampling draws one translation per line")
        elif self.nbest > self.beam:
            raise OptionError(
                "nbest", f"{self.nbest} needs a beam of at least {self.nbest} (it is {self.beam})"
            )

    @classmethod
    def from_config(cls, cfg: DecodeConfig, **given: Any) -> DecodeOptions:
        """The run's decode section, with the options given (None: the config's)."""
        names = {f.name for f in fields(cls)}
        base = {k: getattr(cfg, k) for k in names if hasattr(cfg, k)}
        return cls(**base).with_(**given)

    def with_(self, **given: Any) -> DecodeOptions:
        """These options with those given replaced (None leaves one as it is)."""
        return replace(self, **{k: v for k, v in given.items() if v is not None})

    @property
    def greedy(self) -> bool:
        """One token per step: beam 1, or sampling."""
        return self.sampling is not None or self.beam == 1

    def describe(self) -> str:
        """How the search goes, in words (mt translate says it before it starts)."""
        if (s := self.sampling) is not None:
            how = (
                f"sampling (temperature {s.temperature}, top-k {s.topk or 'all'}, "
                f"top-p {s.topp}, seed {s.seed})"
            )
        elif self.beam == 1:
            how = "greedy search"
        else:
            how = f"beam {self.beam}, length penalty {self.length_penalty}"
        return (
            how
            + (f", {self.nbest}-best" if self.nbest > 1 else "")
            + (f", prefix {self.prefix!r}" if self.prefix else "")
        )


def _within(name: str, value: float, low: float, high: float) -> None:
    """value in [low, high], finite (an int where low is one)."""
    if isinstance(low, int) and not isinstance(value, int):
        raise OptionError(name, f"{value!r}: must be a whole number")
    finite = isinstance(value, int) or math.isfinite(value)  # (an int of any size is exact)
    if not (finite and low <= value <= high):
        raise OptionError(name, f"{shorten(repr(value))}: must be from {low} to {high}")


def check_prefix(prefix: str, ids: list[int], tokenizer: Tokenizer) -> None:
    """Refuse a prefix (its subword `ids`) that no output can start with: a character the
    model's BPE never saw (no piece: <unk>), or a target-language token held as text."""
    held = tokenizer.held_token(prefix, "tgt")
    if held:
        raise OptionError(
            "prefix",
            f"holds {held!r}, a target-language token of this model, not text: leave it out "
            f"(the target language is chosen by --tgt-lang, a request's tgt_lang)",
        )
    if UNK in ids:
        unseen = sorted(c for c in set(prefix) if UNK in tokenizer.encode_tgt([c])[0])
        raise OptionError(
            "prefix",
            f"{shorten(repr(prefix), 100)}: "
            f"{shorten(', '.join(map(repr, unseen)), 60) or 'a piece'} never occurred in "
            f"the model's training data (its BPE has no piece for it), so no output can "
            f"start so: leave it out, or write it as the training data does",
        )
