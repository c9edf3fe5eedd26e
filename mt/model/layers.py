"""Encoder and decoder blocks: sublayers wrapped in residual connections and LayerNorm,
post-LN as in Vaswani et al. (2017) or pre-LN as in Xiong et al. (2020)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from mt.model.attention import CAUSAL, Mask, MultiHeadAttention

# the feed-forward layer's nonlinearity (`model.activation`): ReLU as in the paper; swish
# (SiLU, Ramachandran et al. 2017), which Marian's OPUS-MT models use; GELU (Hendrycks & Gimpel
# 2016, the exact erf form), transformers' default for Marian
ACTIVATIONS = {"relu": nn.ReLU, "swish": nn.SiLU, "gelu": nn.GELU}


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied to each position alone (sec. 3.3), with
    dropout on the hidden activation (tensor2tensor's relu_dropout, fairseq's
    activation_dropout; `model.act_dropout`). activation: another nonlinearity in max's place
    (ACTIVATIONS)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu"):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff),
            ACTIVATIONS[activation](),
            nn.Dropout(dropout),
            nn.Linear(d_ff, d_model),
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
    where they apply. transformer: the encoder-decoder's own class (None: Transformer);
    layout: what the loss makes of a packed batch for these attention modules (a function of
    its Packing; None: its dense masks). The model itself never reads it."""

    attention: type = MultiHeadAttention
    feed_forward: type = FeedForward
    residual: type = Residual
    dropout: type = nn.Dropout
    transformer: type | None = None
    layout: Callable | None = None


REFERENCE = Parts()


@dataclass(frozen=True)
class LayerShape:
    """What every block of a Transformer shares: its sizes, its dropouts (act_dropout: the
    feed-forward's hidden activation, None: `dropout`), whether LayerNorm comes before each
    sublayer (pre-LN), how far relative attention looks (0: none, the positions are absolute)
    and the feed-forward's nonlinearity (ACTIVATIONS)."""

    d_model: int
    n_heads: int
    d_ff: int
    dropout: float
    attn_dropout: float = 0.0
    act_dropout: float | None = None
    pre_norm: bool = False
    relative: int = 0
    activation: str = "relu"

    def feed_forward(self, parts: Parts) -> nn.Module:
        hidden = self.dropout if self.act_dropout is None else self.act_dropout
        return parts.feed_forward(self.d_model, self.d_ff, hidden, self.activation)

    def attention(self, parts: Parts, self_attention: bool) -> nn.Module:
        relative = self.relative if self_attention else 0
        return parts.attention(
            self.d_model, self.n_heads, self.attn_dropout, self_attention, relative=relative
        )

    def residual(self, parts: Parts) -> nn.Module:
        return parts.residual(self.d_model, self.dropout, self.pre_norm)


def relative_positions(positional: str, shape: LayerShape) -> bool:
    """Whether a model of `positional` positions attends by relative positions, checked
    against its layers' shape (a relative distance exactly when the positions are relative)."""
    relative = positional == "relative"
    if relative != (shape.relative > 0):
        raise ValueError(
            f"positional {positional!r} with relative attention distance {shape.relative}: "
            "a distance goes with relative positions alone"
        )
    return relative


class EncoderLayer(nn.Module):
    """Self-attention + FFN. Also the block of the decoder-only model, which passes a causal
    mask and a cache."""

    def __init__(self, shape: LayerShape, parts: Parts = REFERENCE):
        super().__init__()
        self.self_attn = shape.attention(parts, self_attention=True)
        self.ffn = shape.feed_forward(parts)
        self.res1, self.res2 = shape.residual(parts), shape.residual(parts)

    def forward(self, x, mask: Mask, cache=None, positions=None, weights: list | None = None):
        return self.feed_forward(self.mix(x, mask, cache, positions, weights))

    def mix(self, x, mask: Mask, cache=None, positions=None, weights: list | None = None):
        """The self-attention sublayer; its weights (B, H, T, T) go into `weights` if a list."""
        return self.res1(
            x, lambda h: _attend(self.self_attn, h, None, mask, cache, positions, weights)
        )

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The position-wise sublayer (each position alone)."""
        return self.res2(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, shape: LayerShape, parts: Parts = REFERENCE):
        super().__init__()
        self.self_attn = shape.attention(parts, self_attention=True)
        self.cross_attn = shape.attention(parts, self_attention=False)
        self.ffn = shape.feed_forward(parts)
        self.res1, self.res2, self.res3 = (shape.residual(parts) for _ in range(3))

    def forward(
        self,
        x,
        memory,
        memory_mask,
        self_mask: Mask = CAUSAL,
        cache=None,
        positions=None,
        weights: list | None = None,
    ):
        return self.feed_forward(
            self.mix(x, memory, memory_mask, self_mask, cache, positions, weights)
        )

    def mix(
        self,
        x,
        memory,
        memory_mask,
        self_mask: Mask = CAUSAL,
        cache=None,
        positions=None,
        weights: list | None = None,
    ):
        """Self-attention over the target, then cross-attention over the memory. x: (B, T, D);
        memory: (B, S, D); memory_mask: (B, 1, 1, S) True = may attend; self_mask: CAUSAL in
        training, None for a cached step (its one query may see every cached key), the
        non-autoregressive decoder's padding mask, or a packed block's. cache: the search's
        LayerCache. If `weights` is a list, the cross-attention weights (B, H, T, S) go in."""
        self_part = None if cache is None else cache.self
        cross_part = None if cache is None else cache.cross
        x = self.res1(x, lambda h: self.self_attn(h, None, self_mask, self_part, positions))
        return self.res2(
            x, lambda h: _attend(self.cross_attn, h, memory, memory_mask, cross_part, None, weights)
        )

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res3(x, self.ffn)


def _attend(attention, h, memory, mask: Mask, cache, positions, weights: list | None):
    """attention(h, ...), its weights appended to `weights` when that is a list."""
    if weights is None:
        return attention(h, memory, mask, cache, positions)
    out, w = attention(h, memory, mask, cache, positions, need_weights=True)
    weights.append(w)
    return out
