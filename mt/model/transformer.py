"""The encoder-decoder Transformer (Vaswani et al. 2017). It returns logits; the loss and the
search live outside it."""
from __future__ import annotations

import math

import torch
from torch import nn

from mt.model.dropout import Dropout
from mt.model.layers import DecoderLayer, EncoderLayer
from mt.tokenizer import PAD


def sinusoidal_table(n_positions: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)  (sec. 3.5)."""
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32)
                         * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: d_model // 2])
    return table


class Transformer(nn.Module):
    def __init__(self, *, src_vocab: int, tgt_vocab: int, d_model: int, n_heads: int,
                 enc_layers: int, dec_layers: int, d_ff: int, dropout: float,
                 attn_dropout: float, pre_norm: bool, tie_embeddings: str, max_positions: int):
        super().__init__()
        self.d_model, self.max_positions = d_model, max_positions
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model, padding_idx=PAD)
        if tie_embeddings == "all":
            if src_vocab != tgt_vocab:
                raise ValueError("tie_embeddings=all needs one shared vocabulary")
            self.src_embed = self.tgt_embed
        else:
            self.src_embed = nn.Embedding(src_vocab, d_model, padding_idx=PAD)
        self.output = None if tie_embeddings != "none" else nn.Linear(d_model, tgt_vocab, bias=False)
        self.register_buffer("pos_table", sinusoidal_table(max_positions, d_model), persistent=False)
        self.dropout = Dropout(dropout)
        layer_args = (d_model, n_heads, d_ff, dropout, attn_dropout, pre_norm)
        self.encoder = nn.ModuleList(EncoderLayer(*layer_args) for _ in range(enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(*layer_args) for _ in range(dec_layers))
        # Pre-LN leaves the residual stream unnormalised, so each stack ends with a LayerNorm.
        self.enc_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.dec_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        # N(0, d^-1/2) so that after the sqrt(d) scaling (sec. 3.4) embeddings have unit scale.
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, std=self.d_model ** -0.5)
            with torch.no_grad():
                emb.weight[PAD].zero_()

    def _embed(self, table: nn.Embedding, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        t = ids.shape[1]
        if start + t > self.max_positions:
            raise ValueError(f"sequence of {start + t} positions exceeds max_positions "
                             f"{self.max_positions}")
        x = table(ids) * math.sqrt(self.d_model) + self.pos_table[start:start + t]
        return self.dropout(x)

    @staticmethod
    def memory_mask(src_pad_mask: torch.Tensor) -> torch.Tensor:
        return (~src_pad_mask)[:, None, None, :]  # (B, 1, 1, S), True = may attend

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        """src: (B, S) ids; src_pad_mask: (B, S) True = padding. Returns (B, S, D)."""
        x = self._embed(self.src_embed, src)
        mask = self.memory_mask(src_pad_mask)
        for layer in self.encoder:
            x = layer(x, mask)
        return self.enc_norm(x)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_pad_mask: torch.Tensor,
               cache: list[dict] | None = None, start: int = 0,
               weights: list | None = None) -> torch.Tensor:
        """tgt_in: (B, T) ids starting at position `start` (T = 1 with a cache).
        Returns decoder states (B, T, D); `project` turns them into logits."""
        x = self._embed(self.tgt_embed, tgt_in, start)
        mask = self.memory_mask(src_pad_mask)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, mask, cache=None if cache is None else cache[i], weights=weights)
        return self.dec_norm(x)

    def project(self, h: torch.Tensor) -> torch.Tensor:
        if self.output is not None:
            return self.output(h)
        return h @ self.tgt_embed.weight.t()  # (..., V), weights tied with the embedding

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, src_pad_mask: torch.Tensor,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced logits (B, T, V); with `keep` (B, T) bool, only the kept positions
        are projected (N, V): padding needs no output layer."""
        h = self.decode(tgt_in, self.encode(src, src_pad_mask), src_pad_mask)
        return self.project(h[keep] if keep is not None else h)

    def new_cache(self) -> list[dict]:
        return [{} for _ in self.decoder]


def reorder_cache(cache: list[dict], index: torch.Tensor, cross: bool = True) -> None:
    """Select rows `index` of every cached tensor (beam reordering / dropping finished
    sentences). Cross-attention keys depend only on the sentence, so a pure beam reorder
    inside the same sentences can skip them (cross=False)."""
    for layer in cache:
        for kind in ("self", "cross") if cross else ("self",):
            part = layer.get(kind)
            if part:
                for key in part:
                    part[key] = part[key].index_select(0, index)


def build_model(cfg, src_vocab: int, tgt_vocab: int) -> Transformer:
    """cfg: ModelConfig."""
    return Transformer(src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=cfg.d_model,
                       n_heads=cfg.n_heads, enc_layers=cfg.enc_layers, dec_layers=cfg.dec_layers,
                       d_ff=cfg.d_ff, dropout=cfg.dropout, attn_dropout=cfg.attn_dropout,
                       pre_norm=cfg.norm == "pre", tie_embeddings=cfg.tie_embeddings,
                       max_positions=cfg.max_positions)
