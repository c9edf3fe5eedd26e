"""Every fast path of mt/fast equals the reference it replaces, in values and gradients, with
the same dropout mask: the fused loss, the fused feed-forward, add & norm and attention nodes,
the feed-forward on the real rows alone, and a whole model after `install` (the dropout
itself: test_fast_dropout.py)."""

import pytest
import torch

from mt import fast
from mt.config import load_config
from mt.errors import MTError
from mt.fast.modules import FastFeedForward, FastMultiHeadAttention, FastTransformer
from mt.model.attention import CAUSAL
from mt.objectives.loss import label_smoothed_nll
from mt.tokens import PAD
from mt.train.parts import model_parts
from tests.conftest import ROOT, V, make_model, make_src


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk", [7, 2048])
def test_fused_projection_and_loss_equal_the_reference_in_value_and_gradient(eps, chunk):
    """Chunked projection + smoothed CE = log_softmax(h W^T) + label_smoothed_nll, gradients
    for h and W included (W shared with the embedding, as when tied)."""
    from mt.fast.loss import linear_smoothed_cross_entropy

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
    with torch.no_grad():  # validation: values only
        torch.testing.assert_close(
            linear_smoothed_cross_entropy(h, w, target, eps)[0], ref_loss.detach()
        )


def test_fused_loss_chunk_defaults_to_the_module_constant(monkeypatch):
    """chunk=None takes mt.fast.loss.LOSS_CHUNK_ROWS when called (what race.py --patch replaces):
    the same sums, bit for bit, as that chunk given explicitly, and not those of another
    chunk."""
    from mt.fast import loss as loss_mod

    g = torch.Generator().manual_seed(3)
    h, w = torch.randn(300, 16, generator=g), torch.randn(500, 16, generator=g)
    target = torch.randint(1, 500, (300,), generator=g)

    def grad_w(chunk):
        wg = w.clone().requires_grad_()
        loss_mod.linear_smoothed_cross_entropy(h, wg, target, 0.1, chunk=chunk)[0].backward()
        return wg.grad

    monkeypatch.setattr(loss_mod, "LOSS_CHUNK_ROWS", 64)
    assert torch.equal(grad_w(None), grad_w(64))
    assert not torch.equal(grad_w(None), grad_w(300))  # one chunk sums in another order


@pytest.mark.parametrize("spread", [1.0, 40.0])
def test_fused_loss_in_fp32_matches_fp64_also_when_target_probabilities_underflow(spread):
    """fp32 against the fp64 reference, with ordinary logits and with logits so spread out that
    many targets' probabilities underflow in fp32 (log p_y down to about -1000): the loss, the
    NLL and the gradients stay finite and right (those rows take logsumexp)."""
    from mt.fast.loss import linear_smoothed_cross_entropy

    g = torch.Generator().manual_seed(2)
    h = torch.randn(300, 16, generator=g, dtype=torch.float64) * spread
    w = torch.randn(500, 16, generator=g, dtype=torch.float64)
    target = torch.randint(1, 500, (300,), generator=g)
    ref = [h.clone().requires_grad_(), w.clone().requires_grad_()]
    ref_loss, ref_nll, _ = label_smoothed_nll(
        torch.log_softmax(ref[0] @ ref[1].t(), -1), target, 0.1, PAD
    )
    ref_loss.backward()
    ours = [h.float().requires_grad_(), w.float().requires_grad_()]
    loss, nll = linear_smoothed_cross_entropy(*ours, target, 0.1, chunk=64)
    loss.backward()
    if spread > 1:
        logp = torch.log_softmax(h.float() @ w.float().t(), -1).gather(1, target[:, None])
        assert (logp < -104).float().mean() > 0.2  # below fp32's smallest subnormal
    torch.testing.assert_close(loss.double(), ref_loss.detach(), rtol=1e-5, atol=0)
    torch.testing.assert_close(nll.double(), ref_nll, rtol=1e-5, atol=0)
    for a, b in zip(ours, ref, strict=True):  # fp32 sums of 300 rows: relative to the largest
        torch.testing.assert_close(
            a.grad.double(), b.grad, rtol=1e-3, atol=1e-5 * b.grad.abs().max().item()
        )


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("chunk_rows", [1024, 5])
def test_fused_feed_forward_equals_linear_relu_dropout_linear(p, chunk_rows, monkeypatch):
    """The CPU training FFN (relu and dropout in place, one hidden tensor kept, rows taken a
    chunk at a time: here all 21 at once, or 5 at a time with a short last chunk) gives the
    values and gradients of the plain module chain with the same dropout mask."""
    from mt.fast import nodes

    monkeypatch.setattr(nodes, "FFN_CHUNK_ROWS", chunk_rows)
    torch.manual_seed(0)
    ffn = FastFeedForward(16, 64, p).train()
    x = torch.randn(3, 7, 16, requires_grad=True)
    upstream = torch.randn(3, 7, 16)

    def run(module_call):
        for t in [x, *ffn.parameters()]:
            t.grad = None
        torch.manual_seed(1)  # the same random bits for both masks
        y = module_call(x)
        (y * upstream).sum().backward()
        return y.detach(), [t.grad.clone() for t in [x, *ffn.parameters()]]

    y_fused, g_fused = run(ffn)
    y_ref, g_ref = run(ffn.net)  # nn.Sequential: Linear, ReLU, Dropout, Linear
    torch.testing.assert_close(y_fused, y_ref)
    for a, b in zip(g_fused, g_ref, strict=True):
        torch.testing.assert_close(a, b)
    with torch.no_grad():  # evaluation: no dropout, the plain chain
        y_eval = ffn.eval()(x)
        torch.testing.assert_close(y_eval, ffn.net(x))
    assert (p == 0) == torch.allclose(y_fused, y_eval)  # dropout really acted in training


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("weight_scale", [1.0, 0.0])
def test_fused_add_norm_equals_layer_norm_of_dropout_residual(p, weight_scale):
    """The CPU training residual LayerNorm(x + dropout(f)), which keeps LayerNorm's output and
    recovers its input from it, gives the values and gradients of the module chain with the
    same mask; also when a LayerNorm weight is zero and the output cannot give the input back."""
    from mt.fast.dropout import HashDropout
    from mt.fast.nodes import add_norm

    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.weight[3] *= weight_scale
        norm.bias.uniform_(-1.0, 1.0)
    drop = HashDropout(p).train()
    x = (3 * torch.randn(4, 5, 16) + 2).requires_grad_()
    f = torch.randn(4, 5, 16, requires_grad=True)
    upstream = torch.randn(4, 5, 16)

    def run(call):
        for t in [x, f, norm.weight, norm.bias]:
            t.grad = None
        torch.manual_seed(1)  # the same random bits for both masks
        y = call()
        (y * upstream).sum().backward()
        return [y.detach()] + [t.grad.clone() for t in [x, f, norm.weight, norm.bias]]

    fused = run(lambda: add_norm(x, f, norm.weight, norm.bias, p, norm.eps))
    chain = run(lambda: norm(x + drop(f)))
    for a, b in zip(fused, chain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert (p == 0) == torch.allclose(fused[2], fused[1])  # dropout reached f's gradient


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("kind", ["padded", "causal", "padded causal", "cross", "relative"])
def test_fused_attention_equals_the_op_by_op_chain(kind, p, monkeypatch):
    """The CPU training attention (heads split from and gradients written back to the input
    projections, context recomputed in backward, output projection fused) gives the values
    and gradients of the op-by-op chain (SDPA without dropout, the explicit softmax with it,
    the same dropout mask): padded keys, causal self-attention (also padded, as in the
    decoder-only model), cross-attention and relative-position keys (whose score bias depends
    on the queries, so its gradient must reach them)."""
    torch.manual_seed(0)
    attn = FastMultiHeadAttention(
        16, 2, p, self_attention=kind != "cross", relative=3 if kind == "relative" else 0
    ).train()
    x = torch.randn(3, 5, 16, requires_grad=True)
    memory = torch.randn(3, 7, 16, requires_grad=True)
    s = 7 if kind == "cross" else 5
    may_attend = torch.ones(3, 1, 1, s, dtype=torch.bool)
    may_attend[0, ..., -2:] = False
    upstream = torch.randn(3, 5, 16)
    kwargs = {
        "padded": {"mask": may_attend},
        "causal": {"mask": CAUSAL},
        "padded causal": {"mask": may_attend & torch.ones(s, s, dtype=torch.bool).tril()},
        "cross": {"memory": memory, "mask": may_attend},
        "relative": {"mask": CAUSAL, "positions": (torch.arange(5), torch.arange(5))},
    }[kind]
    leaves = [x, memory, *attn.parameters()]

    def run():
        for t in leaves:
            t.grad = None
        torch.manual_seed(1)  # the same random bits for both masks
        y = attn(x, **kwargs)
        nodes.append(type(y.grad_fn).__name__)
        (y * upstream).sum().backward()
        return [y.detach()] + [None if t.grad is None else t.grad.clone() for t in leaves]

    nodes = []
    fused = run()
    monkeypatch.setattr("mt.fast.modules.cpu_fused", lambda *a: False)
    chain = run()
    assert nodes[0] == "_AttentionOutBackward" != nodes[1]  # the fused node really ran
    for a, b in zip(fused, chain, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        evaluated = attn.eval()(x, **kwargs)
    assert (p == 0) == torch.allclose(fused[0], evaluated, rtol=1e-4, atol=1e-5)  # dropout acted


def test_fused_loss_under_autocast_matches_fp32():
    """Under autocast the projection runs in bf16 (the GPU path), the softmax in fp32: the loss
    and gradients stay those of fp32 within bf16 precision."""
    from mt.fast.loss import linear_smoothed_cross_entropy

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
    for a, b in zip(*grads, strict=True):  # relative error of the whole tensor
        assert ((b - a).norm() / a.norm()).item() < 1e-2


@pytest.mark.parametrize("pre_norm", [False, True])
def test_feed_forward_on_real_positions_only_trains_the_same(monkeypatch, pre_norm):
    """With enough padding the feed-forward runs on the real positions alone (fewer rows reach
    it), and training sees the same real-position outputs and parameter gradients."""
    import mt.fast.modules as modules

    def run(skip: bool):
        monkeypatch.setattr(modules, "_MIN_PADDING_TO_SKIP", 0.05 if skip else 2.0)
        model = make_model(pre_norm, dropout=0.0, kind=FastTransformer, parts=fast.PARTS).train()
        rows = []
        for layer in (*model.encoder, *model.decoder):
            layer.ffn.register_forward_hook(lambda m, i, o: rows.append(i[0].numel() // 32))
        src = make_src([9, 3, 6, 4])
        tgt = torch.randint(4, V, (4, 8))
        tgt[1, 3:], tgt[2, 5:], tgt[3, 2:] = PAD, PAD, PAD
        keep = tgt != PAD
        out = model(src, tgt, src == PAD)[keep]
        (out.log_softmax(-1)[:, 5].sum() + out.square().mean()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        return out, grads, rows

    out, grads, rows = run(skip=True)
    ref, ref_grads, ref_rows = run(skip=False)
    assert rows == [9 + 3 + 6 + 4] * 2 + [4 * 8 - 5 - 3 - 6] * 2  # encoder, decoder layers
    assert ref_rows == [4 * 9] * 2 + [4 * 8] * 2
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def _small_model(arch="transformer", norm="post", dropout=0.0, parts=None):
    from mt.config import ModelConfig
    from mt.model import REFERENCE, build_model

    torch.manual_seed(0)
    return build_model(
        ModelConfig(
            arch=arch,
            d_model=32,
            n_heads=4,
            enc_layers=2,
            dec_layers=2,
            d_ff=64,
            dropout=dropout,
            attn_dropout=dropout,
            norm=norm,
            max_positions=64,
        ),
        V,
        V,
        parts or REFERENCE,
    )


def _padded_batch():
    from mt.data.batching import Batch

    src = make_src([9, 3, 6, 4])
    tgt = torch.randint(4, V, (4, 9))
    tgt[1, 4:], tgt[2, 6:], tgt[3, 3:] = PAD, PAD, PAD
    return Batch(
        src=src, tgt_in=tgt[:, :-1], tgt_out=tgt[:, 1:], n_tokens=int((tgt[:, 1:] != PAD).sum())
    )


@pytest.mark.parametrize(
    "arch,norm",
    [("transformer", "post"), ("transformer", "pre"), ("decoder_only", "post"), ("rnn", "post")],
)
def test_installed_model_and_chunked_loss_equal_the_reference(arch, norm):
    """A whole model with the fast paths swapped in and the chunked loss gives the reference
    model's loss, NLL and every parameter gradient, and keeps its state_dict (checkpoints do
    not depend on the switch)."""
    from mt.fast import chunked_loss
    from mt.objectives.loss import reference_loss

    batch = _padded_batch()

    def run(model, loss_fn):
        model.train()
        loss, nll = loss_fn(model, batch, 0.1)
        (loss * 0.01).backward()
        return (
            loss.detach(),
            nll,
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )

    ref_model, fast_model = _small_model(arch, norm), _small_model(arch, norm, parts=fast.PARTS)
    assert list(ref_model.state_dict()) == list(fast_model.state_dict())
    assert (
        any(type(m).__module__ == "mt.fast.modules" for m in fast_model.modules()) or arch == "rnn"
    )
    ref, got = run(ref_model, reference_loss), run(fast_model, chunked_loss)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-5)
    assert got[2].keys() == ref[2].keys()
    for name, g in ref[2].items():
        torch.testing.assert_close(got[2][name], g, rtol=1e-4, atol=1e-6, msg=name)


def _nodes(t: torch.Tensor) -> set[str]:
    """The names of every autograd node that produced `t`."""
    seen, todo, names = set(), [t.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(type(fn).__name__)
        todo += [nxt for nxt, _ in fn.next_functions]
    return names


def test_fast_paths_act_only_where_they_apply():
    """The fused nodes run in fp32 CPU training only: not under autocast, and evaluation gives
    the reference model's outputs."""
    model = _small_model(dropout=0.1, parts=fast.PARTS)
    batch = _padded_batch()
    model.train()
    h = model.decode(batch.tgt_in, model.encode(batch.src, batch.src_pad_mask), batch.src_pad_mask)
    assert {"_FeedForwardBackward", "_AddNormBackward", "_AttentionOutBackward"} <= _nodes(h)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = model.decode(
            batch.tgt_in, model.encode(batch.src, batch.src_pad_mask), batch.src_pad_mask
        )
    assert not {"_FeedForwardBackward", "_AddNormBackward", "_AttentionOutBackward"} & _nodes(h)
    with torch.no_grad():
        model.eval()
        ref = _small_model(dropout=0.1).eval()
        real = batch.tgt_in != PAD  # packing leaves padding positions uncomputed
        torch.testing.assert_close(
            model(batch.src, batch.tgt_in, batch.src_pad_mask)[real],
            ref(batch.src, batch.tgt_in, batch.src_pad_mask)[real],
        )


@pytest.mark.parametrize("eps,alpha", [(0.1, 2.5), (0.0, 5.0), (0.1, 0.0)])
@pytest.mark.parametrize("chunk", [3, 2048])
def test_fused_rdrop_equals_the_reference_in_value_and_gradient(eps, alpha, chunk):
    """The fused R-Drop node on two different sets of decoder states = the mean of the two
    passes' label-smoothed losses of log_softmax(h W^T) plus alpha times
    mt.objectives.loss.symmetric_kl, with the gradients for both passes' states and W."""
    from mt.fast.loss import linear_rdrop_loss
    from mt.objectives.loss import symmetric_kl

    g = torch.Generator().manual_seed(2)
    h_a, h_b = (torch.randn(10, 6, generator=g, dtype=torch.float64) for _ in range(2))
    w = torch.randn(11, 6, generator=g, dtype=torch.float64) * 2
    target = torch.randint(1, 11, (10,), generator=g)
    ref_in = [t.clone().requires_grad_() for t in (h_a, h_b, w)]
    got_in = [t.clone().requires_grad_() for t in (h_a, h_b, w)]
    lp_a, lp_b = (torch.log_softmax(h @ ref_in[2].t(), -1) for h in ref_in[:2])
    (loss_a, nll_a, _), (loss_b, nll_b, _) = (
        label_smoothed_nll(lp, target, eps, PAD) for lp in (lp_a, lp_b)
    )
    kl = symmetric_kl(lp_a, lp_b, torch.ones(10, dtype=torch.float64))
    assert kl > 0.1  # the two passes really differ
    ref = (loss_a + loss_b) / 2 + alpha * kl
    loss, nll = linear_rdrop_loss(*got_in, target, eps, alpha, chunk=chunk)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, (nll_a + nll_b) / 2)
    (3.0 * ref).backward()
    (3.0 * loss).backward()
    for got, want in zip(got_in, ref_in, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_fused_rdrop_on_a_model_is_the_plain_loss_when_the_passes_agree():
    """The whole fused R-Drop step (the batch stacked on itself, one pass): without dropout the
    two halves are the same pass, so the KL is zero and loss, NLL and every gradient are the
    reference model's plain loss's; in evaluation it is the plain loss."""
    from mt.fast import chunked_rdrop_loss
    from mt.objectives.loss import reference_loss

    batch = _padded_batch()
    ref_model, fast_model = _small_model(), _small_model(parts=fast.PARTS)
    ref_loss, ref_nll = reference_loss(ref_model.train(), batch, 0.1)
    (ref_loss * 0.01).backward()
    loss, nll = chunked_rdrop_loss(fast_model.train(), batch, 0.1, alpha=5.0)
    (loss * 0.01).backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(fast_model.named_parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(
            chunked_rdrop_loss(fast_model.eval(), batch, 0.1, alpha=5.0)[0],
            reference_loss(ref_model.eval(), batch, 0.1)[0],
            rtol=1e-5,
            atol=1e-5,
        )


def test_fused_rdrop_draws_its_own_mask_for_each_pass():
    """With dropout the two stacked copies get different masks: the KL term is positive (the
    loss grows with alpha) and alpha 0 is not the KL-weighted loss."""
    from mt.fast import chunked_rdrop_loss

    model, batch = _small_model(dropout=0.3, parts=fast.PARTS).train(), _padded_batch()
    values = []
    for alpha in (0.0, 1.0):
        torch.manual_seed(11)
        values.append(chunked_rdrop_loss(model, batch, 0.1, alpha=alpha)[0].item())
    assert values[1] > values[0] + 1e-3


TINY = ROOT / "configs" / "tiny.yaml"


def test_fast_paths_auto_builds_them_on_a_cpu_only():
    """train.fast_paths "auto" (the default) builds the model from mt/fast's modules on a CPU
    and from the reference modules elsewhere (on an H200 mt/fast made training slower:
    docs/gpu.md); true and false force either on any device, and encoder pretraining keeps
    the reference. The meta device stands in for a GPU."""
    from mt.config import ModelConfig, TrainConfig
    from mt.fast.dropout import HashDropout
    from mt.model import build_model

    assert TrainConfig().fast_paths == "auto"

    def installed(setting, device, pretraining=False):
        parts = model_parts(TrainConfig(fast_paths=setting), torch.device(device), pretraining)
        model = build_model(
            ModelConfig(d_model=32, enc_layers=1, dec_layers=1, d_ff=64, dropout=0.1), 50, 50, parts
        )
        kinds = {type(m) for m in model.modules()}
        fast_kinds = {FastTransformer, FastFeedForward, FastMultiHeadAttention, HashDropout}
        assert not kinds & fast_kinds or fast_kinds <= kinds  # all of mt/fast, or none
        assert torch.nn.Dropout not in kinds or not kinds & fast_kinds
        return bool(kinds & fast_kinds)

    assert not installed(True, "cpu", pretraining=True)
    assert installed("auto", "cpu") and not installed("auto", "meta")
    assert installed(True, "meta") and not installed(False, "cpu")
    with pytest.raises(MTError, match=r"train\.fast_paths"):
        load_config(TINY, ["train.fast_paths=sometimes"])
    # 1 == True, so a Literal of booleans alone would take 1 and 0 where every other
    # boolean key refuses them.
    for number in ("1", "0"):
        with pytest.raises(MTError, match=r"train\.fast_paths: expected 'auto', true or false"):
            load_config(TINY, [f"train.fast_paths={number}"])
