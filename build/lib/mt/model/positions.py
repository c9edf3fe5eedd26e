"""Where a token is: absolute positions added to the embeddings (sinusoidal, Vaswani et al.
2017 sec. 3.5, or learned, as in BERT/GPT) or relative positions inside self-attention
(Shaw et al. 2018): a learned vector per clipped distance j - i, added to the keys."""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_table(n_positions: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)  (sec. 3.5)."""
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: d_model // 2])
    return table


class AbsolutePositions(nn.Module):
    """pos (any shape of position ids) -> vectors (..., D): a fixed sinusoidal table, a learned
    one, or zeros when positions live in the attention instead (`relative`)."""

    table: torch.Tensor  # (max_positions, D), sinusoidal only (a buffer)

    def __init__(self, kind: str, max_positions: int, d_model: int):
        super().__init__()
        self.kind, self.max_positions = kind, max_positions
        if kind == "sinusoidal":
            self.register_buffer(
                "table", sinusoidal_table(max_positions, d_model), persistent=False
            )
        elif kind == "learned":
            self.learned = nn.Embedding(max_positions, d_model)
            nn.init.normal_(self.learned.weight, std=d_model**-0.5)

    def forward(self, pos: torch.Tensor) -> torch.Tensor | float:
        if self.kind == "sinusoidal":
            return self.table[pos]
        if self.kind == "learned":
            return self.learned(pos)
        return 0.0


class RelativeKeys(nn.Module):
    """Shaw et al. (2018), eq. 4-5 with the key term: e_ij = q_i (k_j + a_ij)^T / sqrt(d_head),
    a_ij = w[clip(j - i, -k, k)], shared by the heads of a layer. Only differences of
    positions enter, so shifting every position changes nothing. (The value term a^V is left
    out: Shaw et al. report it adds nothing for translation.)"""

    def __init__(self, max_distance: int, d_head: int):
        super().__init__()
        self.k = max_distance
        self.table = nn.Embedding(2 * max_distance + 1, d_head)
        nn.init.normal_(self.table.weight, std=d_head**-0.5)

    def forward(self, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """q: (B, H, T, Dh); q_pos: (T,) or (B, T); k_pos: (S,) or (B, S).
        Returns the additive score bias (B, H, T, S)."""
        b, h, t, dh = q.shape
        dist = k_pos[..., None, :] - q_pos[..., :, None]  # (T, S) or (B, T, S)
        idx = dist.clamp(-self.k, self.k) + self.k
        idx = idx[None, None] if idx.dim() == 2 else idx[:, None]
        scores = q @ self.table.weight.to(q.dtype).t()  # (B, H, T, 2k+1)
        return scores.gather(-1, idx.expand(b, h, t, idx.shape[-1])) / dh**0.5
