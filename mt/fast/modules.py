"""The fast CPU training versions of the reference modules. Each subclasses its reference
module and overrides `forward` (or one small step of it) only: same parameters, same
state_dict, and where the fast path does not apply (GPU, autocast, no gradients, a decoding
cache, attention weights wanted) it hands over to the reference."""

from __future__ import annotations

import torch
from torch import nn

from mt.fast.dropout import HashDropout, dropout
from mt.fast.nodes import add_norm, attention_out, cpu_fused, feed_forward
from mt.model.attention import MultiHeadAttention, as_bool, with_bias
from mt.model.layers import FeedForward, Residual
from mt.model.transformer import Transformer
from mt.tokens import PAD

# Gathering the real positions and scattering them back costs two passes over the stream,
# forward and backward: below this much padding it does not pay (docs/performance.md).
_MIN_PADDING_TO_SKIP = 0.05


def real_rows(pad_mask: torch.Tensor) -> torch.Tensor | None:
    """Flat indices of the real (not padding) positions of a (B, T) padding mask, or None
    where skipping the padding would not pay: on GPU (the count needs a host sync) or with
    less than 5% padding."""
    if pad_mask.is_cuda:
        return None
    flat = pad_mask.reshape(-1)
    if int(flat.sum()) < _MIN_PADDING_TO_SKIP * flat.numel():
        return None
    return (~flat).nonzero().squeeze(1)


def position_wise(x: torch.Tensor, rows: torch.Tensor | None, sublayer) -> torch.Tensor:
    """sublayer(x) for a sublayer that treats each position alone (the feed-forward and its
    residual), computed on the real positions `rows` only; padding positions keep x. Nothing
    reads a padding position's state (attention masks it as a key, the loss skips it), so
    only real positions need the work. rows None: every position."""
    if rows is None:
        return sublayer(x)
    flat = x.reshape(-1, x.shape[-1])
    return flat.index_copy(0, rows, sublayer(flat.index_select(0, rows))).view_as(x)


class FastFeedForward(FeedForward):
    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu"):
        if activation != "relu":  # (the fused node is ReLU's; model_parts keeps the reference)
            raise ValueError(f"mt/fast's feed-forward layer is ReLU's, not {activation}'s")
        super().__init__(d_model, d_ff, dropout)
        self.net[2] = HashDropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, drop, second = self.net[0], self.net[2], self.net[3]
        assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)
        assert isinstance(drop, nn.Dropout)
        if cpu_fused(x, first.weight, self.training):
            return feed_forward(x, first.weight, first.bias, second.weight, second.bias, drop.p)
        return super().forward(x)


class FastResidual(Residual):
    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__(d_model, dropout, pre_norm)
        self.dropout = HashDropout(dropout)

    def forward(self, x: torch.Tensor, f) -> torch.Tensor:
        if not self.pre_norm and cpu_fused(x, self.norm.weight, self.training):
            return add_norm(
                x, f(x), self.norm.weight, self.norm.bias, self.dropout.p, self.norm.eps
            )
        return super().forward(x, f)


class FastMultiHeadAttention(MultiHeadAttention):
    def forward(self, x, memory=None, mask=None, cache=None, positions=None, need_weights=False):
        plain = cache is not None or need_weights
        if plain or not cpu_fused(x, self.out.weight, self.training):
            if not plain and self.training and self.dropout > 0.0 and not x.is_cuda:
                # SDPA's CPU dropout takes its math path and draws the mask with bernoulli_
                # (slow): the explicit path, with the hash dropout of weights_dropout
                return super().forward(x, memory, mask, cache, positions, True)[0]
            return super().forward(x, memory, mask, cache, positions, need_weights)
        # one node from the input projections to the output projection (mt.fast.nodes), which
        # reads the projections in the layouts their matmuls give: (B, T, 3D) for
        # self-attention, (B, T, D) and the memory's (B, S, 2D) for cross-attention
        proj, kv_proj, q, k = self._fused_projections(x, memory)
        if self.rel is not None:
            mask = with_bias(self.rel(q, *positions), mask)
        return attention_out(
            proj,
            kv_proj,
            self.n_heads,
            as_bool(mask, q.shape[-2], k.shape[-2], q.device),
            self.out.weight,
            self.out.bias,
            self.dropout if self.training else 0.0,
        )

    def weights_dropout(self, weights: torch.Tensor, p: float) -> torch.Tensor:
        return dropout(weights, p, True)

    def _fused_projections(self, x, memory):
        """(proj, kv_proj, q heads, k heads) of a training pass (no cache, no grouping)."""
        if self.self_attention:
            proj = self.qkv(x)
            q, k, _ = self._heads_split(proj, 3)
            return proj, None, q, k
        proj, kv_proj = self.q(x), self.kv(memory)
        (q,), (k, _) = self._heads_split(proj, 1), self._heads_split(kv_proj, 2)
        return proj, kv_proj, q, k


class FastTransformer(Transformer):
    """Teacher-forced encoding and decoding run the feed-forward sublayers on the real rows
    alone (see position_wise)."""

    def encode(self, src, src_pad_mask):
        rows = real_rows(src_pad_mask)
        x, mask, relative = self.encoder_inputs(src, src_pad_mask)
        for layer in self.encoder:
            x = position_wise(layer.mix(x, mask, positions=relative), rows, layer.feed_forward)
        return self.enc_norm(x)

    def decode(self, tgt_in, memory, src_pad_mask, cache=None, start=0, weights=None):
        # teacher forcing: target padding (right of each sentence) needs no feed-forward
        rows = real_rows(tgt_in == PAD) if cache is None else None
        x, self_mask, cross_mask, relative = self.decoder_inputs(tgt_in, src_pad_mask, cache, start)
        for i, layer in enumerate(self.decoder):
            part = None if cache is None else cache[i]
            x = layer.mix(x, memory, cross_mask, self_mask, part, relative, weights)
            x = position_wise(x, rows, layer.feed_forward)
        return self.dec_norm(x)
