"""The decoding cache every architecture shares: a list (one entry per layer) of
{"self": {name: tensor}, "cross": {name: tensor}}, batch first, so search can reorder beams
and drop finished sentences without knowing the model."""
from __future__ import annotations

import torch


def reorder_cache(cache: list[dict], index: torch.Tensor, cross: bool = True) -> None:
    """Select rows `index` of every cached tensor (beam reordering / dropping finished
    sentences). "cross" entries depend only on the sentence, so a pure beam reorder inside
    the same sentences can skip them (cross=False).

    A part holding an "order" entry is reordered lazily: `index` is composed into "order" and
    its owner selects those rows when it next reads the part (attention's self cache does this
    while appending a step, saving one copy of the cache per step)."""
    for layer in cache:
        for kind in ("self", "cross") if cross else ("self",):
            part = layer.get(kind)
            if not part:
                continue
            if "order" in part:
                part["order"] = index if part["order"] is None else part["order"].index_select(0, index)
            else:
                for key in part:
                    part[key] = part[key].index_select(0, index)
