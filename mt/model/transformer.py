"""The encoder-decoder Transformer (Vaswani et al. 2017). It returns logits; the loss and the
search live outside it."""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import nn

from mt.model.attention import CAUSAL
from mt.model.base import Seq2Seq, init_weights, make_embeddings
from mt.model.layers import REFERENCE, DecoderLayer, EncoderLayer, Parts
from mt.model.positions import AbsolutePositions


class Packing(Protocol):
    """What the model reads of a packed batch (several pairs per row, each attending to
    itself alone; mt/data/packing.py makes them): each position's pair (1, 2, ...; 0:
    padding) and place in it, and the attention masks that keep the pairs apart."""

    src_segments: torch.Tensor  # (B, S)
    tgt_segments: torch.Tensor  # (B, T)
    src_positions: torch.Tensor  # (B, S)
    tgt_positions: torch.Tensor  # (B, T)

    def encoder_mask(self) -> torch.Tensor: ...

    def decoder_mask(self) -> torch.Tensor: ...

    def cross_mask(self) -> torch.Tensor: ...


class Transformer(Seq2Seq):
    # the beam's queries grouped over one copy of the memory per sentence (mt/decode/cache.py)
    cross_cache_per_sentence = True

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
        activation: str = "relu",
        output_bias: bool = False,
        parts: Parts = REFERENCE,
    ):
        super().__init__()
        self.d_model, self.max_positions = d_model, max_positions
        make_embeddings(self, src_vocab, tgt_vocab, d_model, tie_embeddings, output_bias)
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
            EncoderLayer(*layer_args, act_dropout=act_dropout, parts=parts, activation=activation)
            for _ in range(enc_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(*layer_args, act_dropout=act_dropout, parts=parts, activation=activation)
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
        x, mask, positions = self.encoder_inputs(src, src_pad_mask, packing)
        for layer in self.encoder:
            x = layer(x, mask, positions=positions)
        return self.enc_norm(x)

    def encoder_inputs(self, src, src_pad_mask, packing: Packing | None):
        """(the embedded source (B, S, D), its attention mask, relative positions or None)."""
        if packing is not None:  # (each pair's own positions, also for relative keys)
            own = packing.src_positions  # (B, S)
            x = self._embed(self.src_embed, src, positions=own)
            return x, self.packed_encoder_mask(packing), (own, own) if self.relative else None
        pos = torch.arange(src.shape[1], device=src.device) if self.relative else None
        positions = None if pos is None else (pos, pos)
        return self._embed(self.src_embed, src), self.memory_mask(src_pad_mask), positions

    def packed_encoder_mask(self, packing: Packing):
        """A packed batch's encoder self-attention mask: (R, 1, S, S) may-attend."""
        return packing.encoder_mask()

    def packed_decoder_masks(self, packing: Packing) -> tuple:
        """A packed batch's decoder self-attention and cross-attention masks."""
        return packing.decoder_mask(), packing.cross_mask()

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        src_pad_mask: torch.Tensor,
        cache: list | None = None,
        start: int | torch.Tensor = 0,
        weights: list | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """tgt_in: (B, T) ids starting at position `start` (T = 1 with a cache, the search's
        mt.decode.cache.DecodeCache; a (1,) tensor with a static cache); packing: several
        pairs per row, as in encode (training only).
        Returns decoder states (B, T, D); `project` turns them into logits."""
        x, self_mask, cross_mask, positions = self.decoder_inputs(
            tgt_in, src_pad_mask, cache, start, packing
        )
        for i, layer in enumerate(self.decoder):
            part = None if cache is None else cache[i]
            x = layer(x, memory, cross_mask, self_mask, part, positions, weights)
        return self.dec_norm(x)

    def decoder_inputs(self, tgt_in, src_pad_mask, cache, start, packing: Packing | None):
        """(the embedded target (B, T, D), its self-attention mask, the memory's mask,
        relative positions or None). A cached step's one query may see every cached key."""
        if packing is not None:
            pos = packing.tgt_positions  # (B, T)
            x = self._embed(self.tgt_embed, tgt_in, positions=pos)
            relative = (pos, pos) if self.relative else None
            return x, *self.packed_decoder_masks(packing), relative
        x = self._embed(self.tgt_embed, tgt_in, start)
        positions = None
        if self.relative:  # (never with a static cache: see static_cache)
            assert isinstance(start, int)
            k_pos = torch.arange(start + tgt_in.shape[1], device=tgt_in.device)
            positions = (k_pos[start:], k_pos)
        return x, CAUSAL if cache is None else None, self.memory_mask(src_pad_mask), positions

    def forward(
        self,
        src: torch.Tensor,
        tgt_in: torch.Tensor,
        src_pad_mask: torch.Tensor,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits (B, T, V); packing: a packed batch's segments and positions
        (train.pack_width), which encode and decode take."""
        memory = self.encode(src, src_pad_mask, packing=packing)
        return self.project(self.decode(tgt_in, memory, src_pad_mask, packing=packing))

    @property
    def cache_layers(self) -> int:
        return len(self.decoder)

    @property
    def static_cache(self) -> bool:
        return not self.relative  # relative keys count positions on the host
