"""Several models decoding as one: at every step the next token's log-probabilities are the
mean of the models' (a product of experts, renormalised by search's log-softmax). The
ensemble speaks the Seq2Seq interface search uses, so greedy, beam and sampling work on it
unchanged: each model's memory and decoder states ride side by side along the last dimension,
and its cache layers follow each other in one list."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import torch
from torch import nn

from mt.artifacts import checkpoint
from mt.errors import MTError
from mt.model.base import Seq2Seq


class _Decoding(Protocol):
    """What the ensemble takes from the first model's Translator."""

    model: Seq2Seq
    device: torch.device


T = TypeVar("T", bound=_Decoding)


def ensemble_of(
    paths: Sequence[str | Path], first_of: Callable[[checkpoint.Trained], T]
) -> tuple[Ensemble, T]:
    """(the ensemble of the runs or checkpoints at `paths`, the Translator of the first, which
    first_of makes: its tokenizer, decoding settings, device and precision are the
    ensemble's). One BPE model is required of them all, checked before any is built."""
    resolved = [checkpoint.resolve(p) for p in paths]
    ckpts = [checkpoint.load(p) for p in resolved]
    for path, ckpt in zip(resolved[1:], ckpts[1:], strict=True):
        if not checkpoint.same_tokenizer(ckpt, ckpts[0]):
            raise MTError(
                f"{path} uses another BPE model than {resolved[0]}: the models of an ensemble "
                f"must share one tokenizer (trained on the same data with the same tokenizer "
                f"config)"
            )
    runs = [checkpoint.trained_from(c, p) for c, p in zip(ckpts, resolved, strict=True)]
    if any(run.config.model.arch == "nat" for run in runs):
        raise MTError("an ensemble decodes autoregressively: model.arch nat runs cannot join one")
    first = first_of(runs[0])
    models = [first.model] + [run.model.to(first.device).eval() for run in runs[1:]]
    return Ensemble(models).eval(), first


class Ensemble(Seq2Seq):
    def __init__(self, models: list[Seq2Seq]):
        super().__init__()
        self.models = nn.ModuleList(models)
        self.members = list(models)  # the same modules, typed
        self.max_positions = min(m.max_positions for m in models)
        self.cross_cache_per_sentence = all(m.cross_cache_per_sentence for m in models)
        self._layers = [m.cache_layers for m in models]

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        """Each model's memory (B, S, D_i), or its source ids (B, S) for a decoder-only model,
        side by side as floats: (B, S, sum of widths)."""
        parts = [m.encode(src, src_pad_mask) for m in self.members]
        self._kinds = [(p.dtype, p.dim()) for p in parts]
        return torch.cat([(p if p.dim() == 3 else p[..., None]).float() for p in parts], -1)

    def _memories(self, memory: torch.Tensor) -> list[torch.Tensor]:
        widths = [
            1 if dim == 2 else m.d_model
            for m, (_, dim) in zip(self.members, self._kinds, strict=True)
        ]
        out = []
        for part, (dtype, dim) in zip(memory.split(widths, -1), self._kinds, strict=True):
            out.append(part[..., 0].to(dtype) if dim == 2 else part.to(dtype))
        return out

    @property
    def cache_layers(self) -> int:
        return sum(self._layers)

    @property
    def static_cache(self) -> bool:
        return all(m.static_cache for m in self.members)

    def decode(self, tgt_in, memory, src_pad_mask, cache=None, start=0, weights=None):
        """Each model's states (B, T, D_i) side by side; `project` takes them apart again."""
        states, offset = [], 0
        for m, mem, n in zip(self.members, self._memories(memory), self._layers, strict=True):
            part = None if cache is None else cache[offset : offset + n]
            states.append(m.decode(tgt_in, mem, src_pad_mask, cache=part, start=start))
            offset += n
        return torch.cat(states, -1)

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """The mean of the models' log-probabilities (..., V)."""
        parts = h.split([m.d_model for m in self.members], -1)
        return torch.stack(
            [
                torch.log_softmax(m.project(p).float(), -1)
                for m, p in zip(self.members, parts, strict=True)
            ]
        ).mean(0)
