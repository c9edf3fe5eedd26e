"""The decoding cache every architecture shares: a list (one entry per layer) of
{"self": {name: tensor}, "cross": {name: tensor}}, batch first, so search can reorder beams
and drop finished sentences without knowing the model."""
from __future__ import annotations

import torch


def reorder_cache(cache: list[dict], index: torch.Tensor, cross: bool = True) -> None:
    """Select rows `index` of every cached tensor (beam reordering / dropping finished
    sentences). "cross" entries depend only on the sentence, so a pure beam reorder inside
    the same sentences can skip them (cross=False)."""
    for layer in cache:
        for kind in ("self", "cross") if cross else ("self",):
            part = layer.get(kind)
            if part:
                for key in part:
                    part[key] = part[key].index_select(0, index)
