"""The RNN encoder-decoder of the attention story: a bidirectional GRU encoder and a GRU
decoder that, at every step, either reads one fixed summary of the source (`none`: the
bottleneck of Sutskever et al. 2014 / Cho et al. 2014), or attends over all encoder states:
additive attention computed from the previous decoder state and fed into the recurrence
(`bahdanau`, Bahdanau et al. 2015), or multiplicative ("general") attention computed from the
current decoder state and combined with it after the recurrence (`luong`, Luong et al. 2015,
without input feeding). Only `bahdanau` must run step by step in training; the others run the
GRU over the whole target at once.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from mt.model.base import Seq2Seq, init_weights, make_embeddings
from mt.model.layers import REFERENCE, Parts


class AdditiveAttention(nn.Module):
    """score(s, h_j) = v^T tanh(W s + U h_j)  (Bahdanau et al. 2015, eq. 6 / A.1.2)."""

    def __init__(self, d: int):
        super().__init__()
        self.query, self.key = nn.Linear(d, d, bias=False), nn.Linear(d, d)
        self.v = nn.Linear(d, 1, bias=False)

    def keys(self, memory: torch.Tensor) -> torch.Tensor:
        return self.key(memory)  # U h_j, once per sentence

    def scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """query (B, T, D), keys (B, S, D) -> (B, T, S)."""
        return self.v(torch.tanh(self.query(query)[:, :, None] + keys[:, None])).squeeze(-1)


class GeneralAttention(nn.Module):
    """score(h_t, h_j) = h_t^T W h_j  (Luong et al. 2015, 'general')."""

    def __init__(self, d: int):
        super().__init__()
        self.key = nn.Linear(d, d, bias=False)

    def keys(self, memory: torch.Tensor) -> torch.Tensor:
        return self.key(memory)

    def scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return query @ keys.transpose(1, 2)


class RNNSeq2Seq(Seq2Seq):
    def __init__(
        self,
        *,
        src_vocab: int,
        tgt_vocab: int,
        d_model: int,
        enc_layers: int,
        dec_layers: int,
        dropout: float,
        attention: str,
        tie_embeddings: str,
        max_positions: int,
        parts: Parts = REFERENCE,
    ):
        super().__init__()
        if d_model % 2:
            raise ValueError("the bidirectional encoder needs an even d_model")
        self.d_model, self.attention, self.max_positions = d_model, attention, max_positions
        self.dec_layers = dec_layers
        make_embeddings(self, src_vocab, tgt_vocab, d_model, tie_embeddings)
        self.dropout = parts.dropout(dropout)
        # Each direction has d/2 units, so an encoder state (both directions) has d.
        self.encoder = nn.GRU(
            d_model,
            d_model // 2,
            enc_layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if enc_layers > 1 else 0.0,
        )
        self.init_state = nn.Linear(d_model, dec_layers * d_model)
        reads_context = attention in ("bahdanau", "none")  # context enters the recurrence
        self.decoder = nn.GRU(
            d_model * (2 if reads_context else 1),
            d_model,
            dec_layers,
            batch_first=True,
            dropout=dropout if dec_layers > 1 else 0.0,
        )
        self.attn = {"bahdanau": AdditiveAttention, "luong": GeneralAttention}.get(
            attention, lambda d: None
        )(d_model)
        # Output layer input: [s_t; c_t; y_{t-1}] (Bahdanau, Cho) or [c_t; h_t] (Luong).
        self.combine = nn.Linear(d_model * (3 if reads_context else 2), d_model)
        init_weights(self)

    # -- encoder --------------------------------------------------------------------------
    # (the recurrences run through `recur`, in fp32 under any autocast)
    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        """(B, S) -> encoder states (B, S, D); padding positions are zeros."""
        x = self.dropout(self.src_embed(src) * math.sqrt(self.d_model))
        lengths = (~src_pad_mask).sum(1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = recur(self.encoder, packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        return self.dropout(out)

    def _summary(self, memory: torch.Tensor, src_pad_mask: torch.Tensor) -> torch.Tensor:
        """The source as one vector: the forward direction's last state and the backward
        direction's first, i.e. each direction's final state. (B, D)."""
        half = self.d_model // 2
        last = (~src_pad_mask).sum(1) - 1
        fwd = memory[torch.arange(memory.shape[0], device=memory.device), last, :half]
        return torch.cat([fwd, memory[:, 0, half:]], dim=-1)

    # -- decoder --------------------------------------------------------------------------
    def _start(self, memory, src_pad_mask, cache):
        """(decoder state (L, B, D), (the source summary (B, D), attention keys (B, S, D) if
        any)): the state from the cache or computed afresh; the rest once per sentence."""

        def from_memory():
            summary = self._summary(memory, src_pad_mask)
            return (summary,) if self.attn is None else (summary, self.attn.keys(memory))

        cross = from_memory() if cache is None else cache[0].cross.memory(from_memory)
        if cache is not None and "h" in cache[0].state:
            return cache[0].state["h"].transpose(0, 1).contiguous(), cross
        h0 = torch.tanh(self.init_state(cross[0])).view(-1, self.dec_layers, self.d_model)
        return h0.transpose(0, 1).contiguous(), cross

    def _attend(self, query, keys, memory, src_pad_mask):
        """query (B, T, D) -> context (B, T, D), weights (B, T, S)."""
        scores = self.attn.scores(query, keys).float()
        scores = scores.masked_fill(src_pad_mask[:, None, :], float("-inf"))
        weights = scores.softmax(-1).to(memory.dtype)
        return weights @ memory, weights

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        src_pad_mask: torch.Tensor,
        cache: list | None = None,
        start: int = 0,
        weights: list | None = None,
    ) -> torch.Tensor:
        """tgt_in (B, T) -> output states (B, T, D). With a cache, the decoder state carries
        over from the previous call. Attention weights (B, 1, T, S) go into `weights`."""
        y = self.dropout(self.tgt_embed(tgt_in) * math.sqrt(self.d_model))
        h, cross = self._start(memory, src_pad_mask, cache)
        if self.attention == "bahdanau":
            out, h, w = self._bahdanau(y, h, cross[1], memory, src_pad_mask)
        elif self.attention == "luong":
            s, h = recur(self.decoder, y, h)
            ctx, w = self._attend(s, cross[1], memory, src_pad_mask)
            out = torch.tanh(self.combine(torch.cat([ctx, s], -1)))
        else:
            ctx = cross[0][:, None].expand(-1, y.shape[1], -1)
            s, h = recur(self.decoder, torch.cat([y, ctx], -1), h)
            out, w = torch.tanh(self.combine(torch.cat([s, ctx, y], -1))), None
        if cache is not None:
            cache[0].state["h"] = h.transpose(0, 1)  # batch first, for reordering
        if weights is not None and w is not None:
            weights.append(w[:, None])
        return self.dropout(out)

    def _bahdanau(self, y, h, keys, memory, src_pad_mask):
        """Step by step: c_t from s_{t-1}; s_t = GRU([y_{t-1}; c_t], s_{t-1})."""
        outs, ws = [], []
        for t in range(y.shape[1]):
            ctx, w = self._attend(h[-1][:, None], keys, memory, src_pad_mask)  # (B, 1, D)
            s, h = recur(self.decoder, torch.cat([y[:, t : t + 1], ctx], -1), h)
            outs.append(torch.tanh(self.combine(torch.cat([s, ctx, y[:, t : t + 1]], -1))))
            ws.append(w)
        return torch.cat(outs, 1), h, torch.cat(ws, 1)

    @property
    def cache_layers(self) -> int:
        return 1


def recur(gru: nn.GRU, x, h: torch.Tensor | None = None):
    """Run a GRU in fp32 even under autocast. CUDA autocast runs RNNs in fp16 whatever dtype
    was asked for, and a bf16 run has no GradScaler: the small gradients of a long recurrence
    would underflow in fp16. The recurrence is a small share of the model's work, so the rest
    keeps the autocast dtype and only this part pays fp32."""
    device = (x.data if isinstance(x, PackedSequence) else x).device.type
    with torch.autocast(device, enabled=False):
        if not isinstance(x, PackedSequence):
            x = x.float()
        return gru(x, None if h is None else h.float())
