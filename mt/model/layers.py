"""Encoder and decoder blocks: sublayers wrapped in residual connections and LayerNorm,
post-LN as in Vaswani et al. (2017) or pre-LN as in Xiong et al. (2020)."""
from __future__ import annotations

import torch
from torch import nn

from mt.model.attention import MultiHeadAttention
from mt.model.dropout import Dropout
from mt.model.fused import add_norm, cpu_fused, feed_forward


# Packing the real positions costs a gather and a scatter of the stream, forward and backward
# (about 4% of the feed-forward sublayer's time): below this much padding it does not pay.
_MIN_PADDING_TO_PACK = 0.05


def real_rows(pad_mask: torch.Tensor) -> torch.Tensor | None:
    """Flat indices of the real (not padding) positions of a (B, T) padding mask, for
    `position_wise`, or None where packing would not pay: on GPU (the count needs a host sync)
    or with less than 5% padding."""
    if pad_mask.is_cuda:
        return None
    flat = pad_mask.reshape(-1)
    padded = int(flat.sum())
    if padded < _MIN_PADDING_TO_PACK * flat.numel():
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


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), Dropout(dropout),
                                 nn.Linear(d_ff, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, drop, second = self.net[0], self.net[2], self.net[3]
        if cpu_fused(x, first.weight, self.training):
            return feed_forward(x, first.weight, first.bias, second.weight, second.bias, drop.p)
        return self.net(x)


class Residual(nn.Module):
    """x + dropout(f(x)) with LayerNorm after (post) or before f (pre)."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: torch.Tensor, f) -> torch.Tensor:
        if self.pre_norm:
            return x + self.dropout(f(self.norm(x)))
        if cpu_fused(x, self.norm.weight, self.training):
            return add_norm(x, f(x), self.norm.weight, self.norm.bias, self.dropout.p,
                            self.norm.eps)
        return self.norm(x + self.dropout(f(x)))


class EncoderLayer(nn.Module):
    """Self-attention + FFN. Also the block of the decoder-only model, which passes a causal
    mask and a cache."""

    def __init__(self, d_model, n_heads, d_ff, dropout, attn_dropout, pre_norm, relative=0):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attn_dropout, self_attention=True,
                                            relative=relative)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.res1 = Residual(d_model, dropout, pre_norm)
        self.res2 = Residual(d_model, dropout, pre_norm)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor, cache: dict | None = None,
                q_pos=None, k_pos=None, weights: list | None = None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """rows: the real positions for the feed-forward (see real_rows), None = all."""
        def attend(h):
            if weights is None:
                return self.self_attn(h, attn_mask=attn_mask, cache=cache, q_pos=q_pos, k_pos=k_pos)
            out, w = self.self_attn(h, attn_mask=attn_mask, cache=cache, q_pos=q_pos,
                                    k_pos=k_pos, need_weights=True)
            weights.append(w)
            return out

        x = self.res1(x, attend)
        return position_wise(x, rows, lambda h: self.res2(h, self.ffn))


class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout, attn_dropout, pre_norm, relative=0):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attn_dropout, self_attention=True,
                                            relative=relative)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attn_dropout, self_attention=False)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.res1 = Residual(d_model, dropout, pre_norm)
        self.res2 = Residual(d_model, dropout, pre_norm)
        self.res3 = Residual(d_model, dropout, pre_norm)

    def forward(self, x, memory, memory_mask, cache: dict | None = None, weights: list | None = None,
                q_pos=None, k_pos=None, rows: torch.Tensor | None = None):
        """x: (B, T, D); memory: (B, S, D); memory_mask: (B, 1, 1, S) True = may attend.
        With a cache, x holds only the newest position and the past comes from the cache.
        If `weights` is a list, this layer's cross-attention weights (B, H, T, S) go into it.
        rows: the real positions for the feed-forward (see real_rows), None = all.
        """
        self_cache = cache.setdefault("self", {}) if cache is not None else None
        cross_cache = cache.setdefault("cross", {}) if cache is not None else None
        # Training sees the whole target at once and needs the causal mask; a cached step
        # holds one query that may see every cached key.
        causal = cache is None
        x = self.res1(x, lambda h: self.self_attn(h, is_causal=causal, cache=self_cache,
                                                  q_pos=q_pos, k_pos=k_pos))

        def cross(h):
            if weights is None:
                return self.cross_attn(h, memory, attn_mask=memory_mask, cache=cross_cache)
            out, w = self.cross_attn(h, memory, attn_mask=memory_mask, cache=cross_cache,
                                     need_weights=True)
            weights.append(w)
            return out

        x = self.res2(x, cross)
        return position_wise(x, rows, lambda h: self.res3(h, self.ffn))
