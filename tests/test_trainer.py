import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mt.artifacts import checkpoint
from mt.data.batching import collate
from mt.errors import MTError
from tests.conftest import (
    EXACT_ADAM,
    ROOT,
    poison,
    run_mt,
    start_training,
    trainer_for,
    window_losses,
)


def test_an_update_sets_the_training_mode_only_when_it_changed(tmp_path, monkeypatch):
    """Module.train walks every module: an update calls it only after something (validation)
    left the model in eval mode."""
    t = trainer_for(tmp_path, "train.valid_every=100")
    batches = t.batches()
    t.train_step([next(batches)])
    calls, real = [], torch.nn.Module.train
    monkeypatch.setattr(
        torch.nn.Module, "train", lambda self, mode=True: calls.append(mode) or real(self, mode)
    )
    t.train_step([next(batches)])
    assert calls == []
    t.model.eval()  # (as validation leaves it)
    t.train_step([next(batches)])
    assert all(m.training for m in t.model.modules())


def test_training_stops_after_k_nonfinite_in_a_row(tmp_path):
    t = trainer_for(
        tmp_path,
        "train.max_steps=20",
        "train.save_every=5",
        "train.valid_every=100",
        "train.max_nonfinite=3",
    )
    poison(t, set(range(8, 100)))
    with pytest.raises(MTError, match="NaN/inf for 3 updates in a row at step 7"):
        t.fit()
    good = checkpoint.load(tmp_path / "run/last.pt")
    assert good["train_state"]["step"] == 5
    assert all(torch.isfinite(v).all() for v in good["model"].values() if v.is_floating_point())


def test_run_dir_records_versions_and_commit(tmp_path):
    import json

    trainer_for(tmp_path, "train.max_steps=1")

    info = json.loads((tmp_path / "run/run_info.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert info["torch"] == torch.__version__
    assert info["git_commit"] == (head.stdout.strip() or None)  # the code that trained
    assert (tmp_path / "run/config.yaml").is_file()


def test_unwritable_run_dir_is_reported_before_training(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(MTError, match="not writable"):
        trainer_for(tmp_path / "file")


@pytest.mark.slow
def test_compiled_training_takes_the_same_steps(tmp_path):
    """train.compile: true (torch.compile, dynamic shapes) gives the same losses and updates
    as eager within float tolerance, on batches of different shapes (dropout off)."""

    eager = trainer_for(tmp_path / "e", "model.dropout=0.0")
    compiled = trainer_for(tmp_path / "c", "model.dropout=0.0", "train.compile=true")
    compiled.model.load_state_dict(eager.model.state_dict())
    assert compiled.compiled_loss is not None
    for idx in (range(16), range(16, 40), range(40, 48)):
        batch = [collate(eager.train_data, np.array(list(idx)))]
        assert eager.train_step(batch) and compiled.train_step(batch)
    torch.testing.assert_close(window_losses(compiled), window_losses(eager), rtol=1e-5, atol=0)
    # the log line says its window compiled (its seconds are not the steady rate's)
    assert compiled.window.summary()["compiles"] >= 1
    # Adam turns float-rounding differences in near-zero gradients into steps of up to lr
    # (about 4e-4 here), so the weights agree to a few lr, not to rounding.
    for k, v in compiled.model.state_dict().items():
        torch.testing.assert_close(v, eager.model.state_dict()[k], atol=1e-3, rtol=0)


def test_time_budget_ends_the_run_like_its_last_step(tmp_path):
    """train.max_minutes stops well before max_steps, and the run ends as a finished one:
    validated at the stopping step, last snapshot saved and averaged, best.pt written."""
    import json

    t = trainer_for(
        tmp_path,
        "train.max_steps=100000",
        "train.max_minutes=0.002",
        "train.valid_every=100000",
        "train.save_every=100000",
        "train.keep_checkpoints=2",
        "train.average_last=2",
    )
    t.fit()
    st = t.state
    assert 0 < st.step < 100000 and st.train_seconds >= 0.12
    records = [json.loads(x) for x in (tmp_path / "run/train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "valid_loss" in r] == [st.step]
    assert checkpoint.load(tmp_path / "run/best.pt")["train_state"]["step"] == st.step
    assert checkpoint.load(tmp_path / "run/last.pt")["train_state"]["step"] == st.step


def test_log_lines_time_the_updates_apart_from_the_validations(tmp_path, monkeypatch):
    """A log line's `seconds` (and its tok_s) count the window's updates, not a validation
    inside it: with every validation taking a second longer, no window of 4 tiny updates
    takes a second; its tokens over its seconds are its tok_s."""
    from mt.train.validation import Validator

    slow = Validator.validate

    def validate(self, st):
        time.sleep(1.0)
        return slow(self, st)

    monkeypatch.setattr(Validator, "validate", validate)
    t = trainer_for(tmp_path, "train.max_steps=12", "train.log_every=4", "train.valid_every=4")
    t.fit()
    rows = [json.loads(x) for x in (tmp_path / "run/train_log.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "tok_s" in r]
    assert [r["step"] for r in logged] == [4, 8, 12]
    assert all(0 < r["seconds"] < 1.0 for r in logged), logged
    assert all(r["tok_s"] == pytest.approx(r["tokens"] / r["seconds"], rel=0.01) for r in logged)
    assert not any("compiles" in r for r in logged)  # (eager: no graph made)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_tracks_fp32(tmp_path, monkeypatch, precision):
    """train.precision bf16/fp16 runs the GPU's code path (autocast, PyTorch's own kernels, a
    GradScaler for fp16) on CPU: the fused fp32 CPU paths step aside, the losses follow
    fp32's within low-precision rounding, and the weights and checkpoint stay fp32."""

    from mt.fast import modules

    full = trainer_for(tmp_path / "fp32", "model.dropout=0.0")
    mixed = trainer_for(tmp_path / precision, "model.dropout=0.0", f"train.precision={precision}")
    mixed.model.load_state_dict(full.model.state_dict())
    batches = [
        [collate(full.train_data, np.array(list(range(i, i + 16))))] for i in range(0, 96, 16)
    ]
    for b in batches:
        assert full.train_step(b)

    def no_fused(*_):
        raise AssertionError("the fused fp32 CPU path ran under autocast")

    monkeypatch.setattr(modules, "feed_forward", no_fused)
    monkeypatch.setattr(modules, "add_norm", no_fused)
    monkeypatch.setattr(modules, "attention_out", no_fused)
    for b in batches:
        assert mixed.train_step(b)
    full_loss, mixed_loss = window_losses(full), window_losses(mixed)
    assert not torch.equal(full_loss, mixed_loss)  # really in low precision
    torch.testing.assert_close(mixed_loss, full_loss, rtol=5e-3, atol=0)  # seen: 2e-4
    assert {p.dtype for p in mixed.model.parameters()} == {torch.float32}
    mixed.checkpoints.save("last.pt", mixed.state)
    mixed.checkpoints.wait()
    saved = checkpoint.load(tmp_path / precision / "run/last.pt")
    assert saved["scaler"].get("scale", None) == (65536.0 if precision == "fp16" else None)


def test_tensorboard_events_hold_the_logged_scalars(tmp_path):
    """train.tensorboard: the event files hold what train_log.jsonl holds (training loss,
    validation BLEU, the tuning grid) at the same steps."""
    import json

    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = trainer_for(
        tmp_path,
        "train.max_steps=6",
        "train.valid_every=3",
        "train.tensorboard=true",
        "decode.tune_beams=[1,2]",
    )
    t.fit()
    t.close()
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    log = [json.loads(x) for x in (tmp_path / "run/train_log.jsonl").read_text().splitlines()]
    train = [(r["step"], r["loss"]) for r in log if "loss" in r]
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("train/loss")] == train
    valid = [(r["step"], r["valid_bleu"]) for r in log if "valid_loss" in r]
    assert [(e.step, round(e.value, 2)) for e in events.Scalars("valid/bleu")] == valid
    assert "tune/beam_1_length_penalty_1.0" in tags and "tune/beam_2_length_penalty_1.0" in tags


def test_cooldown_brings_the_learning_rate_down_to_zero_at_the_last_step(tmp_path):
    """train.cooldown 0.5 over 10 updates: the Noam rate until update 5, then a straight line
    that reaches 0 where the budget ends (the rate logged after update k is update k+1's)."""
    import json

    from mt.train.update.schedule import noam

    t = trainer_for(tmp_path, "train.max_steps=10", "train.cooldown=0.5", "train.valid_every=100")
    t.fit()
    logged = {
        r["step"]: r["lr"]
        for r in map(json.loads, (tmp_path / "run/train_log.jsonl").read_text().splitlines())
        if "lr" in r
    }
    assert sorted(logged) == [2, 4, 6, 8, 10]
    ratio = {k: logged[k] / noam(k + 1, 1, t.cfg.warmup, t.cfg.lr_factor) for k in logged}
    flat = ratio[2]  # d_model ** -0.5
    assert ratio[4] == pytest.approx(flat)
    assert ratio[6] == pytest.approx(0.8 * flat) and ratio[8] == pytest.approx(0.4 * flat)
    assert logged[10] == 0.0


class _Run:
    """A run's clock and compile count for a Forecast: `steps(n, each)` makes n updates of
    `each` seconds, the first compiling where asked, and returns the last forecast made."""

    def __init__(self, max_steps=30_000, budget=3600.0, valid_every=0):
        from mt.train.progress import Forecast

        self.now, self.graphs, self.step, self.syncs = 0.0, 0, 0, 0
        self.max_steps, self.budget = max_steps, budget
        self.f = Forecast(
            0,
            clock=lambda: self.now,
            sync=self._sync,
            compiles=lambda: self.graphs,
            valid_every=valid_every,
        )

    def validate(self, seconds):
        self.now += seconds
        self.f.validated(seconds)

    def _sync(self):
        self.syncs += 1

    def steps(self, n, each, compiles=False, log_every=100):
        end = None
        for i in range(n):
            self.now += each
            self.step += 1
            self.graphs += compiles and i == 0
            got = self.f.update(self.step, self.now, self.max_steps, self.budget,
                                self.step % log_every == 0)  # fmt: skip
            end = got if got is not None else end
        return end


def test_a_forecast_measures_the_steady_rate_after_the_compile():
    """A first update that compiles for 40 s, then 0.01 s updates: the forecast is the
    steady rate's (max_steps within the hour), not the 27-hour one of the first updates;
    nothing is forecast before the window after the compile is long enough, and a compile
    later (validation's decoder step) opens a new window."""
    run = _Run()
    assert run.steps(1, 40.0, compiles=True) is None
    assert run.steps(3, 0.01) is None  # warm-up: no window yet
    assert run.steps(100, 0.01) is None  # 5 steps but under 5 s: no forecast yet
    assert run.steps(500, 0.01) == 30_000  # 300 s at 0.01 s/update fits the budget
    assert run.f.sec_per_step == pytest.approx(0.01) and run.f.done
    assert run.syncs == 3  # the window's opening, the first forecast, step 600's log line
    short = _Run(budget=120.0)
    short.steps(1, 40.0, compiles=True)
    while not short.f.done:
        end = short.steps(1, 0.01)
    assert end == short.step + int((120.0 - short.now) / 0.01)  # the budget's end, steady rate
    run.steps(1, 30.0, compiles=True)  # a compile: the window opens again after it
    assert run.steps(3, 0.02, log_every=1) is None  # warm-up: no revision
    assert run.steps(200, 0.02, log_every=1) is None  # not 5 s in the window yet
    assert run.steps(400, 0.02, log_every=1) == 30_000  # revised from the new window
    assert run.f.sec_per_step == pytest.approx(0.02)


def test_a_forecast_leaves_validations_out_of_the_rate_and_pays_them_from_the_budget():
    """0.01 s updates with a 30 s validation (its decoder compile) and a 3 s one inside the
    window: the rate is the updates' own (it was 0.074 s), the line says what a validation
    takes, and a budget's end counts one validation (the latest's 3 s) every 500 updates."""
    run = _Run(budget=120.0, valid_every=500)
    run.steps(4, 0.01)  # (warm-up: the window opens)
    run.steps(100, 0.01)
    run.validate(30.0)
    run.steps(396, 0.01)
    run.validate(3.0)
    end = run.steps(100, 0.01, log_every=100)
    assert run.f.sec_per_step == pytest.approx(0.01)
    per_step = 0.01 + 3.0 / 500
    assert end == run.step + int((120.0 - run.now) / per_step)
    assert "(a validation: 3.0 s)" in run.f.describe(30_000, 10)


def test_forecast_is_revised_at_log_lines():
    """Later forecasts come at log lines, from the window's rate: a run that slows down is
    forecast to end earlier under its budget; without a budget it ends at max_steps."""
    run = _Run(budget=1000.0)
    run.steps(104, 0.1, log_every=1000)
    assert run.f.done
    first = run.f.end_step
    assert run.steps(99, 0.1, log_every=1000) is None  # no log line: no revision
    end = run.steps(1000, 2.0, log_every=100)  # much slower
    assert end is not None and end < first
    assert _Run(budget=0.0).steps(700, 0.01) == 30_000


def test_a_budget_far_short_of_the_expected_updates_is_said():
    """The 138-minute budget at 2.8 s per update (a busy one-core machine) ends near step
    2,957 of the 14,000 the config's results came from: said, with what to do."""
    from mt.train.progress import Forecast

    clock = [0.0]
    f = Forecast(0, clock=lambda: clock[0], compiles=lambda: 0)
    step = end = 0
    while end is None or not f.done:  # after the warm-up, 5 updates of the window
        step += 1
        clock[0] = 2.8 * step
        end = f.update(step, clock[0], 30_000, 138 * 60.0)
    assert step == Forecast.WARMUP_STEPS + Forecast.MEASURE_STEPS
    assert end == step + int((138 * 60 - clock[0]) / 2.8)
    msg = f.shortfall(30_000, 138, 14_000)
    assert f"near step {end:,}" in msg and "14,000 updates" in msg
    assert "train.max_minutes=0 train.max_steps=14000" in msg and "10 h 53 min" in msg
    assert f.shortfall(30_000, 138, 0) is None  # the config names no expectation
    fast = Forecast(0, clock=lambda: clock[0], compiles=lambda: 0)
    for step in range(1, 26):  # 0.4 s per update: 20,700 updates
        clock[0] = 0.4 * step
        fast.update(step, clock[0], 30_000, 138 * 60.0)
    assert fast.done
    assert fast.shortfall(30_000, 138, 14_000) is None
    assert fast.shortfall(3_000, 138, 14_000) is None  # max_steps itself is the choice


def test_mt_train_says_when_the_budget_falls_short_of_the_expected_updates(tmp_path):
    proc = run_mt(
        "train", "tiny", "--run-dir", tmp_path / "r", "--set", f"data.dir={tmp_path / 'd'}",
        "train.max_steps=100000", "train.max_minutes=0.25", "train.expected_steps=100000",
        "train.valid_every=100000", "train.average_last=0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "far short of the 100,000 updates" in proc.stderr, proc.stderr
    assert "train.max_steps=100000" in proc.stderr


def test_ctrl_c_twice_says_what_was_lost(tmp_path):
    run, data = tmp_path / "run", tmp_path / "data"
    # a slow update (a wide model), so that the second signal lands inside the same update
    proc = start_training(
        run,
        data,
        "model.d_model=512",
        "model.d_ff=4096",
        "train.max_tokens=8000",
    )
    deadline = time.time() + 180
    while not (run / "train_log.jsonl").exists() and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    # two signals within one C call would reach Python as one: send the second once the
    # first has been handled (it says so at once)
    seen = ""
    while "Ctrl-C again" not in seen and time.time() < deadline:
        seen += os.read(proc.stderr.fileno(), 4096).decode(errors="replace")
    proc.send_signal(signal.SIGINT)
    _rest, err = proc.communicate(timeout=120)
    err = seen + err
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted twice" in err and "lost" in err and "run the same command" in err


def test_same_config_and_seed_give_the_same_loss_curve(tmp_path):
    def curve(run):
        proc = run_mt(
            "train",
            ROOT / "configs/tiny.yaml",
            "--run-dir",
            tmp_path / run,
            "--set",
            f"data.dir={tmp_path / 'd'}",
            "train.max_steps=30",
            "train.log_every=5",
            "train.valid_every=30",
            "model.dropout=0.1",
        )
        assert proc.returncode == 0, proc.stderr
        recs = [
            json.loads(x) for x in (tmp_path / run / "train_log.jsonl").read_text().splitlines()
        ]
        return [(r["step"], r["loss"], r["nll"]) for r in recs if "loss" in r]

    first = curve("a")
    assert len(first) == 6 and first == curve("b")
    info = json.loads((tmp_path / "a/run_info.json").read_text())
    assert info["torch"] == torch.__version__


def test_a_second_ctrl_c_while_the_picture_is_drawn_is_not_swallowed(tmp_path, monkeypatch):
    """Drawing training.png never stops a run, except that a second Ctrl-C (Interrupted)
    stops it at once, with its own message and exit status 130, not a warning. (The end's
    drawing, in the caller, here: the signal that raises it runs in the main thread, so a
    drawing on its own thread never takes it.)"""
    from mt.errors import Interrupted
    from mt.evaluate import plot
    from mt.train.finish import draw_training_picture
    from mt.train.progress import lost_work_message

    said = []

    def broken(_run_dir):
        raise ValueError("no log yet")

    monkeypatch.setattr(plot, "plot_run", broken)
    draw_training_picture(tmp_path, said.append, wait=True)
    assert said and "could not draw training.png" in said[0]

    def second_ctrl_c(_run_dir):
        raise Interrupted(lost_work_message(40, 40))

    monkeypatch.setattr(plot, "plot_run", second_ctrl_c)
    with pytest.raises(Interrupted, match=r"after last\.pt was saved"):
        draw_training_picture(tmp_path, said.append, wait=True)
    assert len(said) == 1
    assert "are lost" in lost_work_message(45, 40) and "step 40" in lost_work_message(45, 40)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this machine")
def test_a_full_disk_under_the_training_log_is_one_line(tmp_path):
    """The log is appended to (never renamed over): here through a link to /dev/full, which
    answers every write with ENOSPC."""
    from mt.train.tracking import RunLog

    (tmp_path / "train_log.jsonl").symlink_to("/dev/full")
    with pytest.raises(MTError, match=r"could not write .*train_log\.jsonl: the disk is full"):
        RunLog(tmp_path).write({"step": 1, "loss": 2.0})


def test_compiled_training_on_bucketed_batches_compiles_each_shape_once(tmp_path, monkeypatch):
    """train.compile with train.shape_buckets: the model and the loss in one graph per batch
    shape (static shapes, no graph break), the bookkeeping after the backward in one more, the
    same losses as eager (aot_eager keeps it quick)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from mt.data.batching import batch_shapes, bucket_batches
    from mt.train.update.exchange import settle

    real_compile = torch.compile
    seen = []

    def aot_eager(fn, **kw):
        seen.append({**kw, "fn": fn})
        return real_compile(fn, backend="aot_eager", **kw)

    monkeypatch.setattr(torch, "compile", aot_eager)
    torch._dynamo.reset()
    counters.clear()
    common = ("model.dropout=0.0", "train.shape_buckets=8", "train.update=device")
    eager = trainer_for(tmp_path / "e", *common)
    comp = trainer_for(tmp_path / "c", *common, "train.compile=true")
    comp.model.load_state_dict(eager.model.state_dict())
    assert seen == [  # the loss, model inside; then settle
        {"dynamic": False, "fn": comp.objective.loss},
        {"dynamic": False, "fullgraph": True, "fn": settle},
    ]
    data = eager.train_data
    batches = bucket_batches(data.src.lengths + 1, data.tgt.lengths + 1, 2000, 8, seed=0)
    by_shape: dict = {}
    for b in batches:
        (key,) = batch_shapes(data.src.lengths, data.tgt.lengths, [b], 8)
        by_shape.setdefault(key, []).append(b)
    firsts = [bs[0] for bs in by_shape.values()]
    assert len(firsts) == 2  # the synthetic task's widths at multiples of 8
    for b in [*firsts, firsts[0], by_shape[next(iter(by_shape))][-1]]:  # the first shape again
        batch = [collate(data, b, multiple=8)]
        assert eager.train_step(batch) and comp.train_step(batch)
    torch.testing.assert_close(window_losses(comp), window_losses(eager), rtol=1e-5, atol=0)
    assert counters["stats"]["unique_graphs"] == 2 + 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()


def test_static_shapes_on_a_gpu_compile_into_cuda_graphs(monkeypatch):
    """compiled(): CUDA graphs (reduce-overhead) for static shapes on a GPU only; dynamic shapes
    compile once for all shapes, without graphs (one graph per shape would be recorded)."""
    from mt.train.update.compiled import compiled

    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw))
    compiled(len, static_shapes=True, cuda_graphs=True)
    compiled(len, static_shapes=True, cuda_graphs=False)
    compiled(len, static_shapes=False, cuda_graphs=True)
    assert seen == [
        {"dynamic": False, "mode": "reduce-overhead"},
        {"dynamic": False},
        {"dynamic": True},
    ]


def test_a_run_resumed_with_compile_on_continues_the_same_schedule(tmp_path, monkeypatch):
    """Trained eagerly for 6 updates, then resumed with train.compile (aot_eager here) to 12:
    the same updates, learning rates and losses as 12 eager updates in one go (dropout off,
    bucketed batches), from the same saved position in the data."""
    import json

    import torch._dynamo

    real_compile = torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda fn, **kw: real_compile(fn, backend="aot_eager", **kw)
    )
    common = ("model.dropout=0.0", "train.shape_buckets=8", "train.log_every=1",
              "train.valid_every=100", "train.save_every=6", *EXACT_ADAM)  # fmt: skip

    def log(run):
        rows = [json.loads(x) for x in (run / "run/train_log.jsonl").read_text().splitlines()]
        return [(r["step"], r["lr"], r["loss"]) for r in rows if "loss" in r]

    trainer_for(tmp_path / "whole", *common, "train.max_steps=12").fit()
    trainer_for(tmp_path / "split", *common, "train.max_steps=6").fit()
    torch._dynamo.reset()
    resumed = trainer_for(tmp_path / "split", *common, "train.max_steps=12", "train.compile=true")
    assert resumed.compiled_loss is not None and resumed.state.step == 6
    resumed.fit()
    whole, split = log(tmp_path / "whole"), log(tmp_path / "split")
    assert [(s, lr) for s, lr, _ in split] == [(s, lr) for s, lr, _ in whole]
    for (_, _, a), (_, _, b) in zip(split, whole, strict=True):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (a, b)
    torch._dynamo.reset()


def test_import_mt_changes_no_environment_and_training_asks_for_huge_pages(tmp_path, monkeypatch):
    """`import mt` has no side effects; the allocator's huge-pages setting is made where
    training starts, and a user's own value is kept."""
    code = (
        "import os; before = dict(os.environ); import mt, mt.cli.app; print(before == os.environ)"
    )
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    proc = subprocess.run(["python", "-c", code], capture_output=True, text=True, env=env)
    assert proc.stdout.strip() == "True", proc.stderr
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    trainer_for(tmp_path / "a", "train.max_steps=1").close()
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "1"
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    trainer_for(tmp_path / "b", "train.max_steps=1").close()
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "0"


def _saved_after_one_update(tmp_path):
    """A trainer after one update and its last.pt, written; and its batches."""
    t = trainer_for(tmp_path, "train.max_steps=4", "train.valid_every=100")
    batches = t.batches()
    t.train_step([next(batches)])
    t.settle_skips()
    t.checkpoints.save("last.pt", t.state)
    t.checkpoints.wait()
    return t, batches


def test_checkpoints_are_written_in_the_background_from_a_copy_and_count_once_renamed(
    tmp_path, monkeypatch
):
    """save() returns while a background thread writes; the file holds the weights of the
    moment it was asked for, not those of the updates made meanwhile; last.pt counts
    (last_step, what a second Ctrl-C reports) only once it replaced the old one."""
    import threading

    t, batches = _saved_after_one_update(tmp_path)
    assert t.checkpoints.last_step == 1
    asked = {k: v.clone() for k, v in t.model.state_dict().items()}
    t.train_step([next(batches)])
    t.settle_skips()
    real, gate, where = checkpoint.atomic_save, threading.Event(), []

    def slow_save(obj, path, keep_previous=False):
        where.append(threading.current_thread().name)
        assert gate.wait(10)
        real(obj, path, keep_previous)

    monkeypatch.setattr(checkpoint, "atomic_save", slow_save)
    t.checkpoints.save("last.pt", t.state)  # returns while the thread waits at the gate
    at_save = {k: v.clone() for k, v in t.model.state_dict().items()}
    t.train_step([next(batches)])  # the live weights move on
    assert t.checkpoints.last_step == 1  # not yet renamed: not yet counted
    assert not torch.equal(at_save["src_embed.weight"], t.model.state_dict()["src_embed.weight"])
    gate.set()
    t.checkpoints.wait()
    assert where and where[0].startswith("mt-checkpoints")
    assert t.checkpoints.last_step == 2
    saved = checkpoint.weights_of(checkpoint.load(tmp_path / "run/last.pt"))
    assert all(torch.equal(saved[k], at_save[k]) for k in at_save)
    # tied embeddings stay one tensor in the file (the copy keeps them tied)
    assert saved["src_embed.weight"].data_ptr() == saved["tgt_embed.weight"].data_ptr()
    previous = checkpoint.weights_of(checkpoint.load(tmp_path / "run/last.pt.prev"))
    assert all(torch.equal(previous[k], asked[k]) for k in asked)
    t.close()


def test_a_checkpoint_write_that_fails_leaves_the_previous_file_and_is_reported(
    tmp_path, monkeypatch
):
    """A write that dies mid-file (here torch.save raising, as a full disk would) leaves the
    last.pt before it, does not count, and is one line at the next save."""
    t, batches = _saved_after_one_update(tmp_path)
    before = (tmp_path / "run/last.pt").read_bytes()
    t.train_step([next(batches)])
    t.settle_skips()

    def dies(obj, f):
        f.write(b"PK\x03\x04 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", dies)
    t.checkpoints.save("last.pt", t.state)
    with pytest.raises(MTError, match="No space left on device") as e:
        t.checkpoints.wait()
    assert "last.pt" in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "run/last.pt").read_bytes() == before
    assert t.checkpoints.last_step == 1
    assert not list((tmp_path / "run").glob(".last.pt.*"))  # no temp file left behind
    t.close()
