"""Nothing a user does loses their files or ends in a traceback: one test per way found to
lose a file or see a traceback through an output path, a run directory or a flag."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from mt.train.rundir import RunLock
from tests.conftest import ROOT, assert_user_error, cli_env, run_mt

TINY = ROOT / "configs" / "tiny.yaml"


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(not _can_mount(), reason="needs unshare -rm to mount a "
                                 "read-only or tiny tmpfs (user namespaces)")


def run_on_mount(folder, options: str, *args, timeout=300):
    """`mt ARGS` inside a private mount namespace where `folder` is a fresh tmpfs mounted with
    `options` (e.g. "ro", "size=64k"): a real read-only or full filesystem, no root needed."""
    folder.mkdir(parents=True, exist_ok=True)
    script = (f'mount -t tmpfs -o {options} tmpfs "{folder}" && exec "{sys.executable}" -m mt '
              + " ".join(f"'{a}'" for a in map(str, args)))
    env = cli_env()
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def src_file(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("mi lo\nka tu\n", encoding="utf-8")
    return path


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


# -- output paths -----------------------------------------------------------------------

def test_translate_refuses_to_write_over_its_input(tiny_run, src_file):
    before = src_file.read_bytes()
    assert_user_error(run_mt("translate", tiny_run, "-i", src_file, "-o", src_file),
                      "also an input")
    assert src_file.read_bytes() == before
    # the same file by another name is still the input
    assert_user_error(run_mt("translate", tiny_run, "-i", src_file,
                             "-o", src_file.parent / "." / src_file.name), "also an input")
    assert_user_error(run_mt("translate", tiny_run / "last.pt", "-i", src_file,
                             "-o", tiny_run / "last.pt", "--force"), "also an input")


def test_translate_replaces_an_existing_output_only_with_force(tiny_run, src_file, tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("keep me\n")
    assert_user_error(run_mt("translate", tiny_run, "-i", src_file, "-o", out),
                      str(out), "already exists", "--force")
    assert out.read_text() == "keep me\n"
    proc = run_mt("translate", tiny_run, "-i", src_file, "-o", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().splitlines()) == 2
    new = tmp_path / "new.txt"
    assert run_mt("translate", tiny_run, "-i", src_file, "-o", new).returncode == 0
    umask = os.umask(0)
    os.umask(umask)
    assert new.stat().st_mode & 0o777 == 0o666 & ~umask       # not a private temp file


def test_outputs_in_a_missing_folder_fail_before_the_work(tiny_run, src_file, tmp_path):
    missing = tmp_path / "missing_dir"
    assert_user_error(run_mt("translate", tiny_run, "-i", src_file, "-o", missing / "out.txt"),
                      str(missing), "does not exist")
    assert_user_error(run_mt("average", tiny_run, "--last", "2", "-o", missing / "x.pt"),
                      str(missing), "does not exist")
    assert_user_error(run_mt("attention", tiny_run, "mi lo", "-o", missing / "a.png"),
                      str(missing), "does not exist")
    assert_user_error(run_mt("plot", tiny_run, "-o", missing / "p.png"), "does not exist")
    assert not missing.exists()


def test_picture_and_average_need_force_to_replace(tiny_run, tmp_path):
    png = tmp_path / "a.png"
    png.write_bytes(b"mine")
    assert_user_error(run_mt("attention", tiny_run, "mi lo", "-o", png), "already exists")
    assert_user_error(run_mt("plot", tiny_run, "-o", png), "already exists")
    assert png.read_bytes() == b"mine"
    snap = sorted(tiny_run.glob("step_*.pt"))[-1]
    before = snap.read_bytes()
    assert_user_error(run_mt("average", tiny_run, "--last", "2", "-o", snap, "--force"),
                      "also an input")
    assert snap.read_bytes() == before


@needs_mount
def test_read_only_filesystem_is_one_line(tiny_run, src_file, tmp_path):
    ro = tmp_path / "ro"
    for args in (("translate", tiny_run, "-i", src_file, "-o", ro / "out.txt"),
                 ("plot", tiny_run, "-o", ro / "p.png"),
                 ("download", "synthetic", "--out", ro / "data")):
        proc = run_on_mount(ro, "ro", *args)
        assert_user_error(proc, str(ro), "Read-only file system")


@needs_mount
def test_full_disk_while_saving_a_checkpoint_names_the_disk(tiny_run, tmp_path):
    full = tmp_path / "full"
    proc = run_on_mount(full, "size=64k", "average", tiny_run, "--last", "2", "-o",
                        full / "avg.pt")
    assert_user_error(proc, str(full / "avg.pt"), "disk is full")


def test_torch_unexpected_pos_on_a_full_disk_is_reported_as_a_full_disk(tmp_path, monkeypatch):
    import torch

    from mt import outputs
    from mt.artifacts import checkpoint
    from mt.errors import MTError

    def torch_on_full_disk(obj, f, *a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0")
    monkeypatch.setattr(torch, "save", torch_on_full_disk)
    monkeypatch.setattr(outputs.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(MTError, match=r"x\.pt: the disk is full"):
        checkpoint.atomic_save({"a": 1}, tmp_path / "x.pt")
    assert list(tmp_path.iterdir()) == []


def test_eval_of_empty_files_is_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("")
    assert_user_error(run_mt("eval", "--hyp", empty, "--ref", empty), "nothing to score")


# -- flags ------------------------------------------------------------------------------

def test_unknown_lc_tok_language_and_huge_beam_are_refused(tiny_run, tmp_path):
    ref = tmp_path / "ref"
    ref.write_text("a b\n")
    assert_user_error(run_mt("eval", "--hyp", ref, "--ref", ref, "--lc-tok", "klingon"),
                      "--lc-tok 'klingon'", "en")
    assert_user_error(run_mt("translate", tiny_run, "--beam", "10000", input="mi\n"),
                      "--beam 10000", "at most")
    assert_user_error(run_mt("tune", tiny_run, "--beams", "1,5000"), "--beam 5000")


# -- the run directory ------------------------------------------------------------------

def _train(run, data, *sets, timeout=600):
    return run_mt("train", TINY, "--run-dir", run, "--set", f"data.dir={data}",
                  "train.log_every=10", *sets, timeout=timeout)


def test_a_locked_run_directory_is_refused_with_the_holders_pid(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lock = RunLock(run)
    try:
        assert_user_error(_train(run, tmp_path / "data", "train.max_steps=5"),
                          "in use by another mt train", f"pid {os.getpid()}")
    finally:
        lock.release()
    assert not (run / "config.yaml").exists()


def test_a_second_training_process_is_refused_and_a_stale_lock_taken_over(tmp_path):
    run, data = tmp_path / "run", tmp_path / "data"
    env = cli_env()
    first = subprocess.Popen([sys.executable, "-m", "mt", "train", str(TINY), "--run-dir",
                              str(run), "--set", f"data.dir={data}", "train.max_steps=100000",
                              "train.log_every=1"], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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
    assert _snapshot(run) == before                       # config.yaml not rewritten
    # the original command still resumes
    proc = _train(run, data, "train.max_steps=30", "train.save_every=10")
    assert proc.returncode == 0, proc.stderr
    assert "resuming from" in proc.stderr


def test_a_failed_start_does_not_lock_its_config(tmp_path):
    run, data = tmp_path / "run", tmp_path / "data"
    (tmp_path / "wrong").mkdir()
    bad = run_mt("train", TINY, "--run-dir", run, "--set", f"data.dir={tmp_path / 'wrong'}",
                 "data.dataset=null", "train.max_steps=10")
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
    assert_user_error(_train(run, other, "train.max_steps=40", "train.max_minutes=5"),
                      "different config", "data.dir")


def test_ctrl_c_twice_says_what_was_lost(tmp_path):
    run, data = tmp_path / "run", tmp_path / "data"
    env = cli_env()
    # a slow update (a wide model), so that the second signal lands inside the same update
    proc = subprocess.Popen([sys.executable, "-m", "mt", "train", str(TINY), "--run-dir",
                             str(run), "--set", f"data.dir={data}", "train.max_steps=100000",
                             "train.log_every=1", "model.d_model=512", "model.d_ff=4096",
                             "train.max_tokens=8000"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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
    rest, err = proc.communicate(timeout=120)
    err = seen + err
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted twice" in err and "lost" in err and "run the same command" in err


# -- the first hour ---------------------------------------------------------------------

def test_translate_at_a_terminal_answers_each_line(tiny_run):
    import pty
    leader, follower = pty.openpty()
    env = cli_env()
    proc = subprocess.Popen([sys.executable, "-m", "mt", "translate", str(tiny_run), "--greedy"],
                            stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=ROOT, env=env, text=True)
    os.close(follower)
    os.write(leader, b"mi lo\nka tu\n\x04")
    out, err = proc.communicate(timeout=120)
    os.close(leader)
    assert proc.returncode == 0, err
    assert "Ctrl-D" in err and "greedy search" in err
    assert len(out.splitlines()) == 2


def test_version_and_builtin_configs_from_any_folder(tmp_path):
    proc = run_mt("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("mt ")
    proc = run_mt("configs", cwd=tmp_path)
    assert proc.returncode == 0 and "tiny" in proc.stdout and "multi30k_de_en" in proc.stdout
    proc = run_mt("train", "tiny", "--set", "train.max_steps=3", "train.valid_every=3",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "runs" / "tiny" / "last.pt").is_file()
    proc = run_mt("train", "configs/tiny.yaml", "--set", "train.max_steps=3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr                    # the README's path, anywhere
    assert_user_error(run_mt("train", "nonesuch", cwd=tmp_path), "nonesuch", "mt configs")


def test_training_picture_marks_best_and_draws_a_single_point(tmp_path):
    import json

    from mt.evaluate.plot import plot_run, training_figure
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_log.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 10, "loss": 5.0, "nll": 4.5},
        {"step": 10, "valid_loss": 4.0, "valid_bleu": 12.3, "valid_chrf": 30.0, "best": True},
    ]) + "\n")
    assert plot_run(run).is_file()
    loss_ax, bleu_ax = training_figure(run).axes
    assert any(line.get_marker() == "o" and len(line.get_xdata()) == 1
               for line in loss_ax.get_lines())                  # one point is still seen
    assert "best.pt: 12.30" in [t.get_text() for t in bleu_ax.get_legend().get_texts()]


def test_attention_labels_show_words_not_sentencepiece_marks():
    from mt.decode.alignment import readable_pieces
    assert readable_pieces(["\u2581Ein", "\u2581Hund", "e", "\u2581", "</s>"]) == \
        ["Ein", "Hund", "##e", "\u2423", "</s>"]


@needs_mount
def test_training_on_a_disk_that_fills_stops_with_one_line(tmp_path):
    """The run directory on a 1 MB filesystem: the BPE model and the config fit, the first
    checkpoint does not."""
    disk = tmp_path / "disk"
    data = tmp_path / "data"
    assert run_mt("download", "synthetic", "--out", data).returncode == 0
    proc = run_on_mount(disk, "size=1m", "train", TINY, "--run-dir", disk / "run", "--set",
                        f"data.dir={data}", "train.max_steps=20", "train.save_every=5")
    assert_user_error(proc, "disk is full")
