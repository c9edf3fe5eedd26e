"""train.members: several models of one config trained side by side as one run, each a full
run of its own (seed, checkpoints, resume), and the run directory taken as their ensemble."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, cli_env, mt_here, run_mt

from mt.artifacts import checkpoint

TINY = ROOT / "configs/tiny.yaml"


def _sets(data, steps):
    return [
        f"data.dir={data}",
        "train.device=cpu",
        f"train.max_steps={steps}",
        f"train.valid_every={steps}",
        "train.save_every=10",
        "train.log_every=1",
        "model.dropout=0.1",
    ]


def _weights(run):
    return checkpoint.load(run / "last.pt")["model"]


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def two_members(tmp_path_factory):
    """A run of two members, 20 updates each, and a plain run of the second member's seed."""
    base = tmp_path_factory.mktemp("members")
    sets = _sets(base / "d", 20)
    proc = run_mt("train", TINY, "--run-dir", base / "ens", "--set", *sets, "train.members=2")
    assert proc.returncode == 0, proc.stderr
    proc = run_mt("train", TINY, "--run-dir", base / "alone", "--set", *sets, "train.seed=2")
    assert proc.returncode == 0, proc.stderr
    return base


def test_each_member_is_the_run_of_its_own_seed(two_members):
    ens = two_members / "ens"
    found = json.loads((ens / "ensemble.json").read_text())
    assert found["members"] == ["member1", "member2"] and found["seeds"] == [1, 2]
    first, second = _weights(ens / "member1"), _weights(ens / "member2")
    assert not _same(first, second)  # (two seeds, two models)
    # tiny.yaml's seed is 1: member 2 is the plain run of seed 2, bit for bit
    assert _same(second, _weights(two_members / "alone"))
    assert checkpoint.load(ens / "member2/last.pt")["config"]["train"]["seed"] == 2


def test_the_run_translates_as_the_ensemble_of_its_members(two_members):
    ens, src = two_members / "ens", two_members / "d/valid.src"
    lines = "".join(src.read_text().splitlines(keepends=True)[:40])
    (two_members / "in.txt").write_text(lines)
    args = ["-i", two_members / "in.txt", "--beam", "2", "--device", "cpu"]
    code, whole, err = mt_here("translate", ens, *args)
    assert code == 0 and "ensemble of 2 models" in err, err
    code, both, _ = mt_here("translate", ens / "member1", ens / "member2", *args)
    assert code == 0 and whole == both
    code, alone, _ = mt_here("translate", ens / "member1", *args)
    assert code == 0 and alone != whole  # (so a member left out would show)


def test_a_run_of_members_takes_one_model_commands_with_a_hint(two_members, tmp_path):
    ens = two_members / "ens"
    code, _, err = mt_here("export", ens, tmp_path / "out")
    assert code == 2 and "run of 2 members" in err and "mt distill" in err, err
    assert not (tmp_path / "out").exists()


def test_the_members_decoding_is_tuned_together_and_kept_beside_them(two_members):
    ens = two_members / "ens"
    names = ("member1", "member2")
    before = [checkpoint.load(ens / n / "best.pt")["config"]["decode"] for n in names]
    grid = ["--beams", "1,2", "--length-penalties", "1.0,1.4", "--device", "cpu"]
    code, out, err = mt_here("tune", ens, *grid)
    assert code == 0, err
    tuned = json.loads((ens / "ensemble.json").read_text())["decoding"]
    assert tuned["beam"] in (1, 2) and "ensemble of 2" in out
    after = [checkpoint.load(ens / n / "best.pt")["config"]["decode"] for n in names]
    assert before == after  # (each member keeps its own, for use alone)


def test_pointless_or_impossible_member_counts_are_one_line(tmp_path, monkeypatch):
    sets = _sets(tmp_path / "d", 5)
    code, _, err = mt_here(
        "train", TINY, "--run-dir", tmp_path / "a", "--set", *sets, "train.members=0"
    )
    assert code == 2 and "train.members" in err, err
    monkeypatch.setattr("mt.runtime.threads.usable_cores", lambda: 2)
    code, _, err = mt_here(
        "train", TINY, "--run-dir", tmp_path / "a", "--set", *sets, "train.members=3"
    )
    assert code == 2 and "train.members=3" in err and "at most 2" in err, err
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, _, err = mt_here(
        "train", TINY, "--run-dir", tmp_path / "a", "--set", *sets, "train.members=2"
    )
    assert code == 2 and "torchrun" in err, err
    assert not (tmp_path / "a").exists()


def test_a_run_dir_of_other_members_or_one_model_is_not_trained_into(tmp_path):
    sets = [*_sets(tmp_path / "d", 5), "train.members=2"]
    ens = tmp_path / "ens"
    ens.mkdir()
    record = {"members": ["member1", "member2", "member3"], "seeds": [1, 2, 3]}
    (ens / "ensemble.json").write_text(json.dumps(record))
    code, _, err = mt_here("train", TINY, "--run-dir", ens, "--set", *sets)
    assert code == 2 and "3 members" in err and "train.members=3" in err, err
    assert json.loads((ens / "ensemble.json").read_text()) == record
    one = tmp_path / "one"
    one.mkdir()
    (one / "best.pt").write_bytes(b"weights")
    code, _, err = mt_here("train", TINY, "--run-dir", one, "--set", *sets)
    assert code == 2 and "run of one model" in err, err
    assert (one / "best.pt").read_bytes() == b"weights"


def test_a_member_that_fails_is_named_and_the_others_finish(tmp_path):
    ens = tmp_path / "ens"
    ens.mkdir()
    (ens / "member2").write_text("a file where the member's folder goes")
    proc = run_mt(
        "train", TINY, "--run-dir", ens, "--set", *_sets(tmp_path / "d", 10), "train.members=2"
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "member2 failed (exit status 2)" in proc.stderr
    assert "member1 finished" in proc.stderr
    assert checkpoint.load(ens / "member1/last.pt")["train_state"]["step"] == 10
    assert (ens / "member2").read_text().startswith("a file")


def _step_of(run):
    try:
        lines = (run / "train_log.jsonl").read_text().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError):
        return 0


@pytest.mark.slow
def test_ctrl_c_saves_every_member_and_the_run_resumes_to_the_uninterrupted_weights(tmp_path):
    """A Ctrl-C at the terminal reaches the run alone, which passes it on once to each member:
    each saves last.pt and the run exits 130; the same command resumes every member to the
    weights of a run that was never stopped."""
    sets = [*_sets(tmp_path / "d", 150), "train.members=2"]
    straight = run_mt("train", TINY, "--run-dir", tmp_path / "straight", "--set", *sets)
    assert straight.returncode == 0, straight.stderr
    cmd = [sys.executable, "-m", "mt", "train", str(TINY), "--run-dir", str(tmp_path / "r")]
    proc = subprocess.Popen(
        [*cmd, "--set", *sets],
        env=cli_env(),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.time() + 120
    while min(_step_of(tmp_path / "r" / m) for m in ("member1", "member2")) < 20:
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "resume every member" in err and "Traceback" not in err
    steps = [
        checkpoint.load(tmp_path / "r" / m / "last.pt")["train_state"]["step"]
        for m in ("member1", "member2")
    ]
    assert all(20 <= s < 150 for s in steps), steps
    resumed = run_mt("train", TINY, "--run-dir", tmp_path / "r", "--set", *sets)
    assert resumed.returncode == 0, resumed.stderr
    for m in ("member1", "member2"):
        assert _same(_weights(tmp_path / "straight" / m), _weights(tmp_path / "r" / m)), m


def test_the_report_of_a_run_of_members_shows_each_and_scores_their_ensemble(two_members):
    ens, out = two_members / "ens", two_members / "report.html"
    code, _, err = mt_here("report", ens, "-o", out, "--device", "cpu")
    assert code == 0, err
    page = out.read_text()
    assert "Training curves: member1" in page and "Validation: member2" in page
    assert "The ensemble&#x27;s decoding" in page or "The ensemble's decoding" in page
    test = two_members / "d"
    scored = []
    for model in (ens, ens / "member1"):
        code, printed, err = mt_here(
            "eval",
            model,
            "--src",
            test / "test.src",
            "--ref",
            test / "test.tgt",
            "--json",
            "--device",
            "cpu",
        )
        assert code == 0, err
        scored.append(json.loads(printed)["chrf"])
    assert scored[0] != scored[1] and f'"num">{scored[0]:.2f}<' in page  # (the ensemble's)


def test_a_run_of_members_is_served_and_distilled_as_their_ensemble(two_members, tmp_path):
    from mt.serve.run import model_specs

    ens = two_members / "ens"
    members = [ens / "member1/best.pt", ens / "member2/best.pt"]
    assert model_specs([ens], []) == [("ens", members)]
    assert model_specs([], [f"de_en={ens}"]) == [("de_en", members)]
    small = tmp_path / "small"  # (50 training sources: the teacher translates them all)
    small.mkdir()
    for name in ("train.src", "train.tgt", "valid.src", "valid.tgt"):
        lines = (two_members / "d" / name).read_text().splitlines(keepends=True)[:50]
        (small / name).write_text("".join(lines))
    code, _, err = mt_here(
        "distill", ens, "--data", small, "--out", tmp_path / "kd", "--device", "cpu"
    )
    assert code == 0 and "ensemble of 2 models" in err, err
    code, whole, _ = mt_here("translate", ens, "-i", small / "train.src", "--device", "cpu")
    assert (tmp_path / "kd/train.tgt").read_text() == whole  # (the ensemble's translations)
