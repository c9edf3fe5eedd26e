"""The options of drawing each next token instead of searching: `Sampling`, part of the Python
API (`from mt import Sampling`), and its check of `mt translate`'s sampling flags."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

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
        return cls(temperature, topk, topp, seed)  # its bounds: mt.decode.options

    def pick(self, generator: torch.Generator | None) -> Callable[[torch.Tensor], torch.Tensor]:
        """The search's pick rule that draws the next token (see `sampler`)."""
        return sampler(self.temperature, self.topk, self.topp, generator)


def sampler(
    temperature: float = 1.0,
    topk: int = 0,
    topp: float = 1.0,
    generator: torch.Generator | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """pick(lprobs (N, V)) -> (N,) next tokens, drawn from softmax(logits / temperature),
    restricted to the `topk` most likely tokens (0: all) and to the smallest set whose
    probability reaches `topp` (nucleus sampling, Holtzman et al. 2020; 1: all)."""

    def pick(lprobs: torch.Tensor) -> torch.Tensor:
        logits = lprobs / temperature  # (N, V)
        if topk > 0:
            kth = logits.topk(min(topk, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -float("inf"))
        if topp < 1.0:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(-1)
            # drop a token when the more likely ones already reach topp (the first never)
            drop = (probs.cumsum(-1) - probs) >= topp
            drop[:, 0].fill_(False)  # (a topp below float32's least number would drop it too)
            logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, -float("inf")))
        return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)

    return pick
