"""How likely a model finds given translations (`mt score`): each target read by teacher
forcing, the log-probability of each of its subwords and of the end of sentence summed. The
same log-probabilities search takes (the output layer and log-softmax in fp32; an ensemble's
the mean of its models'), so a hypothesis of beam search scored here gets the score the beam
gave it: the sum over (tokens + 1) ** length_penalty. Uses: reranking n-best lists, filtering
a corpus by cross-entropy, contrastive test sets."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from mt.data.batching import pad_sources, token_batches
from mt.decode.search import normalised_score
from mt.decode.translator import Translator
from mt.runtime.device import autocast
from mt.tokens import BOS, EOS, PAD


@dataclass(frozen=True)
class Scored:
    """One pair's score: `logprob`, the sum over the target's `tokens` (its subwords and the
    end of sentence), and what follows from them."""

    logprob: float
    tokens: int

    @property
    def per_token(self) -> float:
        return self.logprob / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(-self.per_token)

    def normalised(self, length_penalty: float) -> float:
        """The beam's score: logprob / tokens ** length_penalty, as search computes it (a
        penalty beyond a float's range underflows to 0 instead of overflowing)."""
        return normalised_score(self.logprob, self.tokens, length_penalty)[0]


def score_pairs(translator: Translator, sources: list[str], targets: list[str]) -> list[Scored]:
    """Each (source, target) pair's Scored, in their order; the sources read as translation
    reads them (the run's text form, cut at what the model reads), the targets as training
    reads them. An empty target scores its end of sentence alone."""
    translator.tokenizer.check_sources(sources)
    src_ids = translator.source_ids(sources)
    tgt_ids = translator.tokenizer.encode_tgt(translator.text.targets(targets))
    limit = translator.model.max_positions - 1
    tgt_ids = [ids[:limit] for ids in tgt_ids]
    src_lens = np.array([len(x) + 1 for x in src_ids], dtype=np.int64)
    tgt_lens = np.array([len(x) + 1 for x in tgt_ids], dtype=np.int64)
    out: list[Scored | None] = [None] * len(sources)
    for batch in token_batches(src_lens, tgt_lens, translator.cfg.max_tokens, seed=None):
        sums = _teacher_forced(translator, [src_ids[i] for i in batch], [tgt_ids[i] for i in batch])
        for i, total in zip(batch, sums, strict=True):
            out[i] = Scored(total, len(tgt_ids[i]) + 1)
    return [s for s in out if s is not None]


@torch.inference_mode()
def _teacher_forced(translator: Translator, src: list, tgt: list) -> list[float]:
    """The summed log-probability of each target (its subwords, then EOS) given its source."""
    model, device = translator.model, translator.device
    source = pad_sources([np.asarray(x, dtype=np.int64) for x in src]).to(device)
    width = max(len(x) for x in tgt) + 1
    tgt_in = torch.full((len(tgt), width), PAD, dtype=torch.long)
    tgt_out = torch.full((len(tgt), width), PAD, dtype=torch.long)
    for b, ids in enumerate(tgt):
        tgt_in[b, : len(ids) + 1] = torch.tensor([BOS, *ids])
        tgt_out[b, : len(ids) + 1] = torch.tensor([*ids, EOS])
    tgt_in, tgt_out = tgt_in.to(device), tgt_out.to(device)
    mask = source == PAD
    with autocast(device, translator.amp_dtype):
        h = model.decode(tgt_in, model.encode(source, mask), mask)  # (B, T, D)
    with torch.autocast(device.type, enabled=False):  # (as search: fp32 output layer)
        lprobs = torch.log_softmax(model.project(h.float()), dim=-1)  # (B, T, V)
    picked = lprobs.gather(-1, tgt_out[..., None])[..., 0].masked_fill(tgt_out == PAD, 0.0)
    return picked.double().sum(-1).tolist()
