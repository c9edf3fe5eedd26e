"""The search's decoding cache. Per decoder layer it keeps what incremental decoding reuses:
the keys and values its self-attention has seen so far, the memory's keys and values for its
cross-attention (computed at the first step), and a recurrent model's state; all batch first,
so that the search reorders beams and drops finished sentences without knowing the model.

A model's attention sees one part through `memory(compute)` (cross-attention: the memory's
keys and values, computed once), `attend(q, k, v, mask)` -> (q, k, v, mask), what attention
then computes with (the past keys included, a beam's queries grouped where the memory is kept
once per sentence, the positions a static buffer holds so far masked), and `ungroup(weights,
B)`: attention weights as (B, H, T, S) again."""

from __future__ import annotations

from collections.abc import Callable

import torch


class SelfCache:
    """A self-attention layer's past keys and values (N, H, t, Dh). A beam reorder is kept in
    `order` and applied while the next step's keys are appended: one copy of the cache per
    step instead of two."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.order: torch.Tensor | None = None

    def attend(self, q, k, v, mask):
        if self.k is not None and self.v is not None:
            k, v = _append(self.k, k, self.order), _append(self.v, v, self.order)
        self.k, self.v, self.order = k, v, None
        return q, k, v, mask

    def reorder(self, rows: torch.Tensor) -> None:
        self.order = rows if self.order is None else self.order.index_select(0, rows)

    @staticmethod
    def ungroup(weights: torch.Tensor, b: int) -> torch.Tensor:
        return weights


def _append(old: torch.Tensor, new: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """Rows `order` of the cached keys (all rows when None), then this step's, along time,
    selected straight into the grown tensor."""
    if order is None:
        return torch.cat([old, new], dim=2)
    if torch.is_grad_enabled() and (old.requires_grad or new.requires_grad):  # out= has no autograd
        return torch.cat([old.index_select(0, order), new], dim=2)
    t = old.shape[2]
    out = new.new_empty(new.shape[0], new.shape[1], t + new.shape[2], new.shape[3])
    torch.index_select(old, 0, order, out=out[:, :, :t])
    out[:, :, t:] = new
    return out


class BufferPool:
    """Static buffers kept from one search to the next, by layer, name, shape and dtype: a
    CUDA graph recorded for a batch shape replays only on the buffers it was recorded with, so
    the next batch of that shape writes into the same ones."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def get(self, key: tuple, like: torch.Tensor, shape: tuple) -> torch.Tensor:
        key = (*key, tuple(shape), like.dtype, like.device)
        if key not in self._buffers:
            buf = like.new_zeros(shape)
            if hasattr(torch, "_dynamo"):  # a compiled step may then write into it in place
                # guard=False said, not assumed: no guard on the buffer's address (a guard would
                # recompile for each new buffer; not the default in every torch pyproject allows)
                torch._dynamo.mark_static_address(buf, guard=False)
            self._buffers[key] = buf
        return self._buffers[key]


class StaticSelfCache:
    """For a compiled or CUDA-graphed decoder step every step must see tensors of the same
    shapes at the same addresses: the keys and values live in buffers (N, H, room, Dh) taken
    from a pool at the first write, this step's are written in place at `position` (a (1,)
    tensor the search advances: data, not a constant of the graph), and attention reads the
    whole buffer with a mask of the positions written so far. A reorder copies rows in place."""

    def __init__(self, room: int, position: torch.Tensor, pool: BufferPool, layer: int):
        self.room, self.position, self.pool, self.layer = room, position, pool, layer
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def attend(self, q, k, v, mask):
        if self.k is None or self.v is None:
            n, h, _, d = k.shape
            self.k = self.pool.get((self.layer, "k"), k, (n, h, self.room, d))
            self.v = self.pool.get((self.layer, "v"), v, (n, h, self.room, d))
        self.k.index_copy_(2, self.position, k)
        self.v.index_copy_(2, self.position, v)
        written = torch.arange(self.room, device=k.device) <= self.position  # (room,)
        return q, self.k, self.v, written[None, None, None, :]

    @staticmethod
    def ungroup(weights: torch.Tensor, b: int) -> torch.Tensor:
        return weights

    def reorder(self, rows: torch.Tensor) -> None:
        for name in ("k", "v"):
            buf = getattr(self, name)
            if buf is None:
                continue
            picked = buf.index_select(0, rows)
            if picked.shape != buf.shape:  # sentences left the batch: that shape's buffer
                buf = self.pool.get((self.layer, name), picked, picked.shape)
                setattr(self, name, buf)
            buf.copy_(picked)


class CrossCache:
    """What a layer computes once from the memory (its cross-attention keys and values, or an
    RNN's summary and attention keys), one row per sentence where the search keeps it so:
    the queries of a sentence's hypotheses (consecutive rows) then attend together, as
    (sentences, H, hypotheses * T, Dh), with no copies of the memory."""

    def __init__(self) -> None:
        self.values: tuple[torch.Tensor, ...] | None = None

    def memory(self, compute: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        if self.values is None:  # tensors of their own, contiguous, as a reorder leaves them:
            # a compiled step then sees one layout (a view's base and strides are guarded)
            self.values = tuple(x.clone(memory_format=torch.contiguous_format) for x in compute())
        return self.values

    def attend(self, q, k, v, mask):
        b, h, t, d = q.shape
        rows = k.shape[0]
        if b == rows:
            return q, k, v, mask
        q = q.transpose(1, 2).reshape(rows, (b // rows) * t, h, d).transpose(1, 2)
        return q, k, v, None if mask is None else mask[:: b // rows]

    @staticmethod
    def ungroup(weights: torch.Tensor, b: int) -> torch.Tensor:
        """Attention weights of grouped queries (rows, H, groups * T, S) as (B, H, T, S)."""
        rows, h, gt, s = weights.shape
        if rows == b:
            return weights
        g = b // rows
        return weights.view(rows, h, g, gt // g, s).transpose(1, 2).reshape(b, h, gt // g, s)

    def reorder(self, rows: torch.Tensor) -> None:
        if self.values is not None:
            self.values = tuple(x.index_select(0, rows) for x in self.values)


class LayerCache:
    """One decoder layer's parts; `state`: a recurrent model's per-hypothesis tensors."""

    def __init__(self, self_part: SelfCache | StaticSelfCache) -> None:
        self.self = self_part
        self.cross = CrossCache()
        self.state: dict[str, torch.Tensor] = {}


class Static:
    """A static cache's room (positions) and position, the buffers' pool."""

    def __init__(self, room: int, device: torch.device, pool: BufferPool | None = None):
        self.room, self.pool = room, pool or BufferPool()
        self.position = torch.zeros(1, dtype=torch.long, device=device)


class DecodeCache(list):
    """The cache of a whole decoder: a list of LayerCache (what model.decode(cache=) takes;
    an ensemble hands each member its slice). per_sentence: the cross parts hold one row per
    sentence (search keeps K hypotheses per sentence in consecutive rows)."""

    def __init__(self, layers: int, per_sentence: bool = False, static: Static | None = None):
        def self_part(i: int) -> SelfCache | StaticSelfCache:
            if static is None:
                return SelfCache()
            return StaticSelfCache(static.room, static.position, static.pool, i)

        super().__init__(LayerCache(self_part(i)) for i in range(layers))
        self.per_sentence = per_sentence

    def reorder_beams(self, rows: torch.Tensor) -> None:
        """Hypothesis rows `rows` within the same sentences (cross parts unchanged)."""
        for layer in self:
            layer.self.reorder(rows)
            layer.state = {k: x.index_select(0, rows) for k, x in layer.state.items()}

    def keep(self, rows: torch.Tensor, sentences: torch.Tensor | None) -> None:
        """Hypothesis rows `rows`, of the sentences `sentences` (None: all sentences stay)."""
        self.reorder_beams(rows)
        cross = sentences if self.per_sentence else rows
        if cross is not None:
            for layer in self:
                layer.cross.reorder(cross)
