"""Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017 sec. 5.4)."""

from __future__ import annotations

import torch

from mt.tokens import PAD


def label_smoothed_nll(
    lprobs: torch.Tensor, target: torch.Tensor, eps: float, pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lprobs: (N, V) log-probabilities; target: (N,) ids.

    The smoothed target puts 1 - eps on the true class and spreads eps evenly over the V - 1
    other classes, so loss = (1 - eps) * nll + eps / (V - 1) * sum_{j != y} -log p_j.
    Positions whose target is `pad` count for nothing.
    Returns (smoothed loss sum, plain NLL sum, number of counted tokens): the NLL is what
    perplexity is computed from, since the smoothed loss is not a likelihood.
    """
    keep = target != pad
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (N,)
    nll = nll.masked_fill(~keep, 0.0)
    if eps > 0.0:
        others = -lprobs.sum(-1).masked_fill(~keep, 0.0) - nll  # sum over j != y of -log p_j
        loss = (1.0 - eps) * nll + eps / (lprobs.shape[-1] - 1) * others
    else:
        loss = nll
    return loss.sum(), nll.sum(), keep.sum()


def flat_lprobs(logits: torch.Tensor) -> torch.Tensor:
    """(..., V) logits -> (N, V) log-probabilities, in fp32 also under autocast."""
    return torch.log_softmax(logits.float(), dim=-1).view(-1, logits.shape[-1])


def logits_loss(
    logits: torch.Tensor, target: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(smoothed loss sum, NLL sum) of logits (..., V) against target (...), PAD not scored."""
    loss, nll, _ = label_smoothed_nll(flat_lprobs(logits), target.reshape(-1), eps, PAD)
    return loss, nll


def reference_loss(model, batch, eps: float, layout=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The training loss of a batch as the paper computes it: logits for every target
    position, log-softmax (in fp32, also under autocast), label-smoothed NLL over the tokens
    that are not padding. Returns (smoothed loss sum, NLL sum) over the batch's target tokens.
    A packed batch (train.pack_width) hands the model its own masks and positions, dense, or
    those `layout` makes of its Packing (FlexAttention's block masks: mt/fast/flex.py)."""
    if batch.packing is None:
        logits = model(batch.src, batch.tgt_in, batch.src_pad_mask)
    else:
        laid = batch.packing.layout() if layout is None else layout(batch.packing)
        logits = model.project(model.laid_out(batch.src, batch.tgt_in, laid))
    return logits_loss(logits, batch.tgt_out, eps)


def symmetric_kl(
    lprobs_a: torch.Tensor, lprobs_b: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """sum over the kept positions of (KL(a || b) + KL(b || a)) / 2, from log-probabilities
    (N, V) of the same targets: R-Drop's regulariser (Liang et al. 2021, eq. 2)."""
    pa, pb = lprobs_a.exp(), lprobs_b.exp()
    per_position = (pa * (lprobs_a - lprobs_b)).sum(-1) + (pb * (lprobs_b - lprobs_a)).sum(-1)
    return (per_position * keep).sum() / 2


def rdrop_loss(model, batch, eps: float, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """R-Drop (Liang et al., NeurIPS 2021): the batch goes through the model twice, with two
    different dropout masks; the loss is the mean of the two passes' label-smoothed losses
    plus alpha times the symmetric KL between their predictions (summed over target tokens,
    like the loss). The mean keeps the loss on the plain loss's scale, so alpha 0 trains as
    without R-Drop (with the gradient of two masks). In evaluation the passes are equal: the
    plain loss."""
    if not model.training:
        return reference_loss(model, batch, eps)
    v_target = batch.tgt_out.reshape(-1)
    keep = (v_target != PAD).to(torch.float32)
    passes = []
    for _ in range(2):
        passes.append(flat_lprobs(model(batch.src, batch.tgt_in, batch.src_pad_mask)))
    (loss_a, nll_a, _), (loss_b, nll_b, _) = (
        label_smoothed_nll(lp, v_target, eps, PAD) for lp in passes
    )
    kl = symmetric_kl(passes[0], passes[1], keep)
    return (loss_a + loss_b) / 2 + alpha * kl, (nll_a + nll_b) / 2
