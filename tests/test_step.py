"""The kinds of update (mt/train/update/step.py): the plain one, as a textbook writes it, and the
device one, with flat buffers and skips settled on the device, give the same weights, skips,
log rows and checkpoints from the same batches, and a run resumes from one into the other."""

from __future__ import annotations

import json
import math
import signal

import numpy as np
import pytest
import torch

from mt.artifacts import checkpoint
from mt.config import load_config
from mt.data.batching import collate
from mt.errors import MTError
from mt.runtime.distributed import Dist
from mt.train.build import build_trainer
from mt.train.update.build import resolve_update
from tests.conftest import (
    EXACT_ADAM,
    ROOT,
    out_of_memory_on_call,
    poison,
    tiny_config,
    trainer_for,
)

# Adam nearly linear in the gradient (EXACT_ADAM), so that a wrong scale of the gradients
# shows in the weights
COMMON = ("train.log_every=4", "train.valid_every=100", "train.save_every=6", *EXACT_ADAM)


def _kind_trainer(path, kind: str, *more: str):
    """configs/tiny.yaml's Trainer of this kind of update, its run in `path`."""
    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        [f"data.dir={path.parent / 'd'}", "train.device=cpu", f"train.update={kind}",
         *COMMON, *more],
    )  # fmt: skip
    return build_trainer(cfg, path, log=lambda *_: None)


def _log(run) -> list[dict]:
    return [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]


# clipping that binds (the tiny task's gradient norms are above 0.05), which an update that
# skipped it would not pass; none, where a gradient of the wrong scale would be clipped back
@pytest.mark.parametrize("clip", ["0.05", "0"])
def test_both_kinds_train_the_same_weights_skips_logs_and_checkpoints(tmp_path, clip):
    """12 updates of two batches each, of each kind, from the same weights and batches; the
    8th batch's loss NaN (skipped by both: by the host's read in the plain update, on the
    device and taken back at the check step of update 4 in the device one)."""
    more = ("train.max_steps=12", f"train.clip_norm={clip}", "train.accum_steps=2")
    runs = {kind: _kind_trainer(tmp_path / kind, kind, *more) for kind in ("plain", "device")}
    plain, device = runs["plain"], runs["device"]
    assert type(plain.update).__name__ == "PlainUpdate"
    assert type(device.update).__name__ == "DeviceUpdate"
    start = {k: v.clone() for k, v in plain.model.state_dict().items()}
    for name, v in start.items():  # (the same seed: the same start)
        assert torch.equal(v, device.model.state_dict()[name]), name
    for t in runs.values():
        poison(t, {8})
        t.fit()
    # The two kinds sum each gradient element's terms (at most the two micro-batches' tokens)
    # in other orders, which moves a sum by at most terms x epsilon of its size (Higham's
    # bound); the weights' paths then differ by at most that share of the distance the
    # tensor's weights travelled (a difference anywhere feeds every gradient), plus one
    # rounding of a weight: a bound from the arithmetic, not from one CPU's result. (A
    # mistake in either kind moves weights by a share of their whole travel.)
    terms, eps = 2 * 2000, torch.finfo(torch.float32).eps
    for name, v in plain.model.state_dict().items():
        other, moved = device.model.state_dict()[name], (v - start[name]).abs().max()
        bound = terms * eps * moved + eps * v.abs().max()
        assert (v - other).abs().max() <= bound, (name, (v - other).abs().max(), bound)

    logs = {kind: _log(tmp_path / kind) for kind in runs}
    rows = {k: [(r["step"], r["lr"], r["loss"], r["tokens"]) for r in log if "loss" in r]
            for k, log in logs.items()}  # fmt: skip
    assert [r[:2] for r in rows["plain"]] == [r[:2] for r in rows["device"]]
    assert [r[0] for r in rows["plain"]] == [4, 8, 12]
    for a, b in zip(rows["plain"], rows["device"], strict=True):
        assert a[3] == b[3] and abs(a[2] - b[2]) <= 1e-4 * abs(b[2]), (a, b)
    skips = {k: [(r["skipped"], r["count"]) for r in log if "skipped" in r]
             for k, log in logs.items()}  # fmt: skip
    assert skips["plain"] == skips["device"] == [("non-finite loss", 1)]

    saved = {k: checkpoint.load(tmp_path / k / "last.pt") for k in runs}
    a, b = saved["plain"], saved["device"]
    ignore = ("run_id", "train_seconds")
    assert {k: v for k, v in a["train_state"].items() if k not in ignore} == {
        k: v for k, v in b["train_state"].items() if k not in ignore
    }
    assert a["train_state"]["step"] == 12
    assert a["scheduler"] == b["scheduler"]
    for i, st in a["optimizer"]["state"].items():  # Adam's step counts skip the same update
        other = b["optimizer"]["state"][i]
        assert float(st["step"]) == float(other["step"]) == 12
        torch.testing.assert_close(st["exp_avg"], other["exp_avg"], rtol=1e-4, atol=1e-7)


class _Replay:
    """A CUDA graph's replay, played on the CPU: the recorded update run again on the very
    buffers the capture saw (a replay cannot read any other), its log row written where the
    capture's was."""

    def __init__(self, update):
        self.update, self.row = update, torch.zeros(3)
        self.seen = (update.static, update.lr, update.exchange.tokens)
        update.row = self.row

    def replay(self):
        u = self.update
        assert (u.static, u.lr, u.exchange.tokens) == self.seen  # (identity: no new buffers)
        self.row.copy_(u._update())


@pytest.mark.parametrize("replayed", [False, True])
def test_the_graph_update_run_as_recorded_trains_as_the_device_update(
    tmp_path, monkeypatch, replayed
):
    """train.update graph on the CPU runs the update the GPU records (static batch buffers,
    the device's learning rate, settle and Adam as one piece; mt/train/update/graphed.py), and
    replayed: after 3 updates the update is "captured" and replayed as a graph is (_Replay):
    10 updates on packed blocks, the 5th's loss NaN, give the device update's weights, Adam
    state, log rows and skips; no update reads the device."""
    from mt.runtime.host_syncs import HostSyncs
    from mt.train.update.graphed import GraphUpdate

    if replayed:
        monkeypatch.setattr(GraphUpdate, "_capture", lambda self, state: _Replay(self))

    more = ("train.max_steps=10", "train.clip_norm=0.05", "train.pack_width=64",
            "train.max_tokens=1024", "train.fast_paths=false", "train.log_every=5")  # fmt: skip
    runs = {kind: _kind_trainer(tmp_path / kind, kind, *more) for kind in ("device", "graph")}
    graph = runs["graph"]
    assert type(graph.update).__name__ == "GraphUpdate" and graph.skips.deferred is not None
    graph.update.capture = replayed
    for t in runs.values():
        poison(t, {5})
    with HostSyncs() as syncs:  # (the first update makes Adam's state)
        runs["graph"].train_step([next(runs["graph"].batches())])
    assert syncs.count == 0, syncs.where
    runs["device"].train_step([next(runs["device"].batches())])
    for t in runs.values():
        t.fit()
    assert isinstance(graph.update.graph, _Replay) is replayed
    for name, v in runs["device"].model.state_dict().items():
        torch.testing.assert_close(graph.model.state_dict()[name], v, rtol=1e-5, atol=1e-7,
                                   msg=lambda m, n=name: f"{n}: {m}")  # fmt: skip
    logs = {kind: _log(tmp_path / kind) for kind in runs}
    rows = {k: [(r["step"], r["lr"], round(r["loss"], 4), r["tokens"]) for r in log if "loss" in r]
            for k, log in logs.items()}  # fmt: skip
    assert rows["graph"] == rows["device"] and [r[0] for r in rows["graph"]] == [5, 10]
    skips = {k: [(r["skipped"], r["count"]) for r in log if "skipped" in r]
             for k, log in logs.items()}  # fmt: skip
    assert skips["graph"] == skips["device"] == [("non-finite loss", 1)]
    a, b = (checkpoint.load(tmp_path / k / "last.pt")["optimizer"]["state"] for k in runs)
    for i, st in a.items():
        assert float(st["step"]) == float(b[i]["step"]) == 10
        torch.testing.assert_close(b[i]["exp_avg_sq"], st["exp_avg_sq"], rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize(
    "sets,says",
    [
        (("train.accum_steps=2", "train.pack_width=64"), "set train.accum_steps: 1"),
        (("train.pack_width=0",), "set train.pack_width"),
        (("train.precision=fp16", "train.pack_width=64"), "use bf16"),
    ],
)
def test_the_graph_update_refuses_what_it_cannot_replay(tmp_path, sets, says):
    with pytest.raises(MTError, match=says):
        _kind_trainer(tmp_path / "run", "graph", "train.max_tokens=1024", *sets)


def test_a_run_resumes_from_one_kind_into_the_other(tmp_path):
    """6 plain updates, then resumed to 12 as device updates: the same steps, learning rates
    and losses as 12 plain updates in one go."""
    every = "train.log_every=2"  # (a log row where the first part stops)
    _kind_trainer(tmp_path / "whole", "plain", "train.max_steps=12", every).fit()
    _kind_trainer(tmp_path / "split", "plain", "train.max_steps=6", every).fit()
    resumed = _kind_trainer(tmp_path / "split", "device", "train.max_steps=12", every)
    assert resumed.state.step == 6 and type(resumed.update).__name__ == "DeviceUpdate"
    resumed.fit()
    whole, split = (
        [(r["step"], r["lr"], r["loss"]) for r in _log(tmp_path / run) if "loss" in r]
        for run in ("whole", "split")
    )
    assert [r[:2] for r in whole] == [r[:2] for r in split]
    for (_, _, x), (_, _, y) in zip(whole, split, strict=True):
        assert abs(x - y) <= 1e-4 * abs(x), (x, y)


def test_auto_takes_the_device_update_on_a_gpu_or_with_ranks_but_for_fp16_and_ddp():
    from types import SimpleNamespace

    cpu, gpu, one, two = torch.device("cpu"), torch.device("cuda"), Dist(), Dist(rank=0, world=2)

    def kind(setting, device, dist, fp16=False, **more):
        defaults = {"accum_steps": 1, "pack_width": 128, "data_parallel": "flat"}
        cfg = SimpleNamespace(**{"update": setting, **defaults, **more})
        return resolve_update(cfg, device, dist, fp16)

    assert kind("auto", cpu, one) == "plain"
    assert kind("auto", gpu, one) == "device"
    assert kind("auto", cpu, two) == "device"
    assert kind("auto", gpu, one, fp16=True) == "plain"  # (its GradScaler reads the host)
    assert kind("auto", gpu, two, data_parallel="ddp") == "plain"  # (DDP rides in it)
    assert kind("auto", gpu, one, data_parallel="ddp") == "device"  # (one process: no DDP)
    assert kind("device", cpu, one) == "device"
    assert kind("plain", gpu, one) == "plain"
    assert kind("plain", cpu, two, data_parallel="ddp") == "plain"
    assert kind("graph", gpu, one) == "graph"
    with pytest.raises(MTError, match=r"train\.update: graph trains one process"):
        kind("graph", cpu, two)
    with pytest.raises(MTError, match=r"plain exchanges the ranks' gradients through .* DDP"):
        kind("plain", cpu, two)
    for more, why in (({"fp16": True}, "GradScaler reads"), ({"data_parallel": "ddp"}, "DDP")):
        with pytest.raises(MTError, match=rf"train\.update: device skips on the device.*{why}"):
            kind("device", gpu, two, **more)
    for more, words in (
        ({"fp16": True}, "use bf16"),
        ({"accum_steps": 2}, "accum_steps: 1"),
        ({"pack_width": 0}, "set train.pack_width"),
    ):
        with pytest.raises(MTError, match=words):
            kind("graph", gpu, one, **more)


def test_an_update_the_run_cannot_make_is_refused_before_its_data_is_read(tmp_path):
    """train.update graph with accumulation: one line before the BPE model is trained or the
    corpus read (mt.train.update.step.resolve_update is the one reader of train.update)."""
    with pytest.raises(MTError, match="captures one batch's update"):
        trainer_for(tmp_path, "train.update=graph", "train.accum_steps=2", "train.pack_width=64")
    assert not (tmp_path / "run" / "spm.model").exists()


# -- each kind on its own: skips, accumulation, what the device update never reads --------


@pytest.mark.parametrize("kind", ["plain", "device"])
def test_gradient_accumulation_equals_one_big_batch(tmp_path, kind):
    """Two batches accumulated into one update == one update on their union (dropout off; no
    clipping, which would hide a wrong scale)."""

    common = ("model.dropout=0.0", "train.clip_norm=0", f"train.update={kind}")
    t = trainer_for(tmp_path, *common)
    idx_a, idx_b = list(range(16)), list(range(16, 32))
    state0 = {k: v.clone() for k, v in t.model.state_dict().items()}
    opt0 = t.optimizer.state_dict()
    t.train_step([collate(t.train_data, np.array(idx_a)), collate(t.train_data, np.array(idx_b))])
    accumulated = {k: v.clone() for k, v in t.model.state_dict().items()}
    t2 = trainer_for(tmp_path / "2", *common)
    t2.model.load_state_dict(state0)
    t2.optimizer.load_state_dict(opt0)
    t2.train_step([collate(t2.train_data, np.array(idx_a + idx_b))])
    for k, v in t2.model.state_dict().items():
        torch.testing.assert_close(v, accumulated[k], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", ["plain", "device"])
def test_out_of_memory_batch_is_skipped_and_counted(tmp_path, kind):
    t = trainer_for(tmp_path, "train.max_steps=3", "train.valid_every=100", f"train.update={kind}")
    out_of_memory_on_call(t.model, 2)
    state = t.fit()
    assert state.step == 3 and state.oom_skipped == 1
    assert '"skipped": "out of memory"' in (tmp_path / "run/train_log.jsonl").read_text()


def test_fp16_overflow_skips_are_not_counted_as_steps(tmp_path):
    from mt.data.download import download as dl

    dl("synthetic", tmp_path / "d")
    # (the GPU's GradScaler where there is one)
    cfg = tiny_config(
        tmp_path / "d", "train.precision=fp16", "train.log_every=1", "train.device=auto"
    )
    t = build_trainer(cfg, tmp_path / "run", log=lambda *_: None)
    assert type(t.update).__name__ == "PlainUpdate"  # (fp16's GradScaler reads the host)
    batches = t.batches()
    assert t.train_step([next(batches)])
    assert t.state.step == 1 and t.scheduler.last_epoch == 1
    weight = t.model.tgt_embed.weight
    handle = weight.register_hook(lambda g: g * float("inf"))  # overflowing gradients
    before = weight.detach().clone()
    assert t.train_step([next(batches)]) is False
    handle.remove()
    assert t.state.step == 1 and t.scheduler.last_epoch == 1  # neither moved
    assert t.state.fp16_skipped == 1
    assert torch.equal(weight.detach(), before)
    assert t.train_step([next(batches)]) and t.state.step == 2
    log = (tmp_path / "run" / "train_log.jsonl").read_text()
    assert '"skipped": "fp16 gradient overflow"' in log
    t.close()


def test_an_update_reads_nothing_from_the_device(tmp_path):
    from mt.runtime.host_syncs import HostSyncs

    # the reference model, as on a GPU (mt/fast's feed-forward on real rows reads lengths)
    t = trainer_for(tmp_path, "train.max_steps=4", "train.valid_every=100",
                    "train.fast_paths=false", "train.update=device")  # fmt: skip
    batches = t.batches()
    t.train_step([next(batches)])  # the first update allocates Adam's state
    batch = [next(batches)]
    with HostSyncs() as syncs:
        assert t.train_step(batch)
    assert syncs.count == 0, syncs.where


def test_a_deferred_nonfinite_update_changes_no_weight_and_is_taken_back(tmp_path):
    t = trainer_for(tmp_path, "train.max_steps=12", "train.valid_every=100", "train.log_every=4",
                 "train.save_every=100", "train.update=device")  # fmt: skip
    poison(t, {2})
    batches = t.batches()
    t.train_step([next(batches)])
    weights = {k: v.clone() for k, v in t.model.state_dict().items()}
    adam = {k: v.clone() for k, v in t.optimizer.state_dict()["state"][0].items()}
    assert t.train_step([next(batches)])  # poisoned: skipped on the device
    assert all(torch.equal(weights[k], v) for k, v in t.model.state_dict().items())
    now = t.optimizer.state_dict()["state"][0]
    assert all(torch.equal(adam[k], now[k]) for k in adam)  # moments and step untouched
    assert t.state.step == 2 and t.scheduler.last_epoch == 2  # not read yet
    t.settle_skips()
    assert t.state.step == 1 and t.scheduler.last_epoch == 1  # taken back
    t.fit()
    assert t.state.step == 12
    recs = [json.loads(x) for x in (tmp_path / "run/train_log.jsonl").read_text().splitlines()]
    assert [r["count"] for r in recs if r.get("skipped") == "non-finite loss"] == [1]
    losses = [r["loss"] for r in recs if "loss" in r]
    assert losses and all(math.isfinite(x) for x in losses)


class _ReplayOverwrites:
    """What a CUDA-graphed step does to memory, on the CPU: each call first writes over
    (with NaN) what the previous call's graphs wrote, its outputs and the gradients its
    backward allocated, as a replay writes into the memory its recording used."""

    def __init__(self, fn):
        self.fn, self.outputs, self.grads_before = fn, [], None

    def __call__(self, model, batch):
        params = list(model.parameters())
        before = self.grads_before or {}  # (the gradients when the previous call began)
        allocated = [
            p.grad
            for p in params
            if p.grad is not None and id(p) in before and p.grad is not before[id(p)]
        ]
        for t in [*self.outputs, *allocated]:
            t.detach().fill_(float("nan"))
        self.grads_before = {id(p): p.grad for p in params}
        out = self.fn(model, batch)
        self.outputs = list(out)
        return out


@pytest.mark.parametrize("accum", [1, 2])
def test_a_cuda_graphed_step_keeps_nothing_a_replay_overwrites(tmp_path, accum):
    """Through CUDA graphs (train.compile with static shapes on a GPU) a replay writes over the
    previous replay's outputs and the gradients its backward allocated: the losses logged and
    the weights after three updates of `accum` batches each equal the eager step's exactly."""
    common = ("model.dropout=0.0", f"train.accum_steps={accum}", "train.update=device")
    eager, graphed = trainer_for(tmp_path / "e", *common), trainer_for(tmp_path / "g", *common)
    graphed.model.load_state_dict(eager.model.state_dict())
    graphed.cuda_graphs = True
    graphed.update.loss = _ReplayOverwrites(graphed.objective.loss)
    batches = [collate(eager.train_data, np.arange(i, i + 8)) for i in range(0, 48, 8)]
    for i in range(0, len(batches), accum):
        assert eager.train_step(batches[i : i + accum])
        assert graphed.train_step(batches[i : i + accum])
    assert torch.equal(torch.stack(graphed.window.sums), torch.stack(eager.window.sums))
    for k, v in graphed.model.state_dict().items():
        assert torch.equal(v, eager.model.state_dict()[k]), k


def test_the_plain_update_is_never_replayed_through_cuda_graphs(monkeypatch):
    """The plain update's backward adds a micro-batch's gradients into the previous one's,
    which a CUDA graph's replay would have overwritten (the fake above fails it at accum 2):
    on a GPU with static shapes it compiles without graphs, the device update with them."""
    from types import SimpleNamespace

    from mt.train.update import compiled

    monkeypatch.setattr(compiled, "compiled", lambda loss, static, graphs: (static, graphs))
    cfg = SimpleNamespace(compile=True, shape_buckets=0, pack_width=64)
    objective, gpu = SimpleNamespace(loss=None), torch.device("cuda")
    for kind, graphs in (("device", True), ("plain", False)):
        step = compiled.compiled_step(objective, cfg, None, gpu, graphs=kind == "device")
        assert step == (graphs, (True, graphs)), kind


def _stop_after_update(t, kind: str, at: int) -> None:
    """Stop `t` after its update `at` (counting forward calls), as Ctrl-C does (the signal
    handler's flag) or as the time budget does (a clock a minute on from then)."""
    real, calls = t.model.decode, [0]

    def decode(*a, **k):
        calls[0] += 1
        if calls[0] == at and kind == "ctrl-c":
            t.stop_signal = signal.SIGINT
        return real(*a, **k)

    t.model.decode = decode
    if kind == "budget":
        t.budget.clock = lambda: 60.0 if calls[0] >= at else 0.0


@pytest.mark.parametrize("kind", ["ctrl-c", "budget"])
def test_a_skip_deferred_on_the_device_is_settled_before_a_stop_saves(tmp_path, kind):
    """Update 3 poisoned and skipped on the device, the run stopped after update 5 (before the
    host's next read of the skipped count): last.pt holds step 4 with Adam's and the
    schedule's 4 updates, and the resumed run's counts agree to its end."""
    common = ("train.max_steps=8", "train.valid_every=100", "train.log_every=100",
              "train.save_every=100", "train.average_last=0", "train.update=device")  # fmt: skip

    def updates(ckpt) -> tuple:
        adam = {int(s["step"]) for s in ckpt["optimizer"]["state"].values()}
        return ckpt["train_state"]["step"], adam, ckpt["scheduler"]["last_epoch"]

    first = trainer_for(tmp_path, *common, "train.max_minutes=1")
    poison(first, {3})
    _stop_after_update(first, kind, 5)
    first.fit()
    first.close()
    assert first.state.batch_in_epoch == 5  # five batches taken
    assert updates(checkpoint.load(tmp_path / "run/last.pt")) == (4, {4}, 4)
    resumed = trainer_for(tmp_path, *common, "train.max_minutes=0")
    assert resumed.state.step == 4
    resumed.fit()
    resumed.close()
    assert resumed.state.batch_in_epoch == 9  # one batch skipped in all
    assert updates(checkpoint.load(tmp_path / "run/last.pt")) == (8, {8}, 8)
