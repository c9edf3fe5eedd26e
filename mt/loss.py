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


class _SmoothedCrossEntropy(torch.autograd.Function):
    """label_smoothed_nll(log_softmax(logits), ...) for rows that all count, fused: the
    log-probabilities live only inside forward and no one-hot target is built, so memory holds
    one (N, V) tensor (the logits) and backward is one softmax written in place."""

    @staticmethod
    def forward(ctx, logits, target, eps):
        v = logits.shape[-1]
        lprobs = torch.log_softmax(logits, dim=-1)                    # (N, V), freed on return
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        if eps > 0.0:
            others = -lprobs.sum(-1) - nll                            # sum_{j != y} -log p_j
            loss = (1.0 - eps) * nll + eps / (v - 1) * others
        else:
            loss = nll
        ctx.save_for_backward(logits, target)
        ctx.eps = eps
        return loss.sum(), nll.sum()

    @staticmethod
    def backward(ctx, g_loss, g_nll):
        logits, target = ctx.saved_tensors
        eps, v = ctx.eps, logits.shape[-1]
        # d loss/d z = softmax - q with q = eps/(V-1) + (1 - eps - eps/(V-1)) * onehot(y);
        # d nll/d z  = softmax - onehot(y).
        grad = torch.softmax(logits, dim=-1).mul_(g_loss + g_nll)
        if eps > 0.0:
            grad.sub_(g_loss * (eps / (v - 1)))
        on_target = -(g_loss * (1.0 - eps - eps / (v - 1)) + g_nll)
        grad.scatter_add_(-1, target.unsqueeze(-1),
                          on_target.expand(target.shape[0], 1).to(grad.dtype))
        return grad, None, None


def smoothed_cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: (N, V) for N target tokens that all count (padding already removed).
    Returns (smoothed loss sum, NLL sum); same values and gradients as label_smoothed_nll."""
    if logits.dtype in (torch.float16, torch.bfloat16):   # softmax sums need fp32
        logits = logits.float()
    return _SmoothedCrossEntropy.apply(logits, target, eps)
