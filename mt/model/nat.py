"""A non-autoregressive Transformer: the conditional masked language model of Mask-Predict
(Ghazvininejad et al. 2019). The encoder is the Transformer's; the decoder reads the whole
target at once, without the causal mask, and predicts the tokens hidden behind the mask token;
a length predictor on the mean encoder state says how long the target is. Training and
decoding (iterative re-masking) live in mt/objectives/nat.py."""

from __future__ import annotations

import torch
from torch import nn

from mt.model.transformer import Transformer
from mt.tokens import PAD


class NATransformer(Transformer):
    non_autoregressive = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # target lengths 0 .. max_positions - 1, predicted from the source (Gu et al. 2018)
        self.length = nn.Linear(self.d_model, self.max_positions)
        nn.init.xavier_uniform_(self.length.weight)
        nn.init.zeros_(self.length.bias)

    def predict_length(self, memory: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        """Logits (B, max_positions) of the target length, from the mean of the real
        encoder states."""
        real = (~src_pad_mask).unsqueeze(-1).to(memory.dtype)  # (B, S, 1)
        pooled = (memory * real).sum(1) / real.sum(1).clamp(min=1.0)  # (B, D)
        return self.length(pooled)

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        src_pad_mask: torch.Tensor,
        cache=None,
        start: int | torch.Tensor = 0,
        weights: list | None = None,
    ) -> torch.Tensor:
        """tgt_in: (B, T) the target with some (or all) tokens replaced by the mask token,
        padded with PAD; every position sees every other real one. Returns (B, T, D)."""
        x = self._embed(self.tgt_embed, tgt_in)
        memory_mask = self.memory_mask(src_pad_mask)
        self_mask = (tgt_in != PAD)[:, None, None, :]  # (B, 1, 1, T)
        pos = torch.arange(tgt_in.shape[1], device=tgt_in.device) if self.relative else None
        positions = None if pos is None else (pos, pos)
        for layer in self.decoder:
            x = layer(x, memory, memory_mask, self_mask, positions=positions, weights=weights)
        return self.dec_norm(x)
