"""Multi-head scaled dot-product attention (Vaswani et al. 2017, sec. 3.2.2):

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V),  Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

on top of `F.scaled_dot_product_attention`, with a key/value cache for incremental decoding.
(The fused CPU training node that can replace `forward` lives in mt/fast.)"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mt.model.positions import RelativeKeys


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float, self_attention: bool,
                 relative: int = 0):
        """relative > 0: Shaw et al. relative position keys clipped at that distance."""
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.self_attention = self_attention
        self.dropout = dropout
        if self_attention:
            self.qkv = nn.Linear(d_model, 3 * d_model)  # W^Q, W^K, W^V side by side: one matmul
        else:
            self.q = nn.Linear(d_model, d_model)
            self.kv = nn.Linear(d_model, 2 * d_model)   # the memory's W^K and W^V
        self.out = nn.Linear(d_model, d_model)          # W^O
        self.rel = RelativeKeys(relative, self.d_head) if relative else None

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                cache: dict | None = None, need_weights: bool = False,
                q_pos: torch.Tensor | None = None, k_pos: torch.Tensor | None = None):
        """x: (B, T, D) queries. memory: (B, S, D) for cross-attention.
        attn_mask: bool, broadcastable to (B, H, T, S), True = may attend.
        cache: dict updated in place; self-attention appends this step's keys/values,
        cross-attention computes the memory's keys/values once and reuses them.
        q_pos, k_pos: positions of the queries and of all keys (cached ones included), needed
        with relative positions only. Returns (B, T, D), and the weights (B, H, T, S) when
        need_weights.
        """
        b, t, d = x.shape
        _, _, q, k, v = self.project(x, memory, cache)
        attn_mask, is_causal = self.scores_mask(q, k, b, attn_mask, is_causal, q_pos, k_pos)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            ctx, weights = self.attend_explicit(q, k, v, attn_mask, is_causal, dropout_p)
        else:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                 is_causal=is_causal, dropout_p=dropout_p)
        out = self.out(ctx.transpose(1, 2).reshape(b, t, d))        # concat heads, W^O: (B, T, D)
        if not need_weights:
            return out
        if weights.shape[0] != b:                              # grouped: back to (B, H, T, S)
            weights = weights.view(-1, self.n_heads, b // weights.shape[0], t, weights.shape[-1])
            weights = weights.transpose(1, 2).reshape(b, self.n_heads, t, -1)
        return out, weights

    def project(self, x: torch.Tensor, memory: torch.Tensor | None, cache: dict | None):
        """(proj, kv_proj, q, k, v): the projections as their matmuls give them, and the heads
        (B, H, T, Dh) of the queries, keys and values (cached ones included)."""
        if self.self_attention:
            return self._self_projections(x, cache)
        return self._cross_projections(x, memory, cache)

    def scores_mask(self, q, k, b: int, attn_mask, is_causal: bool, q_pos, k_pos):
        """The (attn_mask, is_causal) pair for SDPA: grouped queries take one mask row per
        sentence; relative positions become an additive bias (with -inf where barred); a bool
        mask and is_causal together become one mask (SDPA takes one or the other)."""
        if b != k.shape[0] and attn_mask is not None:     # grouped queries: one mask row each
            attn_mask = attn_mask[::b // k.shape[0]]
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
            attn_mask = with_causal(attn_mask, *scores.shape[-2:], q.device)
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        elif attn_mask is not None:
            scores = scores + attn_mask
        weights = scores.softmax(-1)
        return self.weights_dropout(weights, dropout_p) @ v, weights

    def weights_dropout(self, weights: torch.Tensor, p: float) -> torch.Tensor:
        return F.dropout(weights, p, True) if p > 0.0 else weights

    def _self_projections(self, x: torch.Tensor, cache: dict | None):
        """The fused Q, K, V projection (B, T, 3D), None (no separate key/value projection) and
        the heads; with a cache, the past steps' keys and values come first and this step's
        are appended to the cache."""
        proj = self.qkv(x)
        q, k, v = self._heads_split(proj, 3)
        if cache is not None:
            if "k" in cache:  # (B, H, t, Dh): the cached rows search kept, then this step
                k = _append(cache["k"], k, cache["order"])
                v = _append(cache["v"], v, cache["order"])
            cache["k"], cache["v"], cache["order"] = k, v, None
        return proj, None, q, k, v

    def _cross_projections(self, x: torch.Tensor, memory: torch.Tensor, cache: dict | None):
        """The query projection (B, T, D), the memory's key/value projection (B, S, 2D; None
        when the cache has them) and the heads. The memory's keys and values are computed once
        per sentence and kept in the cache."""
        kv_proj = None
        if cache is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            kv_proj = self.kv(memory)
            k, v = self._heads_split(kv_proj, 2)
            if cache is not None:
                cache["k"], cache["v"] = k, v
        # Beam search may keep one row of memory keys/values per sentence for its `groups`
        # hypotheses (rows sentence-major): the hypotheses' queries then go together as
        # groups * T queries of their sentence, with no copies of the memory.
        groups = x.shape[0] // k.shape[0]
        proj = self.q(x)
        q = proj.view(k.shape[0], groups * x.shape[1], self.n_heads, self.d_head)
        q = q.transpose(1, 2)                                      # (Bk, H, groups * T, Dh)
        return proj, kv_proj, q, k, v

    def _heads_split(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        b, t, _ = x.shape
        # (B, T, n*D) -> n x (B, H, T, Dh)
        return x.view(b, t, n, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)


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


def _as_bias(bias: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
    """One float mask for SDPA: the relative-position bias with -inf where attention is barred."""
    if is_causal:
        attn_mask = with_causal(attn_mask, *bias.shape[-2:], bias.device)
    if attn_mask is not None:
        bias = bias.masked_fill(~attn_mask, float("-inf"))
    return bias


def with_causal(attn_mask: torch.Tensor | None, t: int, s: int, device) -> torch.Tensor:
    """The bool may-attend mask (True = may attend) with query i barred from the keys after i."""
    causal = torch.ones(t, s, dtype=torch.bool, device=device).tril()
    return causal if attn_mask is None else attn_mask & causal
