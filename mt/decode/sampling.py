"""The options of drawing each next token instead of searching: `Sampling`, part of the Python
API (`from mt import Sampling`), and its check of `mt translate`'s sampling flags."""

from __future__ import annotations

from dataclasses import dataclass

from mt.errors import MTError


@dataclass(frozen=True)
class Sampling:
    """Draw each next token instead of searching (back-translation, diverse outputs)."""

    temperature: float = 1.0
    topk: int = 0  # only the k most likely tokens; 0: all
    topp: float = 1.0  # only the smallest set reaching this probability; 1: all
    seed: int | None = None  # the same seed and input give the same outputs

    @classmethod
    def from_flags(
        cls,
        sample: bool,
        temperature: float,
        topk: int,
        topp: float,
        seed: int | None,
        beam: int | None,
        nbest: int,
    ) -> Sampling | None:
        """The options of `mt translate --sample ...`, or None; sampling flags without
        --sample, or with a beam or n-best, are refused."""
        if not sample:
            if temperature != 1.0 or topk or topp != 1.0 or seed is not None:
                raise MTError("--temperature, --topk, --topp and --seed apply to --sample only")
            return None
        if beam is not None or nbest > 1:
            raise MTError("--sample draws one translation per line: leave out --beam and --nbest")
        if temperature <= 0:
            raise MTError(f"--temperature {temperature}: must be > 0")
        if not 0.0 < topp <= 1.0:
            raise MTError(f"--topp {topp}: must be in (0, 1]")
        return cls(temperature, topk, topp, seed)
