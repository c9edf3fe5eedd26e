"""Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017 sec. 5.4)."""
from __future__ import annotations

import torch


def label_smoothed_nll(lprobs: torch.Tensor, target: torch.Tensor, eps: float,
                       pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
