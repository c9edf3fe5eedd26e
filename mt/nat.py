"""Training and decoding of the non-autoregressive model (model.arch: nat, mt/model/nat.py),
after Mask-Predict (Ghazvininejad et al. 2019).

Training: for each target, a number n is drawn uniformly from 1 .. its length and n of its
tokens are hidden behind the mask token; the decoder predicts them (label-smoothed
cross-entropy over the hidden positions), and the length predictor learns the target length
(cross-entropy, weight 0.1 as in fairseq's cmlm).

Decoding: the `length_beam` most likely lengths are each filled entirely in one parallel pass;
then for T iterations the least confident tokens are masked again (n = L * (T - t) / T of
them) and predicted again; the candidate with the best mean log-probability wins. With T = 1
it is a single parallel pass (Gu et al. 2018's fully non-autoregressive decoding).
"""
from __future__ import annotations

import torch

from mt.data.batching import Batch
from mt.loss import logits_loss
from mt.tokens import BOS, EOS, PAD, UNK

MASK = UNK                       # as in masked-LM pretraining: <unk> never occurs in text
LENGTH_LOSS_WEIGHT = 0.1
BANNED = [PAD, UNK, BOS, EOS]    # never produced inside a target of known length


def targets_of(batch: Batch) -> torch.Tensor:
    """The target tokens alone (B, T): tgt_out without its EOS, padded with PAD."""
    return batch.tgt_out.masked_fill(batch.tgt_out == EOS, PAD)


def mask_for_training(tokens: torch.Tensor, generator=None) -> torch.Tensor:
    """(B, T) bool: which tokens to hide. Per sentence, n ~ Uniform{1..length} of its real
    positions, chosen uniformly at random."""
    real = tokens != PAD
    lengths = real.sum(1)                                                   # (B,)
    n = (torch.rand(lengths.shape, generator=generator, device=tokens.device)
         * lengths).long() + 1                                              # 1 .. length
    scores = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    scores = scores.masked_fill(~real, 2.0)                 # padding never among the lowest
    ranks = scores.argsort(1).argsort(1)                    # rank of each position's score
    return (ranks < n[:, None]) & real


def nat_loss(model, batch: Batch, eps: float, generator=None):
    """(loss, nll) summed over the hidden target tokens, plus the weighted length loss."""
    tokens = targets_of(batch)
    hidden = mask_for_training(tokens, generator)
    inputs = tokens.masked_fill(hidden, MASK)
    memory = model.encode(batch.src, batch.src_pad_mask)
    logits = model.project(model.decode(inputs, memory, batch.src_pad_mask))   # (B, T, V)
    loss, nll = logits_loss(logits, tokens.masked_fill(~hidden, PAD), eps)   # hidden only
    length_logits = model.predict_length(memory, batch.src_pad_mask).float()
    lengths = (tokens != PAD).sum(1).clamp(max=length_logits.shape[-1] - 1)
    length_loss = torch.nn.functional.cross_entropy(length_logits, lengths, reduction="sum")
    # the length loss is per sentence; scaled to the tokens' sum as fairseq's cmlm does
    return loss + LENGTH_LOSS_WEIGHT * length_loss * hidden.sum() / len(lengths), nll


def _candidates(model, memory, src_pad_mask, length_beam: int, max_len: int):
    """The `length_beam` most likely lengths (>= 1) of each sentence: (B * l,) lengths and
    the memory and mask repeated for them."""
    logits = model.predict_length(memory, src_pad_mask)[:, 1:max_len + 1]       # lengths >= 1
    lengths = logits.topk(min(length_beam, logits.shape[-1]), -1).indices + 1   # (B, l)
    k = lengths.shape[1]
    return (lengths.reshape(-1), memory.repeat_interleave(k, 0),
            src_pad_mask.repeat_interleave(k, 0), k)


@torch.no_grad()
def mask_predict(model, src: torch.Tensor, src_pad_mask: torch.Tensor, iterations: int = 10,
                 length_beam: int = 3, max_len: int | None = None) -> list[list[int]]:
    """Per sentence the best candidate's token ids (see the module's docstring)."""
    b = src.shape[0]
    memory = model.encode(src, src_pad_mask)
    max_len = min(max_len or model.max_positions - 1, model.max_positions - 1)
    lengths, memory, mask, k = _candidates(model, memory, src_pad_mask, length_beam, max_len)
    width = int(lengths.max())
    real = torch.arange(width, device=src.device)[None, :] < lengths[:, None]      # (N, T)
    tokens = torch.full(real.shape, MASK, device=src.device).masked_fill(~real, PAD)
    probs = torch.zeros(real.shape, device=src.device)
    for it in range(iterations):
        hidden = tokens == MASK
        logits = model.project(model.decode(tokens, memory, mask)).float()
        lprobs = torch.log_softmax(logits, -1)
        lprobs[..., BANNED] = -float("inf")
        best_p, best_tok = lprobs.max(-1)                                    # (N, T)
        tokens = torch.where(hidden, best_tok, tokens)
        probs = torch.where(hidden, best_p, probs)
        if it == iterations - 1:
            break
        n_mask = (lengths.float() * (iterations - 1 - it) / iterations).long()  # (N,)
        order = probs.masked_fill(~real, float("inf")).argsort(1)   # least confident first
        remask = torch.zeros_like(real).scatter_(
            1, order, torch.arange(width, device=src.device).expand_as(order) < n_mask[:, None])
        tokens = tokens.masked_fill(remask & real, MASK)
    score = (probs * real).sum(1) / lengths                        # mean log-probability
    best = score.view(b, k).argmax(1)
    rows = torch.arange(b, device=src.device) * k + best
    return [tokens[r, :int(lengths[r])].tolist() for r in rows.tolist()]
