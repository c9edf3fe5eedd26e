"""The encoder-decoder Transformer (Vaswani et al. 2017). It returns logits; the loss and the
search live outside it."""

from __future__ import annotations

import math

import torch
from torch import nn

from mt.model.attention import CAUSAL
from mt.model.base import Seq2Seq, init_weights, make_embeddings
from mt.model.layers import (
    REFERENCE,
    DecoderLayer,
    EncoderLayer,
    LayerShape,
    Parts,
    relative_positions,
)
from mt.model.layout import Layout
from mt.model.positions import AbsolutePositions


class Transformer(Seq2Seq):
    # the beam's queries grouped over one copy of the memory per sentence (mt/decode/cache.py)
    cross_cache_per_sentence = True

    def __init__(
        self,
        *,
        src_vocab: int,
        tgt_vocab: int,
        shape: LayerShape,
        enc_layers: int,
        dec_layers: int,
        tie_embeddings: str,
        max_positions: int,
        positional: str = "sinusoidal",
        output_bias: bool = False,
        parts: Parts = REFERENCE,
    ):
        """shape: every layer's (LayerShape); positional: sinusoidal, learned or relative
        (then shape.relative is the distance relative attention looks)."""
        super().__init__()
        d_model = shape.d_model
        self.d_model, self.max_positions = d_model, max_positions
        make_embeddings(self, src_vocab, tgt_vocab, d_model, tie_embeddings, output_bias)
        self.positions = AbsolutePositions(positional, max_positions, d_model)
        self.relative = relative_positions(positional, shape)
        self.dropout = parts.dropout(shape.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(shape, parts) for _ in range(enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(shape, parts) for _ in range(dec_layers))
        # Pre-LN leaves the residual stream unnormalised, so each stack ends with a LayerNorm.
        self.enc_norm = nn.LayerNorm(d_model) if shape.pre_norm else nn.Identity()
        self.dec_norm = nn.LayerNorm(d_model) if shape.pre_norm else nn.Identity()
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

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        """src: (B, S) ids; src_pad_mask: (B, S) True = padding. Returns (B, S, D)."""
        return self.encoder_stack(*self.encoder_inputs(src, src_pad_mask))

    def encoder_inputs(self, src, src_pad_mask):
        """(the embedded source (B, S, D), its attention mask, relative positions or None)."""
        pos = torch.arange(src.shape[1], device=src.device)
        x = self._embed(self.src_embed, src)
        return x, self.memory_mask(src_pad_mask), self._relative(pos, pos)

    def encoder_stack(self, x: torch.Tensor, mask, relative) -> torch.Tensor:
        """The encoder's layers over the embedded source x (B, S, D) with its attention mask;
        relative: (query, key) positions for relative attention, else None."""
        for layer in self.encoder:
            x = layer(x, mask, positions=relative)
        return self.enc_norm(x)

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        src_pad_mask: torch.Tensor,
        cache: list | None = None,
        start: int | torch.Tensor = 0,
        weights: list | None = None,
    ) -> torch.Tensor:
        """tgt_in: (B, T) ids starting at position `start` (T = 1 with a cache, the search's
        mt.decode.cache.DecodeCache; a (1,) tensor with a static cache). Returns decoder
        states (B, T, D); `project` turns them into logits."""
        x, self_mask, cross_mask, relative = self.decoder_inputs(tgt_in, src_pad_mask, cache, start)
        return self.decoder_stack(x, memory, self_mask, cross_mask, relative, cache, weights)

    def decoder_inputs(self, tgt_in, src_pad_mask, cache, start):
        """(the embedded target (B, T, D), its self-attention mask, the memory's mask,
        relative positions or None). A cached step's one query may see every cached key."""
        x = self._embed(self.tgt_embed, tgt_in, start)
        relative = None
        if self.relative:  # (never with a static cache: see static_cache)
            assert isinstance(start, int)
            k_pos = torch.arange(start + tgt_in.shape[1], device=tgt_in.device)
            relative = (k_pos[start:], k_pos)
        return x, CAUSAL if cache is None else None, self.memory_mask(src_pad_mask), relative

    def decoder_stack(
        self, x, memory, self_mask, cross_mask, relative, cache=None, weights=None
    ) -> torch.Tensor:
        """The decoder's layers over the embedded target x (B, T, D) and the memory."""
        for i, layer in enumerate(self.decoder):
            part = None if cache is None else cache[i]
            x = layer(x, memory, cross_mask, self_mask, part, relative, weights)
        return self.dec_norm(x)

    def laid_out(self, src: torch.Tensor, tgt_in: torch.Tensor, layout: Layout) -> torch.Tensor:
        """Teacher-forced decoder states (B, T, D) of a batch that brings its own masks and
        positions (a packed batch's, mt/data/packing.py)."""
        s, t = layout.src_positions, layout.tgt_positions
        x = self._embed(self.src_embed, src, positions=s)
        memory = self.encoder_stack(x, layout.encoder_mask, self._relative(s, s))
        y = self._embed(self.tgt_embed, tgt_in, positions=t)
        return self.decoder_stack(
            y, memory, layout.decoder_mask, layout.cross_mask, self._relative(t, t)
        )

    def _relative(self, queries: torch.Tensor, keys: torch.Tensor):
        return (queries, keys) if self.relative else None

    @property
    def cache_layers(self) -> int:
        return len(self.decoder)

    @property
    def static_cache(self) -> bool:
        return not self.relative  # relative keys count positions on the host
