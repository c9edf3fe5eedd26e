"""Label-smoothed cross-entropy (mt.loss): the pure function and the training loss."""
import torch
import torch.nn.functional as F

from mt.loss import label_smoothed_nll
from mt.tokens import PAD


def _inputs(n=12, v=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    lprobs = torch.log_softmax(torch.randn(n, v, generator=g), -1)
    target = torch.randint(1, v, (n,), generator=g)
    target[[2, 7]] = PAD
    return lprobs, target


def test_eps_zero_is_plain_nll():
    lprobs, target = _inputs()
    loss, nll, n = label_smoothed_nll(lprobs, target, 0.0, PAD)
    expected = F.nll_loss(lprobs, target, ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, expected)
    assert int(n) == 10


def test_smoothed_loss_is_cross_entropy_with_the_smoothed_distribution():
    lprobs, target = _inputs()
    eps, v = 0.1, lprobs.shape[1]
    q = torch.full_like(lprobs, eps / (v - 1))
    q.scatter_(1, target[:, None], 1 - eps)
    keep = target != PAD
    expected = -(q * lprobs).sum(1)[keep].sum()
    loss, nll, _ = label_smoothed_nll(lprobs, target, eps, PAD)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, F.nll_loss(lprobs, target, ignore_index=PAD, reduction="sum"))


def test_padding_counts_for_nothing():
    lprobs, target = _inputs()
    loss_all, _, _ = label_smoothed_nll(lprobs, target, 0.1, PAD)
    keep = target != PAD
    loss_kept, _, _ = label_smoothed_nll(lprobs[keep], target[keep], 0.1, PAD)
    torch.testing.assert_close(loss_all, loss_kept)
