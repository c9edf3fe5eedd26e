import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mt.artifacts import checkpoint
from mt.config import load_config
from mt.data.batching import collate
from mt.errors import MTError
from mt.train.build import build_trainer
from tests.conftest import (
    EXACT_ADAM,
    ROOT,
    out_of_memory_on_call,
    run_mt,
    start_training,
    tiny_config,
    window_losses,
)


def _trainer(tmp_path, *overrides):
    # on the CPU on every machine: the tests feed CPU batches to train_step, and on a GPU
    # machine "auto" would put the model on the GPU (a test means the same there as in CI;
    # tests/test_cuda.py takes the GPU's paths)
    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        [f"data.dir={tmp_path / 'd'}", "train.log_every=2", "train.device=cpu", *overrides],
    )
    return build_trainer(cfg, tmp_path / "run", log=lambda *_: None)


def _poison(trainer, bad_calls):
    """Make the model's output NaN on the given forward calls (1-based)."""
    real, calls = trainer.model.decode, [0]

    def forward(*a, **k):
        calls[0] += 1
        out = real(*a, **k)
        return out * float("nan") if calls[0] in bad_calls else out

    trainer.model.decode = forward


def test_an_update_sets_the_training_mode_only_when_it_changed(tmp_path, monkeypatch):
    """Module.train walks every module: an update calls it only after something (validation)
    left the model in eval mode."""
    t = _trainer(tmp_path, "train.valid_every=100")
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
    t = _trainer(
        tmp_path,
        "train.max_steps=20",
        "train.save_every=5",
        "train.valid_every=100",
        "train.max_nonfinite=3",
    )
    _poison(t, set(range(8, 100)))
    with pytest.raises(MTError, match="NaN/inf for 3 updates in a row at step 7"):
        t.fit()
    good = checkpoint.load(tmp_path / "run/last.pt")
    assert good["train_state"]["step"] == 5
    assert all(torch.isfinite(v).all() for v in good["model"].values() if v.is_floating_point())


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
    """Two batches accumulated into one update == one update on their union (dropout off; no
    clipping, which would hide a wrong scale)."""

    t = _trainer(tmp_path, "model.dropout=0.0", "train.clip_norm=0")
    idx_a, idx_b = list(range(16)), list(range(16, 32))
    state0 = {k: v.clone() for k, v in t.model.state_dict().items()}
    opt0 = t.optimizer.state_dict()
    t.train_step([collate(t.train_data, np.array(idx_a)), collate(t.train_data, np.array(idx_b))])
    accumulated = {k: v.clone() for k, v in t.model.state_dict().items()}
    t2 = _trainer(tmp_path / "2", "model.dropout=0.0", "train.clip_norm=0")
    t2.model.load_state_dict(state0)
    t2.optimizer.load_state_dict(opt0)
    t2.train_step([collate(t2.train_data, np.array(idx_a + idx_b))])
    for k, v in t2.model.state_dict().items():
        torch.testing.assert_close(v, accumulated[k], atol=2e-6, rtol=1e-5)


def test_out_of_memory_batch_is_skipped_and_counted(tmp_path):
    t = _trainer(tmp_path, "train.max_steps=3", "train.valid_every=100")
    out_of_memory_on_call(t.model, 2)
    state = t.fit()
    assert state.step == 3 and state.oom_skipped == 1
    assert '"skipped": "out of memory"' in (tmp_path / "run/train_log.jsonl").read_text()


def test_run_dir_records_versions_and_commit(tmp_path):
    import json

    _trainer(tmp_path, "train.max_steps=1")

    info = json.loads((tmp_path / "run/run_info.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert info["torch"] == torch.__version__
    assert info["git_commit"] == (head.stdout.strip() or None)  # the code that trained
    assert (tmp_path / "run/config.yaml").is_file()


def test_unwritable_run_dir_is_reported_before_training(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(MTError, match="not writable"):
        _trainer(tmp_path / "file")


@pytest.mark.slow
def test_compiled_training_takes_the_same_steps(tmp_path):
    """train.compile: true (torch.compile, dynamic shapes) gives the same losses and updates
    as eager within float tolerance, on batches of different shapes (dropout off)."""

    eager = _trainer(tmp_path / "e", "model.dropout=0.0")
    compiled = _trainer(tmp_path / "c", "model.dropout=0.0", "train.compile=true")
    compiled.model.load_state_dict(eager.model.state_dict())
    assert compiled.compiled_loss is not None
    for idx in (range(16), range(16, 40), range(40, 48)):
        batch = [collate(eager.train_data, np.array(list(idx)))]
        assert eager.train_step(batch) and compiled.train_step(batch)
    torch.testing.assert_close(window_losses(compiled), window_losses(eager), rtol=1e-5, atol=0)
    # Adam turns float-rounding differences in near-zero gradients into steps of up to lr
    # (about 4e-4 here), so the weights agree to a few lr, not to rounding.
    for k, v in compiled.model.state_dict().items():
        torch.testing.assert_close(v, eager.model.state_dict()[k], atol=1e-3, rtol=0)


def test_time_budget_ends_the_run_like_its_last_step(tmp_path):
    """train.max_minutes stops well before max_steps, and the run ends as a finished one:
    validated at the stopping step, last snapshot saved and averaged, best.pt written."""
    import json

    t = _trainer(
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


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_tracks_fp32(tmp_path, monkeypatch, precision):
    """train.precision bf16/fp16 runs the GPU's code path (autocast, PyTorch's own kernels, a
    GradScaler for fp16) on CPU: the fused fp32 CPU paths step aside, the losses follow
    fp32's within low-precision rounding, and the weights and checkpoint stay fp32."""

    from mt.fast import modules

    full = _trainer(tmp_path / "fp32", "model.dropout=0.0")
    mixed = _trainer(tmp_path / precision, "model.dropout=0.0", f"train.precision={precision}")
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

    t = _trainer(
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

    from mt.train.schedule import noam

    t = _trainer(tmp_path, "train.max_steps=10", "train.cooldown=0.5", "train.valid_every=100")
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


def test_with_bpe_dropout_the_start_up_log_counts_the_segmentation_epoch_0_trains_on(tmp_path):
    """With train.bpe_dropout the plain segmentation is never encoded: the counts logged at
    start-up (pairs kept, pairs longer than data.max_len) are those of epoch 0's dropout
    segmentation, the data the first epoch walks."""
    first = _trainer(tmp_path)  # the same run directory: the same BPE model
    plain = first.train_data
    first.close()
    fits = int(max(plain.src.lengths.max(), plain.tgt.lengths.max())) + 1
    assert plain.stats.too_long == 0  # every plain pair fits data.max_len=fits
    logged = []
    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        [f"data.dir={tmp_path / 'd'}", "train.bpe_dropout=0.1", f"data.max_len={fits}"],
    )
    t = build_trainer(cfg, tmp_path / "run", log=lambda *a, **_: logged.extend(map(str, a)))
    epoch0 = t.epoch_data(0)
    t.close()
    assert epoch0.stats.too_long > 0  # dropout's longer segmentations do not fit
    assert epoch0.stats.describe("train") in logged


def test_bpe_dropout_segments_each_epoch_anew_and_the_same_on_every_rank_and_resume(tmp_path):
    """train.bpe_dropout (Provilkov et al. 2020): each epoch trains on a new segmentation of
    the same text (it decodes to the same sentences, in more pieces than the deterministic
    segmentation); an epoch's segmentation depends on (seed, epoch) alone, so another rank or
    a resumed run gets the same batches at the same (epoch, position)."""
    first = _trainer(tmp_path)  # the same run directory: the same BPE model
    plain = first.train_data
    first.close()
    t = _trainer(tmp_path, "train.bpe_dropout=0.1", "train.max_tokens=256")
    assert t.train_data is None  # no second copy of the split in the plain segmentation

    def seqs(arr):
        return [arr[i].tolist() for i in range(len(arr))]

    e0, e1 = t.epoch_data(0), t.epoch_data(1)  # e0: prepare_data's encoding; then re-encoded
    assert seqs(t.epoch_data(0).src) == seqs(e0.src) and seqs(t.epoch_data(0).tgt) == seqs(e0.tgt)
    assert seqs(e0.tgt) != seqs(e1.tgt) and seqs(e0.src) != seqs(plain.src)
    assert t.tokenizer.decode_tgt(seqs(e0.tgt)) == t.tokenizer.decode_tgt(seqs(plain.tgt))
    assert t.tokenizer.src.Decode(seqs(e1.src)) == t.tokenizer.src.Decode(seqs(plain.src))
    assert e0.tgt.lengths.sum() > plain.tgt.lengths.sum()

    asked, epoch_data = [], t.epoch_data
    t.epoch_data = lambda epoch: asked.append(epoch) or epoch_data(epoch)
    batches = t.batches()
    while (t.state.epoch, t.state.batch_in_epoch) != (1, 2):
        next(batches)
    first = [next(batches) for _ in range(3)]
    assert asked == [0, 1]  # the trainer walks each epoch's own data
    t.close()
    again = _trainer(tmp_path, "train.bpe_dropout=0.1", "train.max_tokens=256")
    again.state.epoch, again.state.batch_in_epoch = 1, 2  # where a resume would start
    second = [b for b, _ in zip(again.batches(), range(3), strict=False)]
    again.close()
    assert all(
        torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
        for a, b in zip(first, second, strict=True)
    )


class _Run:
    """A run's clock and compile count for a Forecast: `steps(n, each)` makes n updates of
    `each` seconds, the first compiling where asked, and returns the last forecast made."""

    def __init__(self, max_steps=30_000, budget=3600.0):
        from mt.train.progress import Forecast

        self.now, self.graphs, self.step, self.syncs = 0.0, 0, 0, 0
        self.max_steps, self.budget = max_steps, budget
        self.f = Forecast(0, clock=lambda: self.now, sync=self._sync, compiles=lambda: self.graphs)

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


def _pairs(data) -> set[tuple[tuple[int, ...], tuple[int, ...]]]:
    """A ParallelData's (source, target) pairs as token ids."""
    return {
        (tuple(map(int, data.src[i])), tuple(map(int, data.tgt[i]))) for i in range(len(data.src))
    }


def _rows(batch) -> set[tuple[tuple[int, ...], tuple[int, ...]]]:
    """A batch's (source, target) pairs as token ids, without padding, EOS and BOS."""
    from mt.tokens import EOS, PAD

    def ids(row):
        return tuple(int(x) for x in row if x not in (PAD, EOS))

    return {(ids(s), ids(t)) for s, t in zip(batch.src, batch.tgt_out, strict=True)}


def test_bidirectional_share_trains_both_directions_early_then_one(tmp_path):
    """train.bidirectional_share (BiT, Ding et al. 2021): an epoch that begins while less than
    the share of the budget is spent trains on every pair in both directions (target ->
    source too); an epoch that begins later, on the configured direction alone. An epoch
    keeps the choice it began with, also in a run resumed inside it."""
    from mt.data.corpus import both_directions

    t = _trainer(tmp_path, "train.bidirectional_share=0.5", "train.max_tokens=256")
    data = t.train_data
    forward = _pairs(data)
    backward = {(b, a) for a, b in forward}
    assert backward != forward
    both = both_directions(data)
    assert len(both.src) == 2 * len(data.src)
    assert _pairs(both) == forward | backward

    per_epoch, kept = {}, []  # epoch -> its pairs; epoch 1's batches from position 2
    batches = t.batches()
    while t.state.epoch < 3:
        batch = next(batches)  # (its epoch is state.epoch once it is handed out)
        per_epoch.setdefault(t.state.epoch, set()).update(_rows(batch))
        if (t.state.epoch, t.state.batch_in_epoch) == (1, 2):
            t.budget.progress = 0.6  # past the share inside epoch 1
        elif t.state.epoch == 1 and t.state.batch_in_epoch > 2 and len(kept) < 3:
            kept.append(batch)
    t.close()
    assert per_epoch[0] == per_epoch[1] == forward | backward
    assert per_epoch[2] <= forward and len(kept) == 3

    again = _trainer(tmp_path, "train.bidirectional_share=0.5", "train.max_tokens=256")
    again.state.epoch, again.state.batch_in_epoch = 1, 2  # where a resume would start
    again.state.both_directions, again.budget.progress = True, 0.6  # as last.pt holds them
    resumed = [b for b, _ in zip(again.batches(), range(3), strict=False)]
    again.close()
    assert all(
        torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
        for a, b in zip(kept, resumed, strict=True)
    )


def test_bidirectional_stage_ends_by_the_budget_the_run_spends(tmp_path, capsys):
    """In a real run the share is of the budget actually spent (train.max_steps here): the
    stage ends at the first epoch that begins past it, the run says so, and last.pt records
    which way the epoch it stopped in trains."""
    from mt.data.batching import epoch_batches
    from mt.data.corpus import both_directions

    t = _trainer(
        tmp_path,
        "train.bidirectional_share=0.3",
        "train.max_tokens=2000",
        "train.max_steps=100",
        "train.valid_every=1000",
        "train.save_every=100",
    )
    first_epoch = len(epoch_batches(both_directions(t.train_data), 2000, t.cfg.seed, 0))
    assert 30 < first_epoch < 100  # epoch 0 ends past 30% of the budget
    t.fit()
    t.close()
    err = capsys.readouterr().err
    assert "epoch 0: training on both directions until 30% of the budget" in err
    ended = [line for line in err.splitlines() if "the configured direction only" in line]
    assert len(ended) == 1 and ended[0].startswith(f"step {first_epoch}: ")
    assert checkpoint.load(tmp_path / "run/last.pt")["train_state"]["both_directions"] is False


def test_word_dropout_turns_source_pieces_into_unk_the_same_on_resume(tmp_path):
    """train.word_dropout (Sennrich et al. 2016): a training batch is the plain batch at the
    same (epoch, position) with about that share of its source pieces replaced by <unk>; EOS,
    padding and the target side are untouched; a resumed run puts the same noise on the same
    batch."""
    from mt.tokens import EOS, PAD, UNK

    def walk(trainer, n):
        return [b for b, _ in zip(trainer.batches(), range(n), strict=False)]

    plain = _trainer(tmp_path, "train.max_tokens=256")
    clean = walk(plain, 40)
    plain.close()
    t = _trainer(tmp_path, "train.word_dropout=0.25", "train.max_tokens=256")
    noisy = walk(t, 40)
    t.close()
    real = dropped = 0
    for a, b in zip(clean, noisy, strict=True):
        assert torch.equal(a.tgt_in, b.tgt_in) and torch.equal(a.tgt_out, b.tgt_out)
        changed = a.src != b.src
        assert bool((b.src[changed] == UNK).all())
        assert not bool((changed & ((a.src == PAD) | (a.src == EOS))).any())
        real += int(((a.src != PAD) & (a.src != EOS) & (a.src != UNK)).sum())
        dropped += int(changed.sum())
    assert real > 2000 and 0.22 < dropped / real < 0.28

    again = _trainer(tmp_path, "train.word_dropout=0.25", "train.max_tokens=256")
    again.state.batch_in_epoch = 5  # where a resume inside epoch 0 would start
    resumed = walk(again, 3)
    assert again.state.epoch == 0  # (epoch 0 has more than 8 batches)
    again.close()
    assert all(torch.equal(a.src, b.src) for a, b in zip(noisy[5:8], resumed, strict=True))


def test_fp16_overflow_skips_are_not_counted_as_steps(tmp_path):
    from mt.data.download import download as dl

    dl("synthetic", tmp_path / "d")
    t = build_trainer(
        tiny_config(
            tmp_path / "d", "train.precision=fp16", "train.log_every=1", "train.device=auto"
        ),  # the GPU's GradScaler where there is one
        tmp_path / "run",
        log=lambda *_: None,
    )
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
    stops it at once, with its own message and exit status 130, not a warning."""
    from mt.errors import Interrupted
    from mt.evaluate import plot
    from mt.train.finish import draw_training_picture
    from mt.train.progress import lost_work_message

    said = []

    def broken(_run_dir):
        raise ValueError("no log yet")

    monkeypatch.setattr(plot, "plot_run", broken)
    draw_training_picture(tmp_path, said.append)
    assert said and "could not draw training.png" in said[0]

    def second_ctrl_c(_run_dir):
        raise Interrupted(lost_work_message(40, 40))

    monkeypatch.setattr(plot, "plot_run", second_ctrl_c)
    with pytest.raises(Interrupted, match=r"after last\.pt was saved"):
        draw_training_picture(tmp_path, said.append)
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
    from mt.train.exchange import settle

    real_compile = torch.compile
    seen = []

    def aot_eager(fn, **kw):
        seen.append({**kw, "fn": fn})
        return real_compile(fn, backend="aot_eager", **kw)

    monkeypatch.setattr(torch, "compile", aot_eager)
    torch._dynamo.reset()
    counters.clear()
    common = ("model.dropout=0.0", "train.shape_buckets=8", "train.update=device")
    eager = _trainer(tmp_path / "e", *common)
    comp = _trainer(tmp_path / "c", *common, "train.compile=true")
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


def test_an_update_reads_nothing_from_the_device(tmp_path):
    from mt.runtime.host_syncs import HostSyncs

    # the reference model, as on a GPU (mt/fast's feed-forward on real rows reads lengths)
    t = _trainer(tmp_path, "train.max_steps=4", "train.valid_every=100", "train.fast_paths=false",
                 "train.update=device")  # fmt: skip
    batches = t.batches()
    t.train_step([next(batches)])  # the first update allocates Adam's state
    batch = [next(batches)]
    with HostSyncs() as syncs:
        assert t.train_step(batch)
    assert syncs.count == 0, syncs.where


def test_a_deferred_nonfinite_update_changes_no_weight_and_is_taken_back(tmp_path):
    t = _trainer(tmp_path, "train.max_steps=12", "train.valid_every=100", "train.log_every=4",
                 "train.save_every=100", "train.update=device")  # fmt: skip
    _poison(t, {2})
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
    eager, graphed = _trainer(tmp_path / "e", *common), _trainer(tmp_path / "g", *common)
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

    from mt.train import compiled

    monkeypatch.setattr(compiled, "compiled", lambda loss, static, graphs: (static, graphs))
    cfg = SimpleNamespace(compile=True, shape_buckets=0, pack_width=64)
    objective, gpu = SimpleNamespace(loss=None), torch.device("cuda")
    for kind, graphs in (("device", True), ("plain", False)):
        step = compiled.compiled_step(objective, cfg, None, gpu, graphs=kind == "device")
        assert step == (graphs, (True, graphs)), kind


def test_static_shapes_on_a_gpu_compile_into_cuda_graphs(monkeypatch):
    """compiled(): CUDA graphs (reduce-overhead) for static shapes on a GPU only; dynamic shapes
    compile once for all shapes, without graphs (one graph per shape would be recorded)."""
    from mt.train.compiled import compiled

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

    _trainer(tmp_path / "whole", *common, "train.max_steps=12").fit()
    _trainer(tmp_path / "split", *common, "train.max_steps=6").fit()
    torch._dynamo.reset()
    resumed = _trainer(tmp_path / "split", *common, "train.max_steps=12", "train.compile=true")
    assert resumed.compiled_loss is not None and resumed.state.step == 6
    resumed.fit()
    whole, split = log(tmp_path / "whole"), log(tmp_path / "split")
    assert [(s, lr) for s, lr, _ in split] == [(s, lr) for s, lr, _ in whole]
    for (_, _, a), (_, _, b) in zip(split, whole, strict=True):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (a, b)
    torch._dynamo.reset()


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
              "train.save_every=100", "train.average_last=0")  # fmt: skip

    def updates(ckpt) -> tuple:
        adam = {int(s["step"]) for s in ckpt["optimizer"]["state"].values()}
        return ckpt["train_state"]["step"], adam, ckpt["scheduler"]["last_epoch"]

    first = _trainer(tmp_path, *common, "train.max_minutes=1")
    _poison(first, {3})
    _stop_after_update(first, kind, 5)
    first.fit()
    first.close()
    assert first.state.batch_in_epoch == 5  # five batches taken
    assert updates(checkpoint.load(tmp_path / "run/last.pt")) == (4, {4}, 4)
    resumed = _trainer(tmp_path, *common, "train.max_minutes=0")
    assert resumed.state.step == 4
    resumed.fit()
    resumed.close()
    assert resumed.state.batch_in_epoch == 9  # one batch skipped in all
    assert updates(checkpoint.load(tmp_path / "run/last.pt")) == (8, {8}, 8)


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
    _trainer(tmp_path / "a", "train.max_steps=1").close()
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "1"
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    _trainer(tmp_path / "b", "train.max_steps=1").close()
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "0"


def test_batches_made_ahead_are_the_batches_made_when_asked_for(tmp_path):
    """train.prefetch_batches: a background thread collates ahead, yet every batch, with its
    word dropout, and the position the state holds after it (what last.pt saves) are those of
    the walk that collates each batch when it is asked for, across epochs; a walk resumed at
    a saved position continues with the same batches; the thread stops with the walk."""
    import threading

    def walk(*overrides, n=60, at=None):
        t = _trainer(tmp_path, "train.max_tokens=4096", "train.word_dropout=0.2", *overrides)
        if at is not None:
            t.state.epoch, t.state.batch_in_epoch = at
        batches, out = t.batches(), []
        for _ in range(n):
            batch = next(batches)
            out.append((batch, (t.state.epoch, t.state.batch_in_epoch)))
        batches.close()
        t.close()
        return out

    here = walk("train.prefetch_batches=0")
    before = {th.name for th in threading.enumerate()}
    ahead = walk("train.prefetch_batches=3")
    assert here[-1][1][0] >= 2  # the walk crossed epochs
    for (a, pa), (b, pb) in zip(here, ahead, strict=True):
        assert pa == pb
        assert torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
    resumed = walk("train.prefetch_batches=3", n=10, at=here[29][1])
    assert [p for _, p in resumed] == [p for _, p in here[30:40]]
    pairs = zip(here[30:40], resumed, strict=True)
    assert all(torch.equal(a.src, b.src) for (a, _), (b, _) in pairs)
    assert not any(th.name.startswith("mt-batches") for th in threading.enumerate()) and before


def test_ahead_makes_batches_in_a_background_thread_at_most_depth_ahead():
    import threading

    from mt.data.walk import ahead

    made = []

    def make(i):
        made.append((i, threading.current_thread().name))
        return i * 10

    walk = ahead(make, range(8), depth=2)
    assert next(walk) == (0, 0)
    time.sleep(0.3)  # (time for the thread to run on, were it not held back)
    assert [i for i, _ in made] == [0, 1, 2]  # two ahead of the one handed out, no more
    assert all(name.startswith("mt-batches") for _, name in made)
    assert list(walk) == [(i, i * 10) for i in range(1, 8)]
    assert list(ahead(lambda i: -i, range(3), depth=0)) == [(0, 0), (1, -1), (2, -2)]


def _saved_after_one_update(tmp_path):
    """A trainer after one update and its last.pt, written; and its batches."""
    t = _trainer(tmp_path, "train.max_steps=4", "train.valid_every=100")
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
