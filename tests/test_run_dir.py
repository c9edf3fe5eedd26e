"""A run directory belongs to one training process: its lock, the config changes it may and
may not take on resuming."""

import json
import os
import shutil
import time

from mt.artifacts import checkpoint
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
    assert not (run / ".lock").exists()  # removed by its holder as it let go


def test_a_lock_removed_as_another_takes_it_is_not_shared(tmp_path):
    """A taker that opened the lock file just before its holder removed it locks a file no
    longer in the folder: it takes the new one instead, so two runs never both hold it."""
    from mt.outputs import training_in

    first = RunLock(tmp_path)
    stale = open(tmp_path / ".lock", encoding="utf-8")  # noqa: SIM115 (the taker's handle)
    real_open = open
    handed = []

    def open_stale_once(path, *args, **kwargs):  # (the race: the taker gets the old file)
        if not handed and str(path).endswith(".lock"):
            handed.append(path)
            first.release()
            return stale
        return real_open(path, *args, **kwargs)

    import builtins

    builtins.open, saved = open_stale_once, builtins.open
    try:
        second = RunLock(tmp_path)
    finally:
        builtins.open = saved
    assert handed and stale.closed  # the old file was seen for what it was and let go
    assert training_in(tmp_path) == str(os.getpid())
    second.release()
    assert training_in(tmp_path) is None and not (tmp_path / ".lock").exists()


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
    assert not (run / ".lock").exists()  # (a run that ends leaves no lock naming a dead pid)
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


def test_a_run_with_nothing_to_resume_from_is_not_trained_over_unless_restarted(tmp_path):
    """last.pt and last.pt.prev gone: training again from step 0 would replace the trained
    run's best.pt at its first validation, so it is refused in one line naming what is there
    and the ways out; --restart moves every file aside and starts over."""
    from tests.conftest import mt_here

    run, data = tmp_path / "run", tmp_path / "data"
    sets = [
        "--set",
        f"data.dir={data}",
        "train.max_steps=6",
        "train.valid_every=3",
        "train.log_every=3",
    ]
    code, _, err = mt_here("train", TINY, "--run-dir", run, *sets)
    assert code == 0, err
    (run / "last.pt").unlink()
    checkpoint.previous(run / "last.pt").unlink(missing_ok=True)
    before = _snapshot(run)
    code, _, err = mt_here("train", TINY, "--run-dir", run, *sets)
    assert code == 2 and err.count("\n") == 1, err
    assert "best.pt" in err and "--restart" in err and "--run-dir" in err
    assert _snapshot(run) == before  # nothing written, nothing lost

    code, _, err = mt_here("train", TINY, "--run-dir", run, *sets, "--restart")
    assert code == 0, err
    (aside,) = run.glob("replaced-*")
    assert _snapshot(aside) == {k: v for k, v in before.items() if k != ".lock"}  # all kept
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert next(r["step"] for r in log if "loss" in r) == 3  # a new run, from step 0
    assert "replaced" in err


def test_a_damaged_run_directory_is_one_line_or_resumes_from_what_is_whole(tmp_path, tiny_run):
    """A run's files damaged by hand or by another command: config.yaml with a tab is one
    line naming it and the way out; a log whose last line was cut off, and a last.pt replaced
    by `mt average` (weights alone), resume from what is whole (last.pt.prev), saying so."""
    from tests.conftest import mt_here

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    data = tiny_run.parent / "data"
    sets = [
        "--set",
        f"data.dir={data}",
        "train.max_steps=65",
        "train.valid_every=60",
        "train.save_every=30",
        "train.log_every=20",
    ]
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(config.replace("  ", "\t", 1))
    code, _, err = mt_here("train", TINY, "--run-dir", run, *sets)
    assert code == 2 and err.count("\n") == 1 and "config.yaml:" in err and "delete it" in err
    (run / "config.yaml").write_text(config)

    log = run / "train_log.jsonl"
    log.write_text(log.read_text() + '{"step": 61, "lo')  # a kill mid-line
    code, _, err = mt_here("average", run, "--last", "2", "-o", run / "last.pt", "--force")
    assert code == 0, err
    code, _, err = mt_here("train", TINY, "--run-dir", run, *sets)
    assert code == 0, err
    assert "weights alone" in err and "last.pt.prev" in err  # the fallback, said
    assert "not JSON" in err
    steps = [json.loads(x).get("step") for x in log.read_text().splitlines()]
    assert steps[-1] == 65 and 61 not in steps[:-1]
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 65


def test_no_command_writes_a_running_trainings_own_files(tmp_path, tiny_run):
    """While a training holds the run directory, `mt tune` (best.pt), `mt average -o
    RUN/best.pt --force` and `mt plot -o RUN/training.png` are refused in one line; reading
    its files (`mt translate` of best.pt) and writing other files there stay allowed; once
    the training has ended the same commands run."""
    from tests.conftest import mt_here

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = _snapshot(run)
    lock = RunLock(run)  # (as a training holds it)
    try:
        for args in (
            ["tune", run, "--beams", "1,2", "--length-penalties", "1.0"],
            ["average", run, "--last", "2", "-o", run / "best.pt", "--force"],
            ["average", run, "--last", "2", "-o", run / "step_7.pt"],
            ["plot", run, "-o", run / "training.png", "--force"],
        ):
            code, _, err = mt_here(*args)
            assert code == 2 and err.count("\n") == 1, (args, err)
            assert "a training is running" in err and str(os.getpid()) in err, err
        assert _snapshot(run) == {**before, ".lock": (run / ".lock").read_bytes()}
        code, _, err = mt_here("translate", run / "best.pt", input="a b c\n")
        assert code == 0, err
        code, _, err = mt_here("average", run, "--last", "2", "-o", run / "mine.pt")
        assert code == 0, err
    finally:
        lock.release()
    code, _, err = mt_here("tune", run, "--beams", "1,2", "--length-penalties", "1.0")
    assert code == 0, err


def test_a_vocabulary_larger_than_the_corpus_gives_is_said_and_recorded(tmp_path):
    from tests.conftest import mt_here

    sets = [
        "--set",
        f"data.dir={tmp_path / 'd'}",
        "tokenizer.vocab_size=100000",
        "train.max_steps=1",
        "train.valid_every=1",
    ]
    code, _, err = mt_here("train", TINY, "--run-dir", tmp_path / "run", *sets)
    assert code == 0, err
    said = [line for line in err.splitlines() if "tokenizer.vocab_size 100000" in line]
    info = json.loads((tmp_path / "run/run_info.json").read_text())
    real = info["vocab_size"]["source"]
    assert real < 100000 and len(said) == 1 and f"gave {real} pieces" in said[0]


def test_a_run_s_other_files_damaged_or_replaced_are_one_line_or_restored(tmp_path, tiny_run):
    """corpus.json damaged: one line naming it and the way out; a folder where the run keeps a
    file (best.pt, the log): one line before any step is trained; the BPE model damaged or
    missing in a run with a checkpoint: written again from the checkpoint's own copy (a BPE
    model trained anew would give the weights other ids), said, and the run resumes."""
    from tests.conftest import mt_here

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    sets = [
        "--set",
        f"data.dir={tiny_run.parent / 'data'}",
        "train.max_steps=61",
        "train.valid_every=60",
        "train.log_every=20",
    ]
    corpus = (run / "corpus.json").read_text()
    for junk in ("{cut", "[1]", '{"a": 3}'):
        (run / "corpus.json").write_text(junk)
        code, _, err = mt_here("train", TINY, "--run-dir", run, *sets)
        assert code == 2 and err.count("\n") == 1, err
        assert "corpus.json is damaged" in err and "delete it" in err, err
    (run / "corpus.json").write_text(corpus)

    log = (run / "train_log.jsonl").read_text()
    for name in ("best.pt", "train_log.jsonl"):
        kept = run / f"{name}.mine"
        (run / name).rename(kept)
        (run / name).mkdir()
        code, _, err = mt_here("train", TINY, "--run-dir", run, *sets)
        assert code == 2 and err.count("\n") == 1 and f"{name} is a folder" in err, err
        (run / name).rmdir()
        kept.rename(run / name)
    assert (run / "train_log.jsonl").read_text() == log  # nothing trained

    bpe = (run / "spm.model").read_bytes()
    for steps, damage in ((62, lambda p: p.write_bytes(b"junk")), (63, lambda p: p.unlink())):
        damage(run / "spm.model")
        code, _, err = mt_here("train", TINY, "--run-dir", run, *sets, f"train.max_steps={steps}")
        assert code == 0, err
        assert "written again from last.pt" in err, err
        assert (run / "spm.model").read_bytes() == bpe


def test_a_resumed_run_decodes_with_the_decode_settings_it_was_given(tmp_path):
    """config.yaml never says one decoding while the run uses another: a resume with --set
    decode.beam=6 leaves best.pt (what mt translate RUN uses) decoding with beam 6 too."""
    from mt.artifacts import checkpoint
    from mt.config import load_config
    from tests.conftest import mt_here

    run, data = tmp_path / "run", tmp_path / "data"
    common = [
        "train",
        "tiny",
        "--run-dir",
        run,
        "--set",
        f"data.dir={data}",
        "train.max_steps=4",
        "train.valid_every=2",
        "train.save_every=2",
        "train.average_last=0",
    ]
    assert mt_here(*common)[0] == 0
    assert checkpoint.load(run / "best.pt")["config"]["decode"]["beam"] != 6
    code, _, err = mt_here(*common, "decode.beam=6", "decode.length_penalty=0.5")
    assert code == 0, err
    assert load_config(run / "config.yaml").decode.beam == 6
    decode = checkpoint.load(run / "best.pt")["config"]["decode"]
    assert decode["beam"] == 6 and decode["length_penalty"] == 0.5, decode
    assert "decode.beam" in err and "best.pt" in err


def test_a_run_that_ended_says_so_and_keeps_its_files_until_its_budget_grows(tmp_path):
    """Re-running a finished run trained nothing but rewrote last.pt and said "resuming";
    now it says it is done and how to go on, its checkpoints untouched; a larger budget
    resumes it."""
    from tests.conftest import mt_here

    sets = [
        f"data.dir={tmp_path / 'd'}",
        "train.valid_every=10",
        "train.save_every=10",
        "train.device=cpu",
    ]
    code, _, err = mt_here(
        "train", "tiny", "--run-dir", tmp_path / "r", "--set", *sets, "train.max_steps=10"
    )
    assert code == 0, err
    files = {p.name: p.read_bytes() for p in (tmp_path / "r").glob("*.pt")}
    code, _, err = mt_here(
        "train", "tiny", "--run-dir", tmp_path / "r", "--set", *sets, "train.max_steps=10"
    )
    assert code == 0 and "is done: it ended at step 10" in err and "train.max_steps=20" in err, err
    assert {p.name: p.read_bytes() for p in (tmp_path / "r").glob("*.pt")} == files
    code, _, err = mt_here(
        "train", "tiny", "--run-dir", tmp_path / "r", "--set", *sets, "train.max_steps=20"
    )
    assert code == 0 and "is done" not in err, err
    from mt.artifacts import checkpoint

    state = checkpoint.load(tmp_path / "r/last.pt")["train_state"]
    assert state["step"] == 20 and state["finished"]
