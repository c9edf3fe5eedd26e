import math

import pytest
import torch
import torch.nn.functional as F

from mt.loss import label_smoothed_nll
from mt.schedule import noam

PAD = 0


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


@pytest.mark.parametrize("step,expected", [
    (1, 512 ** -0.5 * 4000 ** -1.5),
    (4000, 512 ** -0.5 * 4000 ** -0.5),       # the peak, at the end of warm-up
    (16000, 512 ** -0.5 * 16000 ** -0.5),     # inverse square-root decay
])
def test_noam_known_values(step, expected):
    assert noam(step, 512, 4000) == pytest.approx(expected)


def test_noam_shape_and_factor():
    lrs = [noam(s, 256, 100, 2.0) for s in range(1, 400)]
    assert max(lrs) == lrs[99]                                   # peak at step == warmup
    assert all(a < b for a, b in zip(lrs[:99], lrs[1:100]))      # linear warm-up
    assert all(a > b for a, b in zip(lrs[100:], lrs[101:]))      # then decays
    assert lrs[99] == pytest.approx(2.0 * 256 ** -0.5 * 100 ** -0.5)
    assert noam(50, 256, 100) == pytest.approx(math.sqrt(1 / 256) * 50 * 100 ** -1.5)


def test_scheduler_gives_noam_of_the_update_number():
    from types import SimpleNamespace
    from mt.schedule import build_optimizer
    cfg = SimpleNamespace(adam_beta1=0.9, adam_beta2=0.98, adam_eps=1e-9, weight_decay=0.0,
                          warmup=10, lr_factor=1.0)
    p = torch.nn.Parameter(torch.zeros(1))
    opt, sched = build_optimizer([p], cfg, 64)
    for update in range(1, 25):
        assert opt.param_groups[0]["lr"] == pytest.approx(noam(update, 64, 10))
        opt.step()
        sched.step()


def _adam_pair(weight_decay):
    from mt.schedule import Adam
    g = torch.Generator().manual_seed(3)
    shapes = [(5, 4), (4,), (3, 5)]
    init = [torch.randn(s, generator=g) for s in shapes]
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(6)]
    ours = [torch.nn.Parameter(x.clone()) for x in init]
    theirs = [torch.nn.Parameter(x.clone()) for x in init]
    kw = dict(betas=(0.9, 0.98), eps=1e-9, weight_decay=weight_decay)
    ref = torch.optim.Adam(theirs, lr=0.01, **kw)
    return (ours, Adam(ours, lr=0.01, **kw)), (theirs, ref), grads


def _adam_steps(pairs, grads):
    for step_grads in grads:
        for params, opt in pairs:
            for p, gr in zip(params, step_grads):
                p.grad = gr.clone()
            opt.step()
            opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adam_is_torch_adam_and_their_states_are_interchangeable(weight_decay):
    """mt's Adam (no torch.optim.Optimizer, hence no torch._dynamo import) takes the same
    steps as torch.optim.Adam, and either one resumes from the other's state_dict."""
    (ours, opt), (theirs, ref), grads = _adam_pair(weight_decay)
    _adam_steps([(ours, opt), (theirs, ref)], grads[:3])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert not torch.equal(ours[0], _adam_pair(weight_decay)[0][0][0])    # it did move
    # swap: each continues from the other's state (moments and step count)
    mine, torch_state = opt.state_dict(), ref.state_dict()
    opt.load_state_dict(torch_state)
    ref.load_state_dict(mine)
    _adam_steps([(ours, opt), (theirs, ref)], grads[3:])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert [s["step"].item() for s in opt.state_dict()["state"].values()] == [6.0] * 3


def test_grad_scaler_drives_mt_adam():
    """fp16 training (GPU) steps mt's Adam through GradScaler: unscaled gradients, a skipped
    update and a halved scale on inf. Checked on CPU, where GradScaler works the same."""
    from mt.schedule import Adam
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    opt = Adam(lin.parameters(), lr=0.1, betas=(0.9, 0.98), eps=1e-9)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x = torch.randn(3, 4)
    scaler.scale(lin(x).sum()).backward()
    scaler.unscale_(opt)
    torch.testing.assert_close(lin.bias.grad, torch.full((4,), 3.0))   # d sum / d bias = 3
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
    from mt.schedule import Adam
    opt = Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1, betas=(0.9, 0.98), eps=1e-9)
    other = Adam([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))],
                 lr=0.1, betas=(0.9, 0.98), eps=1e-9)
    with pytest.raises(ValueError, match="2 parameters"):
        opt.load_state_dict(other.state_dict())


def test_noam_resumes_from_a_lambdalr_state():
    """Checkpoints written with torch's LambdaLR (before mt's Noam) resume at the same lr."""
    from types import SimpleNamespace
    from mt.schedule import build_optimizer
    cfg = SimpleNamespace(adam_beta1=0.9, adam_beta2=0.98, adam_eps=1e-9, weight_decay=0.0,
                          warmup=10, lr_factor=2.0)
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


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk", [7, 2048])
def test_fused_projection_and_loss_equal_the_reference_in_value_and_gradient(eps, chunk):
    """Chunked projection + smoothed CE = log_softmax(h W^T) + label_smoothed_nll, gradients
    for h and W included (W shared with the embedding, as when tied)."""
    from mt.loss import linear_smoothed_cross_entropy
    g = torch.Generator().manual_seed(1)
    h = torch.randn(20, 6, generator=g, dtype=torch.float64)
    w = torch.randn(11, 6, generator=g, dtype=torch.float64) * 2
    target = torch.randint(1, 11, (20,), generator=g)
    ha, wa = h.clone().requires_grad_(), w.clone().requires_grad_()
    hb, wb = h.clone().requires_grad_(), w.clone().requires_grad_()
    ref_loss, ref_nll, _ = label_smoothed_nll(torch.log_softmax(ha @ wa.t(), -1), target, eps, PAD)
    loss, nll = linear_smoothed_cross_entropy(hb, wb, target, eps, chunk=chunk)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(nll, ref_nll)
    (3.0 * ref_loss + wa.sum()).backward()
    (3.0 * loss + wb.sum()).backward()
    torch.testing.assert_close(hb.grad, ha.grad)
    torch.testing.assert_close(wb.grad, wa.grad)
    with torch.no_grad():       # validation: values only
        torch.testing.assert_close(linear_smoothed_cross_entropy(h, w, target, eps)[0], ref_loss.detach())


def test_fused_loss_chunk_defaults_to_the_module_constant(monkeypatch):
    """chunk=None takes mt.loss.LOSS_CHUNK_ROWS when called (what ab_train.py patches): the
    same sums, bit for bit, as that chunk given explicitly, and not those of another chunk."""
    from mt import loss as loss_mod
    g = torch.Generator().manual_seed(3)
    h, w = torch.randn(300, 16, generator=g), torch.randn(500, 16, generator=g)
    target = torch.randint(1, 500, (300,), generator=g)

    def grad_w(chunk):
        wg = w.clone().requires_grad_()
        loss_mod.linear_smoothed_cross_entropy(h, wg, target, 0.1, chunk=chunk)[0].backward()
        return wg.grad
    monkeypatch.setattr(loss_mod, "LOSS_CHUNK_ROWS", 64)
    assert torch.equal(grad_w(None), grad_w(64))
    assert not torch.equal(grad_w(None), grad_w(300))     # one chunk sums in another order


@pytest.mark.parametrize("spread", [1.0, 40.0])
def test_fused_loss_in_fp32_matches_fp64_also_when_target_probabilities_underflow(spread):
    """fp32 against the fp64 reference, with ordinary logits and with logits so spread out that
    many targets' probabilities underflow in fp32 (log p_y down to about -1000): the loss, the
    NLL and the gradients stay finite and right (those rows take logsumexp)."""
    from mt.loss import linear_smoothed_cross_entropy
    g = torch.Generator().manual_seed(2)
    h = torch.randn(300, 16, generator=g, dtype=torch.float64) * spread
    w = torch.randn(500, 16, generator=g, dtype=torch.float64)
    target = torch.randint(1, 500, (300,), generator=g)
    ref = [h.clone().requires_grad_(), w.clone().requires_grad_()]
    ref_loss, ref_nll, _ = label_smoothed_nll(torch.log_softmax(ref[0] @ ref[1].t(), -1),
                                              target, 0.1, PAD)
    ref_loss.backward()
    ours = [h.float().requires_grad_(), w.float().requires_grad_()]
    loss, nll = linear_smoothed_cross_entropy(*ours, target, 0.1, chunk=64)
    loss.backward()
    if spread > 1:
        logp = torch.log_softmax(h.float() @ w.float().t(), -1).gather(1, target[:, None])
        assert (logp < -104).float().mean() > 0.2     # below fp32's smallest subnormal
    torch.testing.assert_close(loss.double(), ref_loss.detach(), rtol=1e-5, atol=0)
    torch.testing.assert_close(nll.double(), ref_nll, rtol=1e-5, atol=0)
    for a, b in zip(ours, ref):            # fp32 sums of 300 rows: relative to the largest
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-3,
                                   atol=1e-5 * b.grad.abs().max().item())


@pytest.mark.parametrize("p, bits", [(0.1, 8), (0.3, 8), (0.01, 16), (0.03, 16)])
def test_fast_dropout_keeps_expected_fraction_and_scales(p, bits):
    """Elements are kept with probability 1 - p, p resolved to 1/256 only where that is within
    2% of p (else 1/65536), and scaled by exactly 1 / P(kept): the expectation is kept.
    Backward passes gradient through the kept elements only, with the same scale."""
    from mt.model.dropout import dropout, keep_mask, lane_bits
    assert lane_bits(p) == bits
    levels = 2 ** bits
    resolved = round(p * levels) / levels
    assert abs(resolved - p) <= 0.02 * p
    assert keep_mask((3,), p, torch.device("cpu")).scale * (1 - resolved) == pytest.approx(1.0)
    torch.manual_seed(0)
    x = torch.ones(400_000, requires_grad=True)
    y = dropout(x, p, training=True)
    kept = (y != 0).float().mean().item()
    assert abs(kept - (1 - resolved)) < 0.004
    assert torch.allclose(y[y != 0], torch.tensor(1 / (1 - resolved)))
    y.sum().backward()
    assert torch.equal(x.grad != 0, y != 0)
    assert torch.equal(x.grad, y.detach())
    assert dropout(x, p, training=False) is x


@pytest.mark.parametrize("p, lanes", [(0.3, 8), (0.01, 4)])
def test_dropout_mask_lanes_are_independent_and_any_shape_works(p, lanes):
    """Four (two) mask elements come from each 32-bit hash: each lane keeps 1 - p, neighbours
    are independent (both kept: (1 - p)^2), the mask comes out in the dtype asked for, and sizes
    that are not a multiple of the lanes per word work."""
    from mt.model.dropout import keep_mask
    torch.manual_seed(0)
    keep = keep_mask((100_003, lanes), p, torch.device("cpu"))
    mask = keep.of(torch.float32)
    assert mask.shape == (100_003, lanes) and mask.dtype == torch.float32
    assert keep.lanes.element_size() == 8 // lanes        # what backward keeps: 1 or 2 bytes
    assert set(mask.unique().tolist()) == {0.0, 1.0}
    for lane in range(lanes):
        assert abs(mask[:, lane].mean().item() - (1 - p)) < 0.01
    both = (mask[:, 0] * mask[:, 1]).mean().item()
    assert abs(both - (1 - p) ** 2) < 0.01
    last = (mask[:, 0] * mask[:, -1]).mean().item()
    assert abs(last - (1 - p) ** 2) < 0.01
    odd = keep_mask((7, 3), 0.5, torch.device("cpu"))
    assert odd.of(torch.float64).shape == (7, 3)


def _lowbias32_bytes(n: int, k1: int, k2: int) -> bytes:
    """The reference: lowbias32 of counter + k1, k2 mixed in, in Python's exact integers."""
    m = 2 ** 32
    out = bytearray()
    for i in range((n + 3) // 4):
        x = (i + k1) % m
        x ^= x >> 16
        x = x * 0x7FEB352D % m
        x ^= x >> 15
        x ^= k2 % m
        x = x * 0x846CA68B % m
        x ^= x >> 16
        out += x.to_bytes(4, "little")
    return bytes(out[:n])


def test_random_bytes_are_a_keyed_hash_drawn_from_torchs_generator():
    """The dropout lanes are lowbias32(counter + k1) with k2 between its rounds, computed with
    torch's int32 ops exactly as with exact integers mod 2^32 (where they wrap around); the
    keys come from torch's generator, so the same seed gives the same bytes and the next call
    other bytes; the byte values are uniform (chi-square over 256 bins) and neighbours are
    uncorrelated, also for a mask too large for the counters cached by a smaller one."""
    from mt.model.dropout import random_bytes
    cpu = torch.device("cpu")
    torch.manual_seed(3)
    k1, k2 = torch.randint(-2 ** 31, 2 ** 31, (2,), dtype=torch.int64).tolist()
    torch.manual_seed(3)
    small = random_bytes(1_001, cpu)
    assert small.dtype == torch.int8 and small.shape == (1_001,)
    assert small.numpy().tobytes() == _lowbias32_bytes(1_001, k1, k2)
    big = random_bytes(1_000_000, cpu)
    assert not torch.equal(big[:1_001], small)
    torch.manual_seed(3)
    random_bytes(1_001, cpu)
    assert torch.equal(random_bytes(1_000_000, cpu), big)
    counts = torch.bincount(big.long() + 128, minlength=256).double()
    expected = big.numel() / 256
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 255 + 5 * (2 * 255) ** 0.5                   # mean 255, sd 22.6
    f = big.double()
    for lag in (1, 4):
        assert abs(torch.corrcoef(torch.stack([f[:-lag], f[lag:]]))[0, 1].item()) < 0.005


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("chunk_rows", [1024, 5])
def test_fused_feed_forward_equals_linear_relu_dropout_linear(p, chunk_rows, monkeypatch):
    """The CPU training FFN (relu and dropout in place, one hidden tensor kept, rows taken a
    chunk at a time: here all 21 at once, or 5 at a time with a short last chunk) gives the
    values and gradients of the plain module chain with the same dropout mask."""
    from mt.model import fused
    from mt.model.layers import FeedForward
    monkeypatch.setattr(fused, "FFN_CHUNK_ROWS", chunk_rows)
    torch.manual_seed(0)
    ffn = FeedForward(16, 64, p).train()
    x = torch.randn(3, 7, 16, requires_grad=True)
    upstream = torch.randn(3, 7, 16)

    def run(module_call):
        for t in [x, *ffn.parameters()]:
            t.grad = None
        torch.manual_seed(1)                       # the same random bits for both masks
        y = module_call(x)
        (y * upstream).sum().backward()
        return y.detach(), [t.grad.clone() for t in [x, *ffn.parameters()]]

    y_fused, g_fused = run(ffn)
    y_ref, g_ref = run(ffn.net)                    # nn.Sequential: Linear, ReLU, Dropout, Linear
    torch.testing.assert_close(y_fused, y_ref)
    for a, b in zip(g_fused, g_ref):
        torch.testing.assert_close(a, b)
    with torch.no_grad():                          # evaluation: no dropout, the plain chain
        y_eval = ffn.eval()(x)
        torch.testing.assert_close(y_eval, ffn.net(x))
    assert (p == 0) == torch.allclose(y_fused, y_eval)  # dropout really acted in training


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("weight_scale", [1.0, 0.0])
def test_fused_add_norm_equals_layer_norm_of_dropout_residual(p, weight_scale):
    """The CPU training residual LayerNorm(x + dropout(f)), which keeps LayerNorm's output and
    recovers its input from it, gives the values and gradients of the module chain with the
    same mask; also when a LayerNorm weight is zero and the output cannot give the input back."""
    from mt.model.dropout import Dropout
    from mt.model.fused import add_norm
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.weight[3] *= weight_scale
        norm.bias.uniform_(-1.0, 1.0)
    drop = Dropout(p).train()
    x = (3 * torch.randn(4, 5, 16) + 2).requires_grad_()
    f = torch.randn(4, 5, 16, requires_grad=True)
    upstream = torch.randn(4, 5, 16)

    def run(call):
        for t in [x, f, norm.weight, norm.bias]:
            t.grad = None
        torch.manual_seed(1)                       # the same random bits for both masks
        y = call()
        (y * upstream).sum().backward()
        return [y.detach()] + [t.grad.clone() for t in [x, f, norm.weight, norm.bias]]

    fused = run(lambda: add_norm(x, f, norm.weight, norm.bias, p, norm.eps))
    chain = run(lambda: norm(x + drop(f)))
    for a, b in zip(fused, chain):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert (p == 0) == torch.allclose(fused[2], fused[1])   # dropout reached f's gradient


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("kind", ["padded", "causal", "padded causal", "cross", "relative"])
def test_fused_attention_equals_the_op_by_op_chain(kind, p, monkeypatch):
    """The CPU training attention (heads split from and gradients written back to the input
    projections, context recomputed in backward, output projection fused) gives the values
    and gradients of the op-by-op chain (SDPA without dropout, the explicit softmax with it,
    the same dropout mask): padded keys, causal self-attention (also padded, as in the
    decoder-only model), cross-attention and relative-position keys (whose score bias depends
    on the queries, so its gradient must reach them)."""
    from mt.model.attention import MultiHeadAttention
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, p, self_attention=kind != "cross",
                              relative=3 if kind == "relative" else 0).train()
    x = torch.randn(3, 5, 16, requires_grad=True)
    memory = torch.randn(3, 7, 16, requires_grad=True)
    s = 7 if kind == "cross" else 5
    may_attend = torch.ones(3, 1, 1, s, dtype=torch.bool)
    may_attend[0, ..., -2:] = False
    upstream = torch.randn(3, 5, 16)
    kwargs = {"padded": dict(attn_mask=may_attend), "causal": dict(is_causal=True),
              "padded causal": dict(attn_mask=may_attend, is_causal=True),
              "cross": dict(memory=memory, attn_mask=may_attend),
              "relative": dict(is_causal=True, q_pos=torch.arange(5), k_pos=torch.arange(5))}[kind]
    leaves = [x, memory, *attn.parameters()]

    def run():
        for t in leaves:
            t.grad = None
        torch.manual_seed(1)                       # the same random bits for both masks
        y = attn(x, **kwargs)
        nodes.append(type(y.grad_fn).__name__)
        (y * upstream).sum().backward()
        return [y.detach()] + [None if t.grad is None else t.grad.clone() for t in leaves]

    nodes = []
    fused = run()
    monkeypatch.setattr("mt.model.attention.cpu_fused", lambda *a: False)
    chain = run()
    assert nodes[0] == "_AttentionOutBackward" != nodes[1]   # the fused node really ran
    for a, b in zip(fused, chain):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        evaluated = attn.eval()(x, **kwargs)
    assert (p == 0) == torch.allclose(fused[0], evaluated, rtol=1e-4, atol=1e-5)  # dropout acted


def test_fused_loss_under_autocast_matches_fp32():
    """Under autocast the projection runs in bf16 (the GPU path), the softmax in fp32: the loss
    and gradients stay those of fp32 within bf16 precision."""
    from mt.loss import linear_smoothed_cross_entropy
    g = torch.Generator().manual_seed(2)
    h = torch.randn(300, 32, generator=g)
    w = torch.randn(50, 32, generator=g) * 0.3
    target = torch.randint(1, 50, (300,), generator=g)
    grads = []
    for amp in [False, True]:
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss, nll = linear_smoothed_cross_entropy(hh, ww, target, 0.1, chunk=64)
        assert loss.dtype == torch.float32
        loss.backward()
        grads.append((loss.detach(), nll, hh.grad, ww.grad))
    for a, b in zip(*grads):                     # relative error of the whole tensor
        assert ((b - a).norm() / a.norm()).item() < 1e-2
