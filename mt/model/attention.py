"""Multi-head scaled dot-product attention (Vaswani et al. 2017, sec. 3.2):

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                          (eq. 1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

on top of `F.scaled_dot_product_attention`. Incremental decoding hands in a cache (the search's,
mt/decode/cache.py), which adds the past keys and values. (The fused CPU training node that can
replace `forward` lives in mt/fast.)"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from mt.model.positions import RelativeKeys

CAUSAL: Literal["causal"] = "causal"  # the mask that bars each query from the later keys
Mask = torch.Tensor | Literal["causal"] | None


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
        self, x, memory=None, mask: Mask = None, cache=None, positions=None, need_weights=False
    ):
        """x: (B, T, D) queries; memory: (B, S, D), the keys and values of cross-attention.
        mask: bool, broadcastable to (B, H, T, S), True = may attend; or CAUSAL. cache: the
        search's part for this layer. positions: (query positions, key positions) for relative
        positions. Returns (B, T, D), and the weights (B, H, T, S) when need_weights."""
        b, t, d = x.shape
        q, k, v = self.project(x, memory, cache)
        if cache is not None:  # the past keys and values (and their mask) come from the cache
            q, k, v, mask = cache.attend(q, k, v, mask)
        dropout_p = self.dropout if self.training else 0.0
        if self.rel is not None:
            mask = with_bias(self.rel(q, *positions), mask)
        if need_weights:
            ctx, weights = self.attend_explicit(q, k, v, mask, dropout_p)
            weights = weights if cache is None else cache.ungroup(weights, b)
        elif isinstance(mask, str):  # CAUSAL: SDPA builds the causal mask itself
            ctx = F.scaled_dot_product_attention(q, k, v, None, dropout_p, is_causal=True)
        else:
            ctx = F.scaled_dot_product_attention(q, k, v, mask, dropout_p)
        out = self.out(ctx.transpose(1, 2).reshape(b, t, d))  # concat heads, W^O: (B, T, D)
        return (out, weights) if need_weights else out

    def project(self, x: torch.Tensor, memory: torch.Tensor | None, cache):
        """The heads (B, H, T, Dh) of the queries Q W^Q, and of the keys K W^K and values V W^V
        of x itself or of the memory (once per sentence with a cache)."""
        if self.self_attention:
            return self._heads_split(self.qkv(x), 3)
        (q,) = self._heads_split(self.q(x), 1)

        def memory_heads():
            return self._heads_split(self.kv(memory), 2)

        k, v = memory_heads() if cache is None else cache.memory(memory_heads)
        return q, k, v

    def attend_explicit(self, q, k, v, mask: Mask, dropout_p: float = 0.0):
        """dropout(softmax(Q K^T / sqrt(d_k))) V written out (eq. 1), and the weights (before
        dropout): for when the weights themselves are wanted."""
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # (B, H, T, S)
        mask = as_bool(mask, scores.shape[-2], scores.shape[-1], q.device)
        if mask is not None and mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        elif mask is not None:
            scores = scores + mask
        weights = scores.softmax(-1)
        return self.weights_dropout(weights, dropout_p) @ v, weights

    def weights_dropout(self, weights: torch.Tensor, p: float) -> torch.Tensor:
        return F.dropout(weights, p, True) if p > 0.0 else weights

    def _heads_split(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        b, t, _ = x.shape
        # (B, T, n*D) -> n x (B, H, T, Dh)
        return x.view(b, t, n, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)


def as_bool(mask: Mask, t: int, s: int, device) -> torch.Tensor | None:
    """A tensor mask as it is; CAUSAL as the bool (T, S) mask barring query i from the keys
    after i."""
    if not isinstance(mask, str):
        return mask
    return torch.ones(t, s, dtype=torch.bool, device=device).tril()


def with_bias(bias: torch.Tensor, mask: Mask) -> torch.Tensor:
    """One float mask for SDPA: the relative-position bias with -inf where attention is barred."""
    mask = as_bool(mask, bias.shape[-2], bias.shape[-1], bias.device)
    return bias if mask is None else bias.masked_fill(~mask, float("-inf"))
