"""What every architecture shares: the interface that search, the trainer and alignment use
(encode -> memory, decode -> states, project -> logits, a batch-first cache), embeddings that
can be tied, and the weight initialisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mt.tokens import PAD


class Seq2Seq(nn.Module):
    """Subclasses define encode(src, src_pad_mask) -> memory (batch first),
    decode(tgt_in, memory, src_pad_mask, cache=None, start=0, weights=None) -> states (B, T, D),
    and have src_embed, tgt_embed, output, max_positions (the longest source or target they
    take) and cache_layers: how many layers the search's cache (mt.decode.cache.DecodeCache,
    one LayerCache per layer, batch first) holds for decode(cache=)."""

    max_positions: int
    d_model: int
    src_embed: nn.Embedding
    tgt_embed: nn.Embedding
    output: nn.Linear | None  # None: the output layer is the target embedding (tied)
    output_bias: nn.Parameter | None  # (V,) added to the logits (model.output_bias), or None
    # True where decode() accepts a cross cache of one row per sentence for consecutive
    # groups of hypothesis rows (beam search then keeps no K copies of it).
    cross_cache_per_sentence: bool = False

    @property
    def static_cache(self) -> bool:
        """Whether decode() takes a static self-attention cache (mt.decode.cache.Static) and
        a tensor `start`: what a compiled or CUDA-graphed decoder step needs."""
        return False

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        src_pad_mask: torch.Tensor,
        cache: list | None = None,
        start: int = 0,
        weights: list | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError

    @property
    def cache_layers(self) -> int:
        raise NotImplementedError

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """(..., V) logits = h @ output_weight.T (+ output_bias)."""
        return F.linear(h, self.output_weight, self.output_bias)

    @property
    def output_weight(self) -> torch.Tensor:
        """(V, D): the output layer's, or the target embedding when they are tied."""
        return self.output.weight if self.output is not None else self.tgt_embed.weight

    def forward(
        self, src: torch.Tensor, tgt_in: torch.Tensor, src_pad_mask: torch.Tensor
    ) -> torch.Tensor:
        """Teacher-forced logits (B, T, V) of the next target token at every position."""
        return self.project(self.decode(tgt_in, self.encode(src, src_pad_mask), src_pad_mask))


def make_embeddings(
    model: Seq2Seq, src_vocab: int, tgt_vocab: int, d_model: int, tie: str, bias: bool = False
) -> None:
    """src_embed, tgt_embed and output (None when the output layer is the target embedding),
    and output_bias when `bias` (a learned bias per output token, as Marian's models have)."""
    model.tgt_embed = nn.Embedding(tgt_vocab, d_model, padding_idx=PAD)
    if tie == "all":
        if src_vocab != tgt_vocab:
            raise ValueError("tie_embeddings=all needs one shared vocabulary")
        model.src_embed = model.tgt_embed
    else:
        model.src_embed = nn.Embedding(src_vocab, d_model, padding_idx=PAD)
    model.output = None if tie != "none" else nn.Linear(d_model, tgt_vocab, bias=False)
    model.register_parameter("output_bias", nn.Parameter(torch.zeros(tgt_vocab)) if bias else None)


def init_weights(model: Seq2Seq) -> None:
    """Xavier-uniform linear layers, zero biases; embeddings N(0, d^-1/2) so that after the
    sqrt(d) scaling (sec. 3.4) they have unit scale; the padding row zero."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for emb in {model.src_embed, model.tgt_embed}:
        nn.init.normal_(emb.weight, std=emb.weight.shape[1] ** -0.5)
        with torch.no_grad():
            emb.weight[PAD].zero_()
