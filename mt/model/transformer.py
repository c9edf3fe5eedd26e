"""The encoder-decoder Transformer (Vaswani et al. 2017). It returns logits; the loss and the
search live outside it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from mt.model.base import Seq2Seq, init_weights, make_embeddings
from mt.model.cache import reorder_cache  # noqa: F401  (re-exported)
from mt.model.layers import REFERENCE, DecoderLayer, EncoderLayer, Parts
from mt.model.positions import AbsolutePositions

if TYPE_CHECKING:
    from mt.data.packing import Packing


class Transformer(Seq2Seq):
    cross_cache_per_sentence = True  # see MultiHeadAttention's grouped queries

    def __init__(
        self,
        *,
        src_vocab: int,
        tgt_vocab: int,
        d_model: int,
        n_heads: int,
        enc_layers: int,
        dec_layers: int,
        d_ff: int,
        dropout: float,
        attn_dropout: float,
        pre_norm: bool,
        tie_embeddings: str,
        max_positions: int,
        positional: str = "sinusoidal",
        max_relative: int = 16,
        act_dropout: float | None = None,
        parts: Parts = REFERENCE,
    ):
        super().__init__()
        self.d_model, self.max_positions = d_model, max_positions
        make_embeddings(self, src_vocab, tgt_vocab, d_model, tie_embeddings)
        self.positions = AbsolutePositions(positional, max_positions, d_model)
        self.relative = positional == "relative"
        self.dropout = parts.dropout(dropout)
        layer_args = (
            d_model,
            n_heads,
            d_ff,
            dropout,
            attn_dropout,
            pre_norm,
            max_relative if self.relative else 0,
        )
        self.encoder = nn.ModuleList(
            EncoderLayer(*layer_args, act_dropout=act_dropout, parts=parts)
            for _ in range(enc_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(*layer_args, act_dropout=act_dropout, parts=parts)
            for _ in range(dec_layers)
        )
        # Pre-LN leaves the residual stream unnormalised, so each stack ends with a LayerNorm.
        self.enc_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.dec_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        init_weights(self)

    def _embed(
        self,
        table: nn.Embedding,
        ids: torch.Tensor,
        start: int | torch.Tensor = 0,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """start: the first position, a number, or a (1,) tensor (a static cache's step: the
        search keeps positions in range); positions: each token's own (B, T) (packed rows)."""
        t = ids.shape[1]
        if isinstance(start, int) and start + t > self.max_positions:
            raise ValueError(
                f"sequence of {start + t} positions exceeds max_positions {self.max_positions}"
            )
        pos = start + torch.arange(t, device=ids.device) if positions is None else positions
        return self.dropout(table(ids) * math.sqrt(self.d_model) + self.positions(pos))

    @staticmethod
    def memory_mask(src_pad_mask: torch.Tensor) -> torch.Tensor:
        return (~src_pad_mask)[:, None, None, :]  # (B, 1, 1, S), True = may attend

    def encode(
        self, src: torch.Tensor, src_pad_mask: torch.Tensor, packing: Packing | None = None
    ) -> torch.Tensor:
        """src: (B, S) ids; src_pad_mask: (B, S) True = padding; packing: several pairs per
        row (mt/data/packing.py), each attending to itself alone. Returns (B, S, D)."""
        if packing is not None:
            x = self._embed(self.src_embed, src, positions=packing.src_positions)
            mask = packing.encoder_mask()  # built once, shared by every layer
            for layer in self.encoder:
                x = layer(x, mask)
            return self.enc_norm(x)
        x = self._embed(self.src_embed, src)
        mask = self.memory_mask(src_pad_mask)
        pos = torch.arange(src.shape[1], device=src.device) if self.relative else None
        for layer in self.encoder:
            x = layer(x, mask, q_pos=pos, k_pos=pos)
        return self.enc_norm(x)

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        src_pad_mask: torch.Tensor,
        cache: list[dict] | None = None,
        start: int | torch.Tensor = 0,
        weights: list | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """tgt_in: (B, T) ids starting at position `start` (T = 1 with a cache; a (1,) tensor
        with a static cache, see mt.model.cache.make_static); packing: several pairs per row,
        as in encode (training only).
        Returns decoder states (B, T, D); `project` turns them into logits."""
        if packing is not None:
            x = self._embed(self.tgt_embed, tgt_in, positions=packing.tgt_positions)
            self_mask, cross_mask = packing.decoder_mask(), packing.cross_mask()
            for layer in self.decoder:
                x = layer(x, memory, cross_mask, self_mask=self_mask)
            return self.dec_norm(x)
        x = self._embed(self.tgt_embed, tgt_in, start)
        mask = self.memory_mask(src_pad_mask)
        q_pos = k_pos = None
        if self.relative:  # (never with a static cache: see static_cache)
            assert isinstance(start, int)
            k_pos = torch.arange(start + tgt_in.shape[1], device=tgt_in.device)
            q_pos = k_pos[start:]
        for i, layer in enumerate(self.decoder):
            x = layer(
                x,
                memory,
                mask,
                cache=None if cache is None else cache[i],
                weights=weights,
                q_pos=q_pos,
                k_pos=k_pos,
            )
        return self.dec_norm(x)

    def forward(
        self,
        src: torch.Tensor,
        tgt_in: torch.Tensor,
        src_pad_mask: torch.Tensor,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits (B, T, V); packing: a packed batch's segments and positions
        (train.pack_width), which encode and decode take."""
        if packing is None:  # mt/fast's subclass overrides encode and decode without it
            return super().forward(src, tgt_in, src_pad_mask)
        memory = self.encode(src, src_pad_mask, packing=packing)
        return self.project(self.decode(tgt_in, memory, src_pad_mask, packing=packing))

    def new_cache(self) -> list[dict]:
        return [{} for _ in self.decoder]

    @property
    def static_cache(self) -> bool:
        return not self.relative  # relative keys count positions on the host
