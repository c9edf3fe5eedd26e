"""The one-process exchange (mt/train/update/exchange.py's Flat): the gradients it leaves are plain
autograd's divided by the tokens and clipped by torch's clip_grad_norm_, and an update runs
only a handful of operators outside the compiled graphs."""

import pytest
import torch

from mt.runtime.distributed import Dist
from mt.train.update.exchange import Flat, settle
from mt.train.update.skips import DeferredSkips
from tests.conftest import ROOT, V, make_model


class _NoScaler:
    def is_enabled(self) -> bool:
        return False


def _pieces(model, seed: int, rows: int = 3):
    """A loss sum and NLL of `model` on a random batch; the NLL stands for the plain loss."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (rows, 7), generator=g)
    tgt = torch.randint(4, V, (rows, 6), generator=g)
    logits = model(src, tgt[:, :-1], src == 0)
    lp = torch.log_softmax(logits.float(), -1)
    nll = -lp.gather(-1, tgt[:, 1:, None]).sum()
    return nll * 1.1, nll, tgt[:, 1:].numel()


@pytest.mark.parametrize("clip", [0.0, 0.05, 1e9])
def test_flat_gradients_are_the_token_mean_clipped_as_torch_clips(clip):
    """Two micro-batches through Flat (a copy, then an add, into the buffer; the loss over
    tokens_hint, then times hint / tokens) against plain autograd on the loss summed over
    both, divided by their tokens, and torch.nn.utils.clip_grad_norm_."""
    model, ref = make_model(seed=3), make_model(seed=3)
    counts = DeferredSkips(torch.device("cpu")).count
    flat = Flat(model.parameters(), Dist(), torch.device("cpu"), tokens_hint=1000)
    pieces = [_pieces(model, seed) for seed in (0, 1)]
    tokens = sum(n for _, _, n in pieces)
    flat.begin(tokens)
    for loss, nll, _ in pieces:
        flat.backward(loss, nll, _NoScaler())
    flat.reduce(out_of_memory=False)
    skip, kept, row, scale = flat.finish(counts, clip)

    total = sum(_pieces(ref, seed)[0] for seed in (0, 1))
    (total / tokens).backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
    # the buffers are left as the backward passes wrote them, for fused Adam to divide by
    # its grad_scale as it reads them
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad / scale, q.grad, rtol=1e-5, atol=1e-7)
    assert (skip.item(), kept.item()) == (0.0, 1.0)
    torch.testing.assert_close(row[0], total.detach(), rtol=1e-6, atol=0)
    assert row[2].item() == tokens and counts.tolist() == [0.0, 0.0]


def test_a_nonfinite_or_out_of_memory_update_is_flagged_counted_and_left_out_of_the_log():
    model = make_model(seed=3)
    counts = DeferredSkips(torch.device("cpu")).count
    flat = Flat(model.parameters(), Dist(), torch.device("cpu"), tokens_hint=100)
    loss, nll, n = _pieces(model, 0)
    flat.begin(n)
    flat.backward(loss * float("nan"), nll, _NoScaler())
    flat.reduce(out_of_memory=False)
    skip, kept, row, _ = flat.finish(counts, 1.0)
    assert (skip.item(), kept.item()) == (1.0, 0.0) and row.tolist() == [0.0, 0.0, 0.0]
    flat.begin(n)  # the next update writes over the NaN gradients: nothing is left of them
    flat.backward(*_pieces(model, 1)[:2], _NoScaler())
    flat.reduce(out_of_memory=True)  # (this rank, or another, ran out of memory)
    skip, _, _, _ = flat.finish(counts, 1.0)
    assert skip.item() == 1.0 and counts.tolist() == [2.0, 1.0]
    flat.begin(n)
    flat.backward(*_pieces(model, 2)[:2], _NoScaler())
    flat.reduce(out_of_memory=False)
    skip, _, row, _ = flat.finish(counts, 1.0)  # the flag does not outlive its update
    assert skip.item() == 0.0 and row[2].item() == n
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())


def test_settle_compiled_is_bitwise_the_eager_settle():
    torch.manual_seed(0)
    flats = [torch.randn(1001)]
    flats[0][-4:] = torch.tensor([0.0, 321.5, 300.25, 77.0])
    counts = torch.zeros(2)
    eager = settle([flats[0].clone()], counts.clone(), 1000.0, 0.5)
    compiled_flats, compiled_counts = [flats[0].clone()], counts.clone()
    compiled = torch.compile(settle, backend="aot_eager", fullgraph=True, dynamic=False)(
        compiled_flats, compiled_counts, 1000.0, 0.5
    )
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a, b)
    ref = [flats[0].clone()]
    settle(ref, counts, 1000.0, 0.5)
    assert torch.equal(compiled_flats[0], ref[0]) and torch.equal(compiled_counts, counts)


# operators that make a view or return their input (no kernel on any device)
VIEWS = {"aten::detach", "aten::select", "aten::unbind", "aten::view", "aten::alias",
         "aten::as_strided", "aten::slice", "aten::expand", "aten::lift_fresh"}  # fmt: skip


@pytest.mark.parametrize("accum,at_most", [(1, 4), (2, 8)])
def test_a_compiled_update_runs_a_few_kernels_outside_its_graphs(
    tmp_path, monkeypatch, accum, at_most
):
    """Under train.compile the loss with the model, and the bookkeeping after the backward,
    are compiled graphs; what an update runs outside them (torch.profiler's outermost aten
    operators under no compiled region, views aside) is the token count's fill, one foreach
    add per micro-batch, and Adam's two."""
    from torch.profiler import ProfilerActivity, profile

    from mt.config import load_config
    from mt.train.build import build_trainer

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend="aot_eager", **kw))
    torch._dynamo.reset()
    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        [f"data.dir={tmp_path / 'd'}", "train.device=cpu", "train.compile=true",
         "train.pack_width=64", "train.max_tokens=2048", f"train.accum_steps={accum}",
         "train.valid_every=1000", "train.log_every=1000", "model.dropout=0",
         "train.update=device"],
    )  # fmt: skip
    t = build_trainer(cfg, tmp_path / "run", log=lambda *_: None)
    batches = t.batches()
    for _ in range(3):
        assert t.train_step([next(batches) for _ in range(accum)])
    works = [[next(batches) for _ in range(accum)] for _ in range(2)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for work in works:
            t.train_step(work)
    t.close()
    torch._dynamo.reset()

    def outermost(e) -> bool:
        parent = e.cpu_parent
        while parent is not None:
            if "Compiled" in parent.name or parent.name.startswith("aten::"):
                return False
            parent = parent.cpu_parent
        return True

    ran = [
        e.name
        for e in prof.events()
        if e.name.startswith("aten::") and outermost(e) and e.name not in VIEWS
        and not (e.name == "aten::to" and not e.cpu_children)
    ]  # fmt: skip
    assert len(ran) / 2 <= at_most, sorted(ran)
    assert ran.count("aten::_fused_adam_") == 2  # (the count is of real updates)
