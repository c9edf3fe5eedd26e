"""A run directory belongs to one training process: its lock, the config changes it may and
may not take on resuming."""

import os
import shutil
import time

from mt.train.rundir import RunLock
from tests.conftest import ROOT, assert_user_error, run_mt, start_training

TINY = ROOT / "configs" / "tiny.yaml"


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _train(run, data, *sets, timeout=600):
    return run_mt(
        "train",
        TINY,
        "--run-dir",
        run,
        "--set",
        f"data.dir={data}",
        "train.log_every=10",
        *sets,
        timeout=timeout,
    )


def test_a_locked_run_directory_is_refused_with_the_holders_pid(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lock = RunLock(run)
    try:
        assert_user_error(
            _train(run, tmp_path / "data", "train.max_steps=5"),
            "in use by another mt train",
            f"pid {os.getpid()}",
        )
    finally:
        lock.release()
    assert not (run / "config.yaml").exists()


def test_a_second_training_process_is_refused_and_a_stale_lock_taken_over(tmp_path):
    run, data = tmp_path / "run", tmp_path / "data"
    first = start_training(run, data)
    try:
        deadline = time.time() + 180
        while not (run / "train_log.jsonl").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert first.poll() is None
        second = _train(run, data, "train.max_steps=5")
        assert_user_error(second, "in use by another mt train", f"pid {first.pid}")
    finally:
        first.kill()
        first.wait()
    # the holder died without cleaning up: its lock file is left, and taken over
    assert (run / ".lock").read_text().strip() == str(first.pid)
    proc = _train(run, data, "train.max_steps=100000", "train.max_minutes=0.05")
    assert proc.returncode == 0, proc.stderr


def test_a_config_change_that_cannot_be_honoured_is_refused_before_writing(tmp_path):
    run, data = tmp_path / "run", tmp_path / "data"
    assert _train(run, data, "train.max_steps=20", "train.save_every=10").returncode == 0
    before = _snapshot(run)
    proc = _train(run, data, "train.max_steps=40", "model.d_model=32", "--allow-config-change")
    assert_user_error(proc, "model.d_model", "cannot change", "another --run-dir")
    assert "size mismatch" not in proc.stderr
    assert _snapshot(run) == before  # config.yaml not rewritten
    # the original command still resumes
    proc = _train(run, data, "train.max_steps=30", "train.save_every=10")
    assert proc.returncode == 0, proc.stderr
    assert "resuming from" in proc.stderr


def test_a_failed_start_does_not_lock_its_config(tmp_path):
    run, data = tmp_path / "run", tmp_path / "data"
    (tmp_path / "wrong").mkdir()
    bad = run_mt(
        "train",
        TINY,
        "--run-dir",
        run,
        "--set",
        f"data.dir={tmp_path / 'wrong'}",
        "data.dataset=null",
        "train.max_steps=10",
    )
    assert_user_error(bad, "no train data")
    proc = _train(run, data, "train.max_steps=10", "tokenizer.vocab_size=280")
    assert proc.returncode == 0, proc.stderr


def test_a_time_budget_or_a_moved_corpus_resumes_without_flags(tmp_path):
    run, data = tmp_path / "run", tmp_path / "data"
    assert _train(run, data, "train.max_steps=10").returncode == 0
    proc = _train(run, data, "train.max_steps=20", "train.max_minutes=5")
    assert proc.returncode == 0 and "resuming from" in proc.stderr, proc.stderr
    moved = tmp_path / "moved"
    shutil.copytree(data, moved)
    proc = _train(run, moved, "train.max_steps=30", "train.max_minutes=5")
    assert proc.returncode == 0 and "resuming from" in proc.stderr, proc.stderr
    # another corpus in data.dir is another run
    other = tmp_path / "other"
    shutil.copytree(data, other)
    (other / "train.src").write_text("lo\n" * 50)
    (other / "train.tgt").write_text("ka\n" * 50)
    assert_user_error(
        _train(run, other, "train.max_steps=40", "train.max_minutes=5"),
        "different config",
        "data.dir",
    )
