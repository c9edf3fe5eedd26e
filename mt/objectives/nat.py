"""Training of the non-autoregressive model (model.arch: nat, mt/model/nat.py), after
Mask-Predict (Ghazvininejad et al. 2019); its decoding is mt/decode/mask_predict.py.

Training: for each target, a number n is drawn uniformly from 1 .. its length and n of its
tokens are hidden behind the mask token; the decoder predicts them (label-smoothed
cross-entropy over the hidden positions), and the length predictor learns the target length
(cross-entropy, weight 0.1 as in fairseq's cmlm).
"""

from __future__ import annotations

import torch

from mt.data.batching import Batch
from mt.objectives.loss import logits_loss
from mt.tokens import EOS, MASK, PAD

LENGTH_LOSS_WEIGHT = 0.1


def targets_of(batch: Batch) -> torch.Tensor:
    """The target tokens alone (B, T): tgt_out without its EOS, padded with PAD."""
    return batch.tgt_out.masked_fill(batch.tgt_out == EOS, PAD)


def mask_for_training(tokens: torch.Tensor, generator=None) -> torch.Tensor:
    """(B, T) bool: which tokens to hide. Per sentence, n ~ Uniform{1..length} of its real
    positions, chosen uniformly at random."""
    real = tokens != PAD
    lengths = real.sum(1)  # (B,)
    n = (
        torch.rand(lengths.shape, generator=generator, device=tokens.device) * lengths
    ).long() + 1  # 1 .. length
    scores = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    scores = scores.masked_fill(~real, 2.0)  # padding never among the lowest
    ranks = scores.argsort(1).argsort(1)  # rank of each position's score
    return (ranks < n[:, None]) & real


def nat_loss(model, batch: Batch, eps: float, generator=None):
    """(loss, nll) summed over the hidden target tokens, plus the weighted length loss."""
    tokens = targets_of(batch)
    return _loss_of(model, batch, tokens, mask_for_training(tokens, generator), eps)


def nat_valid_loss(model, batch: Batch, index: int, eps: float):
    """The validation loss: nat_loss with masks drawn from a generator seeded by the batch's
    position in the valid split alone, so every validation scores the same hidden tokens,
    and their count (loss sum, NLL sum, hidden tokens): the NLL is per predicted token, not
    per target token (most of which the model was shown)."""
    tokens = targets_of(batch)
    generator = torch.Generator().manual_seed(index)
    hidden = mask_for_training(tokens.cpu(), generator).to(tokens.device)
    loss, nll = _loss_of(model, batch, tokens, hidden, eps)
    return loss, nll, int(hidden.sum())


def _loss_of(model, batch: Batch, tokens: torch.Tensor, hidden: torch.Tensor, eps: float):
    inputs = tokens.masked_fill(hidden, MASK)
    memory = model.encode(batch.src, batch.src_pad_mask)
    logits = model.project(model.decode(inputs, memory, batch.src_pad_mask))  # (B, T, V)
    loss, nll = logits_loss(logits, tokens.masked_fill(~hidden, PAD), eps)  # hidden only
    length_logits = model.predict_length(memory, batch.src_pad_mask).float()
    lengths = (tokens != PAD).sum(1).clamp(max=length_logits.shape[-1] - 1)
    length_loss = torch.nn.functional.cross_entropy(length_logits, lengths, reduction="sum")
    # the length loss is per sentence; scaled to the tokens' sum as fairseq's cmlm does
    return loss + LENGTH_LOSS_WEIGHT * length_loss * hidden.sum() / len(lengths), nll
