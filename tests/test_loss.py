"""Label-smoothed cross-entropy (mt.objectives.loss): the pure function and the training loss."""

import torch
import torch.nn.functional as F

from mt.objectives.loss import label_smoothed_nll
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


def _model_and_batch(dropout: float):
    from mt.config import ModelConfig
    from mt.data.batching import Batch
    from mt.model import build_model

    torch.manual_seed(0)
    model = build_model(
        ModelConfig(
            d_model=32,
            n_heads=4,
            enc_layers=1,
            dec_layers=1,
            d_ff=64,
            dropout=dropout,
            attn_dropout=dropout,
        ),
        20,
        20,
    ).train()
    src = torch.randint(4, 20, (3, 6))
    src[1, 4:] = PAD
    tgt = torch.randint(4, 20, (3, 7))
    tgt[2, 5:] = PAD
    return model, Batch(src, tgt[:, :-1], tgt[:, 1:], int((tgt[:, 1:] != PAD).sum()))


def test_rdrop_with_identical_passes_is_the_plain_loss_and_alpha_scales_only_the_kl():
    """Without dropout both passes are the same: the KL term is zero, so for any alpha the
    R-Drop loss and its gradients are the plain loss's."""
    from mt.objectives.loss import rdrop_loss, reference_loss

    model, batch = _model_and_batch(0.0)
    plain, plain_nll = reference_loss(model, batch, 0.1)
    plain.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    for alpha in (0.0, 5.0):
        model.zero_grad()
        loss, nll = rdrop_loss(model, batch, 0.1, alpha)
        loss.backward()
        torch.testing.assert_close(loss, plain)
        torch.testing.assert_close(nll, plain_nll)
        for g, r in zip((p.grad for p in model.parameters()), ref_grads, strict=True):
            torch.testing.assert_close(g, r)


def test_rdrop_alpha_zero_is_the_mean_of_two_plain_passes():
    """With dropout, alpha 0 gives the mean of the plain losses of the two masks it drew."""
    from mt.objectives.loss import rdrop_loss, reference_loss

    model, batch = _model_and_batch(0.3)
    torch.manual_seed(7)
    first, second = reference_loss(model, batch, 0.1)[0], reference_loss(model, batch, 0.1)[0]
    torch.manual_seed(7)
    loss, _ = rdrop_loss(model, batch, 0.1, 0.0)
    torch.testing.assert_close(loss, (first + second) / 2)
    torch.manual_seed(7)
    assert rdrop_loss(model, batch, 0.1, 1.0)[0] > loss  # the two masks disagree


def test_symmetric_kl_is_symmetric_zero_for_equal_and_ignores_padding():
    from mt.objectives.loss import symmetric_kl

    g = torch.Generator().manual_seed(0)
    a = torch.log_softmax(torch.randn(5, 9, generator=g), -1)
    b = torch.log_softmax(torch.randn(5, 9, generator=g), -1)
    keep = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])
    torch.testing.assert_close(symmetric_kl(a, b, keep), symmetric_kl(b, a, keep))
    assert float(symmetric_kl(a, a, keep)) == 0.0
    assert float(symmetric_kl(a, b, keep)) > 0.0
    c = b.clone()
    c[2] = torch.log_softmax(torch.randn(9, generator=g), -1)  # only a padding row differs
    torch.testing.assert_close(symmetric_kl(a, b, keep), symmetric_kl(a, c, keep))
    # the formula itself: (KL(a||b) + KL(b||a)) / 2 over kept rows, with torch's kl_div
    kl_ab = F.kl_div(b, a, log_target=True, reduction="none").sum(-1)
    kl_ba = F.kl_div(a, b, log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(symmetric_kl(a, b, keep), ((kl_ab + kl_ba) * keep).sum() / 2)
