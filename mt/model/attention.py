"""Multi-head scaled dot-product attention (Vaswani et al. 2017, sec. 3.2.2):

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V),
    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

on top of `F.scaled_dot_product_attention`, with a key/value cache for incremental decoding.
(The fused CPU training node that can replace `forward` lives in mt/fast.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mt.model.cache import (
    extend_self_cache,
    group_queries,
    is_static,
    memory_keys_values,
    static_key_mask,
    ungroup_weights,
)
from mt.model.positions import RelativeKeys


class MultiHeadAttention(nn.Module):
    def __init__(
        self, d_model: int, n_heads: int, dropout: float, self_attention: bool, relative: int = 0
    ):
        """relative > 0: Shaw et al. relative position keys clipped at that distance."""
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.self_attention = self_attention
        self.dropout = dropout
        if self_attention:
            self.qkv = nn.Linear(d_model, 3 * d_model)  # W^Q, W^K, W^V side by side: one matmul
        else:
            self.q = nn.Linear(d_model, d_model)
            self.kv = nn.Linear(d_model, 2 * d_model)  # the memory's W^K and W^V
        self.out = nn.Linear(d_model, d_model)  # W^O
        self.rel = RelativeKeys(relative, self.d_head) if relative else None

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        cache: dict | None = None,
        need_weights: bool = False,
        q_pos: torch.Tensor | None = None,
        k_pos: torch.Tensor | None = None,
    ):
        """x: (B, T, D) queries. memory: (B, S, D) for cross-attention.
        attn_mask: bool, broadcastable to (B, H, T, S), True = may attend.
        cache: dict updated in place; self-attention appends this step's keys/values,
        cross-attention computes the memory's keys/values once and reuses them.
        q_pos, k_pos: positions of the queries and of all keys (cached ones included), needed
        with relative positions only. Returns (B, T, D), and the weights (B, H, T, S) when
        need_weights.
        """
        b, t, d = x.shape
        q, k, v = self.project(x, memory, cache)
        if self.self_attention and cache is not None and is_static(cache):
            attn_mask = static_key_mask(cache)  # the keys beyond this step are not written yet
        attn_mask, is_causal = self.scores_mask(q, k, b, attn_mask, is_causal, q_pos, k_pos)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            ctx, weights = self.attend_explicit(q, k, v, attn_mask, is_causal, dropout_p)
        else:
            ctx = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p
            )
        out = self.out(ctx.transpose(1, 2).reshape(b, t, d))  # concat heads, W^O: (B, T, D)
        if not need_weights:
            return out
        return out, ungroup_weights(weights, b, t)

    def project(self, x: torch.Tensor, memory: torch.Tensor | None, cache: dict | None):
        """The heads (B, H, T, Dh) of the queries Q W^Q, and of the keys K W^K and values V W^V
        (of x itself, or of the memory), with a cache's past keys and values included."""
        if self.self_attention:
            q, k, v = self._heads_split(self.qkv(x), 3)
            if cache is not None:  # the past steps' keys and values come first
                k, v = extend_self_cache(cache, k, v)
            return q, k, v
        # the memory's keys and values: once per sentence, then from the cache
        k, v = memory_keys_values(cache, lambda: self._heads_split(self.kv(memory), 2))
        q = self.q(x).view(x.shape[0], x.shape[1], self.n_heads, self.d_head).transpose(1, 2)
        return group_queries(q, k.shape[0]), k, v

    def scores_mask(self, q, k, b: int, attn_mask, is_causal: bool, q_pos, k_pos):
        """The (attn_mask, is_causal) pair for SDPA: grouped queries take one mask row per
        sentence; relative positions become an additive bias (with -inf where barred); a bool
        mask and is_causal together become one mask (SDPA takes one or the other)."""
        if b != k.shape[0] and attn_mask is not None:  # grouped queries: one mask row each
            attn_mask = attn_mask[:: b // k.shape[0]]
        if self.rel is not None:
            return _as_bias(self.rel(q, q_pos, k_pos), attn_mask, is_causal), False
        if is_causal and attn_mask is not None:
            return with_causal(attn_mask, q.shape[-2], k.shape[-2], q.device), False
        return attn_mask, is_causal

    def attend_explicit(self, q, k, v, attn_mask, is_causal, dropout_p: float = 0.0):
        """dropout(softmax(Q K^T / sqrt(d_k))) V written out, and the weights (before
        dropout): for when the weights themselves are wanted."""
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # (B, H, T, S)
        if is_causal:
            attn_mask = with_causal(attn_mask, scores.shape[-2], scores.shape[-1], q.device)
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        elif attn_mask is not None:
            scores = scores + attn_mask
        weights = scores.softmax(-1)
        return self.weights_dropout(weights, dropout_p) @ v, weights

    def weights_dropout(self, weights: torch.Tensor, p: float) -> torch.Tensor:
        return F.dropout(weights, p, True) if p > 0.0 else weights

    def _heads_split(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        b, t, _ = x.shape
        # (B, T, n*D) -> n x (B, H, T, Dh)
        return x.view(b, t, n, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)


def _as_bias(bias: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
    """One float mask for SDPA: the relative-position bias with -inf where attention is barred."""
    if is_causal:
        attn_mask = with_causal(attn_mask, bias.shape[-2], bias.shape[-1], bias.device)
    if attn_mask is not None:
        bias = bias.masked_fill(~attn_mask, float("-inf"))
    return bias


def with_causal(attn_mask: torch.Tensor | None, t: int, s: int, device) -> torch.Tensor:
    """The bool may-attend mask (True = may attend) with query i barred from the keys after i."""
    causal = torch.ones(t, s, dtype=torch.bool, device=device).tril()
    return causal if attn_mask is None else attn_mask & causal
