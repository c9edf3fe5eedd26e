"""A decoder-only translation model: one causal Transformer reads `source <sep> target` as a
single sequence (the source, ended by its EOS, then BOS as the separator, then the target).
The loss covers the target part only, and decoding continues after the separator.

It speaks the encoder-decoder interface that search and the trainer use: `encode` returns the
source ids themselves (the same causal stack reads them, at the first decoding step), `decode`
returns the states of the target positions. Batches are right-padded, so source padding sits
in the middle of the sequence: padded keys are masked and positions are counted per sentence
(the target starts right after the real source), so padding changes nothing.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mt.model.base import Seq2Seq, init_weights, make_embeddings
from mt.model.layers import REFERENCE, EncoderLayer, LayerShape, Parts, relative_positions
from mt.model.positions import AbsolutePositions


class DecoderOnly(Seq2Seq):
    def __init__(
        self,
        *,
        src_vocab: int,
        tgt_vocab: int,
        shape: LayerShape,
        layers: int,
        tie_embeddings: str,
        max_positions: int,
        positional: str = "sinusoidal",
        output_bias: bool = False,
        parts: Parts = REFERENCE,
    ):
        super().__init__()
        d_model = self.d_model = shape.d_model
        # Source and target share the position range: search and translation limit each side
        # to half of it; training only needs the sum to fit.
        self.max_positions = max_positions // 2
        make_embeddings(self, src_vocab, tgt_vocab, d_model, tie_embeddings, output_bias)
        self.positions = AbsolutePositions(positional, max_positions, d_model)
        self.relative = relative_positions(positional, shape)
        self.dropout = parts.dropout(shape.dropout)
        self.layers = nn.ModuleList(EncoderLayer(shape, parts) for _ in range(layers))
        self.final_norm = nn.LayerNorm(d_model) if shape.pre_norm else nn.Identity()
        init_weights(self)

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        """Nothing to compute ahead: the 'memory' is the source itself, read by `decode`."""
        return src

    def _embed(self, table, ids, pos):
        return table(ids) * math.sqrt(self.d_model) + self.positions(pos)

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        src_pad_mask: torch.Tensor,
        cache: list | None = None,
        start: int = 0,
        weights: list | None = None,
    ) -> torch.Tensor:
        """tgt_in: (B, T) target ids from target position `start`; memory: the source ids
        (B, S). Without a cache, or at start 0, the source is read too (and cached).
        Returns the target states (B, T, D)."""
        src = memory
        b, s = src.shape
        t, dev = tgt_in.shape[1], tgt_in.device
        src_len = (~src_pad_mask).sum(1, keepdim=True)  # (B, 1)
        n_pos = self.positions.max_positions
        if s + start + t > n_pos and int(src_len.max()) + start + t > n_pos:  # sync: rare case
            raise ValueError(
                f"source + target of {int(src_len.max()) + start + t} positions "
                f"exceed max_positions {n_pos}"
            )
        tgt_pos = src_len + start + torch.arange(t, device=dev)  # (B, T)
        src_pos = torch.arange(s, device=dev).expand(b, s)
        read_src = cache is None or start == 0
        x = self._embed(self.tgt_embed, tgt_in, tgt_pos)
        if read_src:
            x = torch.cat([self._embed(self.src_embed, src, src_pos), x], dim=1)
            q_pos = torch.cat([src_pos, tgt_pos], 1)
        else:
            q_pos = tgt_pos
        x = self.dropout(x)
        # Keys: the source (padding masked) and target positions 0 .. start+T-1.
        k_pos = torch.cat([src_pos, src_len + torch.arange(start + t, device=dev)], 1)
        mask = self._mask(src_pad_mask, x.shape[1], start + t)  # (B, 1, Q, K)
        layer_weights: list[torch.Tensor] = []
        positions = (q_pos, k_pos) if self.relative else None
        for i, layer in enumerate(self.layers):
            part = None if cache is None else cache[i].self
            x = layer(x, mask, part, positions, None if weights is None else layer_weights)
        if weights is not None:  # target queries over source keys: the "cross" attention
            weights += [w[:, :, -t:, :s] for w in layer_weights]
        return self.final_norm(x[:, -t:])

    @staticmethod
    def _mask(src_pad_mask: torch.Tensor, n_q: int, n_tgt: int) -> torch.Tensor:
        """(B, 1, Q, K) may-attend: causal over the sequence, the source's padding barred."""
        b, dev = src_pad_mask.shape[0], src_pad_mask.device
        tgt_ok = torch.ones(b, n_tgt, dtype=torch.bool, device=dev)
        key_ok = torch.cat([~src_pad_mask, tgt_ok], 1)  # (B, S+start+T)
        n_k = key_ok.shape[1]
        causal = torch.ones(n_q, n_k, dtype=torch.bool, device=dev).tril(n_k - n_q)
        return causal[None, None] & key_ok[:, None, None, :]

    @property
    def cache_layers(self) -> int:
        return len(self.layers)
