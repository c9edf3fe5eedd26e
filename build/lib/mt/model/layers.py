"""Encoder and decoder blocks: sublayers wrapped in residual connections and LayerNorm,
post-LN as in Vaswani et al. (2017) or pre-LN as in Xiong et al. (2020)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mt.model.attention import MultiHeadAttention


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied to each position alone (sec. 3.3), with
    dropout on the hidden activation (tensor2tensor's relu_dropout, fairseq's
    activation_dropout; `model.act_dropout`)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.ReLU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Residual(nn.Module):
    """x + dropout(f(x)) with LayerNorm after (post) or before f (pre)."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: torch.Tensor, f) -> torch.Tensor:
        if self.pre_norm:
            return x + self.dropout(f(self.norm(x)))
        return self.norm(x + self.dropout(f(x)))  # LayerNorm(x + Sublayer(x))


@dataclass(frozen=True)
class Parts:
    """The module classes a model is built from: the reference ones (REFERENCE), or mt/fast's
    subclasses of them (same parameters, same state_dict), which the training factory picks
    where they apply. transformer: the encoder-decoder's own class (None: Transformer)."""

    attention: type = MultiHeadAttention
    feed_forward: type = FeedForward
    residual: type = Residual
    dropout: type = nn.Dropout
    transformer: type | None = None


REFERENCE = Parts()


class EncoderLayer(nn.Module):
    """Self-attention + FFN. Also the block of the decoder-only model, which passes a causal
    mask and a cache."""

    def __init__(
        self,
        d_model,
        n_heads,
        d_ff,
        dropout,
        attn_dropout,
        pre_norm,
        relative=0,
        act_dropout=None,
        parts: Parts = REFERENCE,
    ):
        super().__init__()
        self.self_attn = parts.attention(
            d_model, n_heads, attn_dropout, self_attention=True, relative=relative
        )
        self.ffn = parts.feed_forward(
            d_model, d_ff, dropout if act_dropout is None else act_dropout
        )
        self.res1 = parts.residual(d_model, dropout, pre_norm)
        self.res2 = parts.residual(d_model, dropout, pre_norm)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor,
        cache: dict | None = None,
        q_pos=None,
        k_pos=None,
        weights: list | None = None,
    ) -> torch.Tensor:
        def attend(h):
            if weights is None:
                return self.self_attn(h, attn_mask=attn_mask, cache=cache, q_pos=q_pos, k_pos=k_pos)
            out, w = self.self_attn(
                h, attn_mask=attn_mask, cache=cache, q_pos=q_pos, k_pos=k_pos, need_weights=True
            )
            weights.append(w)
            return out

        x = self.res1(x, attend)
        return self.res2(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        d_model,
        n_heads,
        d_ff,
        dropout,
        attn_dropout,
        pre_norm,
        relative=0,
        act_dropout=None,
        parts: Parts = REFERENCE,
    ):
        super().__init__()
        self.self_attn = parts.attention(
            d_model, n_heads, attn_dropout, self_attention=True, relative=relative
        )
        self.cross_attn = parts.attention(d_model, n_heads, attn_dropout, self_attention=False)
        self.ffn = parts.feed_forward(
            d_model, d_ff, dropout if act_dropout is None else act_dropout
        )
        self.res1 = parts.residual(d_model, dropout, pre_norm)
        self.res2 = parts.residual(d_model, dropout, pre_norm)
        self.res3 = parts.residual(d_model, dropout, pre_norm)

    def forward(
        self,
        x,
        memory,
        memory_mask,
        cache: dict | None = None,
        weights: list | None = None,
        q_pos=None,
        k_pos=None,
        self_mask: torch.Tensor | None = None,
    ):
        """x: (B, T, D); memory: (B, S, D); memory_mask: (B, 1, 1, S) True = may attend.
        With a cache, x holds only the newest position and the past comes from the cache.
        If `weights` is a list, this layer's cross-attention weights (B, H, T, S) go into it.
        self_mask: (B, 1, 1, T) may-attend over the target, given by the non-autoregressive
        decoder (mt/model/nat.py), which sees the whole target without the causal mask.
        """
        self_cache = cache.setdefault("self", {}) if cache is not None else None
        cross_cache = cache.setdefault("cross", {}) if cache is not None else None
        # Training sees the whole target at once and needs the causal mask; a cached step
        # holds one query that may see every cached key.
        causal = cache is None and self_mask is None
        x = self.res1(
            x,
            lambda h: self.self_attn(
                h, attn_mask=self_mask, is_causal=causal, cache=self_cache, q_pos=q_pos, k_pos=k_pos
            ),
        )

        def cross(h):
            if weights is None:
                return self.cross_attn(h, memory, attn_mask=memory_mask, cache=cross_cache)
            out, w = self.cross_attn(
                h, memory, attn_mask=memory_mask, cache=cross_cache, need_weights=True
            )
            weights.append(w)
            return out

        x = self.res2(x, cross)
        return self.res3(x, self.ffn)
