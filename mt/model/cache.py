"""The decoding cache every architecture shares: a list (one entry per layer) of
{"self": {name: tensor}, "cross": {name: tensor}}, batch first, so search can reorder beams
and drop finished sentences without knowing the model."""

from __future__ import annotations

import torch


def reorder_cache(
    cache: list[dict], index: torch.Tensor, cross: bool | torch.Tensor = True
) -> None:
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
            elif STEP in part:
                _reorder_static(part, idx)
            else:
                for key in part:
                    part[key] = part[key].index_select(0, idx)


# -- the static self-attention cache ------------------------------------------------------------
#
# For a compiled or CUDA-graphed decoder step, every step must see tensors of the same shapes at
# the same addresses: the keys and values of each layer live in buffers (N, H, max_len, Dh)
# allocated once, this step's are written in place at the step's position (a tensor, so the
# position is data, not a constant of the graph), and attention reads the whole buffer with a
# mask of the positions written so far. Beam reordering copies rows in place.

STEP = "step"  # a static part's entry: the position written next, a (1,) long tensor


class BufferPool:
    """Static buffers kept from one search to the next, by layer, name, shape and dtype: a
    CUDA graph recorded for a batch shape replays only on the buffers it was recorded with, so
    the next batch of that shape writes into the same ones."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def get(self, layer: int, name: str, like: torch.Tensor, shape: tuple) -> torch.Tensor:
        key = (layer, name, tuple(shape), like.dtype, like.device)
        if key not in self._buffers:
            buf = like.new_zeros(shape)
            if hasattr(torch, "_dynamo"):  # a compiled step may then write into it in place
                torch._dynamo.mark_static_address(buf)
            self._buffers[key] = buf
        return self._buffers[key]


def make_static(
    cache: list[dict], max_len: int, step: torch.Tensor, pool: BufferPool | None = None
) -> None:
    """Turn a model's new cache into static self-attention caches of `max_len` positions, all
    reading the position from `step` ((1,) long, the search advances it in place); the
    buffers are taken from `pool` (a new one: this search's alone) at the first write, when
    their shape is known."""
    pool = pool or BufferPool()
    for i, layer in enumerate(cache):
        layer["self"] = {STEP: step, "max_len": max_len, "pool": pool, "layer": i}


def is_static(part: dict | None) -> bool:
    return part is not None and STEP in part


def static_key_mask(part: dict) -> torch.Tensor:
    """(1, 1, 1, max_len) bool: True for the positions written so far, this step's included."""
    buf = part["k"]
    return (torch.arange(buf.shape[2], device=buf.device) <= part[STEP])[None, None, None, :]


def _write_static(part: dict, k: torch.Tensor, v: torch.Tensor):
    if "k" not in part:
        n, h, _, d = k.shape
        shape = (n, h, part["max_len"], d)
        part["k"] = part["pool"].get(part["layer"], "k", k, shape)
        part["v"] = part["pool"].get(part["layer"], "v", v, shape)
    part["k"].index_copy_(2, part[STEP], k)
    part["v"].index_copy_(2, part[STEP], v)
    return part["k"], part["v"]


def _reorder_static(part: dict, idx: torch.Tensor) -> None:
    for key in ("k", "v"):
        if key not in part:
            continue
        rows = part[key].index_select(0, idx)
        if rows.shape != part[key].shape:  # sentences left the batch: that shape's buffer
            part[key] = part["pool"].get(part["layer"], key, rows, rows.shape)
        part[key].copy_(rows)


def extend_self_cache(cache: dict, k: torch.Tensor, v: torch.Tensor):
    """A self-attention layer's keys and values (B, H, t + T, Dh): the cached rows (in the
    order search kept them) followed by this step's k, v (B, H, T, Dh), which the cache then
    holds. A static cache (make_static) writes them in place and returns its whole buffers."""
    if STEP in cache:
        return _write_static(cache, k, v)
    if "k" in cache:
        k = _append(cache["k"], k, cache["order"])
        v = _append(cache["v"], v, cache["order"])
    cache["k"], cache["v"], cache["order"] = k, v, None
    return k, v


def _append(old: torch.Tensor, new: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """Rows `order` of the cached keys (all rows when None), then this step's, along time.
    Beam search reorders the cache lazily (see `reorder_cache`): selecting the rows straight
    into the grown tensor copies the cache once per step instead of twice."""
    if order is None:
        return torch.cat([old, new], dim=2)
    if torch.is_grad_enabled() and (old.requires_grad or new.requires_grad):  # out= has no autograd
        return torch.cat([old.index_select(0, order), new], dim=2)
    t = old.shape[2]
    out = new.new_empty(new.shape[0], new.shape[1], t + new.shape[2], new.shape[3])
    torch.index_select(old, 0, order, out=out[:, :, :t])
    out[:, :, t:] = new
    return out


def memory_keys_values(cache: dict | None, compute):
    """A cross-attention layer's keys and values of the memory: compute() -> (k, v) once per
    sentence, kept in the cache and reused at every later step."""
    if cache is not None and "k" in cache:
        return cache["k"], cache["v"]
    k, v = compute()
    if cache is not None:
        cache["k"], cache["v"] = k, v
    return k, v


def group_queries(q: torch.Tensor, rows: int) -> torch.Tensor:
    """Beam search may keep one row of memory keys/values per sentence for its `groups`
    hypotheses (rows sentence-major, `cross_cache_per_sentence`): the hypotheses' queries
    (B, H, T, Dh) then go together as (rows, H, groups * T, Dh), the queries of their
    sentence, with no copies of the memory. rows == B: q as it is."""
    b, h, t, d = q.shape
    if b == rows:
        return q
    return q.transpose(1, 2).reshape(rows, (b // rows) * t, h, d).transpose(1, 2)


def ungroup_weights(weights: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """Attention weights of grouped queries (rows, H, groups * T, S) back to (B, H, T, S)."""
    if weights.shape[0] == b:
        return weights
    h = weights.shape[1]
    weights = weights.view(-1, h, b // weights.shape[0], t, weights.shape[-1])
    return weights.transpose(1, 2).reshape(b, h, t, -1)
