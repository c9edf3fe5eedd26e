"""The learning-rate schedule (Noam) and mt's Adam: pure functions and their torch twins."""

import itertools
import math

import pytest
import torch

from mt.train.update.schedule import noam


@pytest.mark.parametrize(
    "step,expected",
    [
        (1, 512**-0.5 * 4000**-1.5),
        (4000, 512**-0.5 * 4000**-0.5),  # the peak, at the end of warm-up
        (16000, 512**-0.5 * 16000**-0.5),  # inverse square-root decay
    ],
)
def test_noam_known_values(step, expected):
    assert noam(step, 512, 4000) == pytest.approx(expected)


def test_noam_shape_and_factor():
    lrs = [noam(s, 256, 100, 2.0) for s in range(1, 400)]
    assert max(lrs) == lrs[99]  # peak at step == warmup
    assert all(a < b for a, b in itertools.pairwise(lrs[:100]))  # linear warm-up
    assert all(a > b for a, b in itertools.pairwise(lrs[100:]))  # then decays
    assert lrs[99] == pytest.approx(2.0 * 256**-0.5 * 100**-0.5)
    assert noam(50, 256, 100) == pytest.approx(math.sqrt(1 / 256) * 50 * 100**-1.5)


def test_scheduler_gives_noam_of_the_update_number():
    from types import SimpleNamespace

    from mt.train.update.schedule import build_optimizer

    cfg = SimpleNamespace(
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_eps=1e-9,
        weight_decay=0.0,
        warmup=10,
        lr_factor=1.0,
        cooldown=0.0,
    )
    p = torch.nn.Parameter(torch.zeros(1))
    opt, sched = build_optimizer([p], cfg, 64)
    for update in range(1, 25):
        assert opt.param_groups[0]["lr"] == pytest.approx(noam(update, 64, 10))
        opt.step()
        sched.step()


def _adam_pair(weight_decay):
    from mt.train.update.optim import Adam

    g = torch.Generator().manual_seed(3)
    shapes = [(5, 4), (4,), (3, 5)]
    init = [torch.randn(s, generator=g) for s in shapes]
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(6)]
    ours = [torch.nn.Parameter(x.clone()) for x in init]
    theirs = [torch.nn.Parameter(x.clone()) for x in init]
    kw = {"betas": (0.9, 0.98), "eps": 1e-9, "weight_decay": weight_decay}
    ref = torch.optim.Adam(theirs, lr=0.01, **kw)
    return (ours, Adam(ours, lr=0.01, **kw)), (theirs, ref), grads


def _adam_steps(pairs, grads):
    for step_grads in grads:
        for params, opt in pairs:
            for p, gr in zip(params, step_grads, strict=True):
                p.grad = gr.clone()
            opt.step()
            opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adam_is_torch_adam_and_their_states_are_interchangeable(weight_decay):
    """mt's Adam (no torch.optim.Optimizer, hence no torch._dynamo import) takes the same
    steps as torch.optim.Adam, and either one resumes from the other's state_dict."""
    (ours, opt), (theirs, ref), grads = _adam_pair(weight_decay)
    _adam_steps([(ours, opt), (theirs, ref)], grads[:3])
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert not torch.equal(ours[0], _adam_pair(weight_decay)[0][0][0])  # it did move
    # swap: each continues from the other's state (moments and step count)
    mine, torch_state = opt.state_dict(), ref.state_dict()
    opt.load_state_dict(torch_state)
    ref.load_state_dict(mine)
    _adam_steps([(ours, opt), (theirs, ref)], grads[3:])
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert [s["step"].item() for s in opt.state_dict()["state"].values()] == [6.0] * 3


def test_adam_builds_its_lists_once_while_the_gradients_stay_the_same_tensors(monkeypatch):
    """Gradients written in place into the same tensors (the trainer's flat buffers): the
    kernel's lists are built at the first step only, and the steps are still torch's."""
    (ours, opt), (theirs, ref), grads = _adam_pair(0.0)
    built = []
    real = opt._group_lists
    monkeypatch.setattr(opt, "_group_lists", lambda params: built.append(1) or real(params))
    for params in (ours, theirs):
        for p in params:
            p.grad = torch.zeros_like(p)
    for step_grads in grads:
        for params, o in ((ours, opt), (theirs, ref)):
            for p, gr in zip(params, step_grads, strict=True):
                p.grad.copy_(gr)
            o.step()
    assert built == [1]
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_grad_scaler_drives_mt_adam():
    """fp16 training (GPU) steps mt's Adam through GradScaler: unscaled gradients, a skipped
    update and a halved scale on inf. Checked on CPU, where GradScaler works the same."""
    from mt.train.update.optim import Adam

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    opt = Adam(lin.parameters(), lr=0.1, betas=(0.9, 0.98), eps=1e-9)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x = torch.randn(3, 4)
    scaler.scale(lin(x).sum()).backward()
    scaler.unscale_(opt)
    torch.testing.assert_close(lin.bias.grad, torch.full((4,), 3.0))  # d sum / d bias = 3
    before = lin.weight.detach().clone()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(before, lin.weight)
    opt.zero_grad()
    (scaler.scale(lin(x).sum()) * float("inf")).backward()
    before = lin.weight.detach().clone()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(before, lin.weight) and scaler.get_scale() == 512.0


def test_adam_refuses_a_state_for_other_parameters():
    from mt.train.update.optim import Adam

    opt = Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1, betas=(0.9, 0.98), eps=1e-9)
    other = Adam(
        [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))],
        lr=0.1,
        betas=(0.9, 0.98),
        eps=1e-9,
    )
    with pytest.raises(ValueError, match="2 parameters"):
        opt.load_state_dict(other.state_dict())


def test_noam_resumes_from_a_lambdalr_state():
    """Checkpoints written with torch's LambdaLR (before mt's Noam) resume at the same lr."""
    from types import SimpleNamespace

    from mt.train.update.schedule import build_optimizer

    cfg = SimpleNamespace(
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_eps=1e-9,
        weight_decay=0.0,
        warmup=10,
        lr_factor=2.0,
        cooldown=0.0,
    )
    p = torch.nn.Parameter(torch.zeros(1))
    ref_opt = torch.optim.Adam([p], lr=1.0)
    ref = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda k: noam(k + 1, 64, 10, 2.0))
    for _ in range(13):
        ref_opt.step()
        ref.step()
    opt, sched = build_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg, 64)
    sched.load_state_dict(ref.state_dict())
    assert sched.get_last_lr() == pytest.approx(ref.get_last_lr())
    assert opt.param_groups[0]["lr"] == pytest.approx(noam(14, 64, 10, 2.0))


def test_budget_progress_is_the_larger_share_of_steps_and_clock():
    from mt.train.update.schedule import budget_progress

    assert budget_progress(250, 9999.0, 1000, 0.0) == 0.25  # no time budget: steps only
    assert budget_progress(250, 60.0 * 5, 1000, 10.0) == 0.5  # the clock is further on
    assert budget_progress(900, 60.0 * 5, 1000, 10.0) == 0.9  # the steps are
    assert budget_progress(10, 60.0 * 30, 1000, 10.0) == 1.0  # never past the end


def test_cooldown_is_flat_then_a_straight_line_to_zero():
    from mt.train.update.schedule import cooldown_scale

    assert cooldown_scale(0.99, 0.0) == 1.0  # off
    assert [cooldown_scale(p, 0.2) for p in (0.0, 0.5, 0.8)] == pytest.approx([1.0, 1.0, 1.0])
    assert cooldown_scale(0.9, 0.2) == pytest.approx(0.5)
    assert cooldown_scale(0.95, 0.2) == pytest.approx(0.25)
    assert cooldown_scale(1.0, 0.2) == 0.0
    assert cooldown_scale(1.0, 1.0) == 0.0 and cooldown_scale(0.0, 1.0) == 1.0


def test_noam_with_cooldown_scales_the_update_rate_and_resumes_with_it():
    from types import SimpleNamespace

    from mt.train.update.schedule import build_optimizer, cooldown_scale

    cfg = SimpleNamespace(
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_eps=1e-9,
        weight_decay=0.0,
        warmup=10,
        lr_factor=1.0,
        cooldown=0.5,
    )
    opt, sched = build_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg, 64)
    for update in range(1, 20):
        sched.step()
        sched.set_progress(update / 20)
        lr = noam(update + 1, 64, 10) * cooldown_scale(update / 20, 0.5)
        assert opt.param_groups[0]["lr"] == pytest.approx(lr)
    assert sched.scale == pytest.approx(0.1)
    opt2, sched2 = build_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg, 64)
    sched2.load_state_dict(sched.state_dict())  # a resumed run goes on at the same lr
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    sched2.load_state_dict({"last_epoch": 19})  # a checkpoint from before cool-down
    assert opt2.param_groups[0]["lr"] == pytest.approx(noam(20, 64, 10))
