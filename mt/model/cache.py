"""The decoding cache every architecture shares: a list (one entry per layer) of
{"self": {name: tensor}, "cross": {name: tensor}}, batch first, so search can reorder beams
and drop finished sentences without knowing the model."""
from __future__ import annotations

import torch


def reorder_cache(cache: list[dict], index: torch.Tensor,
                  cross: bool | torch.Tensor = True) -> None:
    """Select rows `index` of every cached tensor (beam reordering / dropping finished
    sentences). "cross" entries depend only on the sentence: a pure beam reorder inside the
    same sentences skips them (cross=False), and where they hold one row per sentence rather
    than per hypothesis (see MultiHeadAttention) `cross` is the index of the kept sentences.

    A part holding an "order" entry is reordered lazily: `index` is composed into "order" and
    its owner selects those rows when it next reads the part (attention's self cache does this
    while appending a step, saving one copy of the cache per step)."""
    cross_index = index if cross is True else cross
    for layer in cache:
        for kind, idx in (("self", index), ("cross", cross_index)):
            part = layer.get(kind)
            if not part or idx is False:
                continue
            if "order" in part:
                part["order"] = idx if part["order"] is None else part["order"].index_select(0, idx)
            else:
                for key in part:
                    part[key] = part[key].index_select(0, idx)
