"""Nothing lost, nothing unsafe: the failure cases not covered next to their features."""
import json

import pytest
import torch

from mt.artifacts import checkpoint
from mt.errors import MTError
from tests.conftest import ROOT, run_mt


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    good = {"format_version": checkpoint.FORMAT_VERSION, "model": {"w": torch.ones(3)}}
    path = tmp_path / "last.pt"
    checkpoint.atomic_save(good, path)

    def crash(obj, f, *a, **k):
        f.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(MTError, match="last.pt: the disk is full"):
        checkpoint.atomic_save({"format_version": 1, "model": {"w": torch.zeros(3)}}, path,
                               keep_previous=True)
    monkeypatch.undo()
    assert torch.equal(checkpoint.load(path)["model"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]        # no temp file left


def test_overlong_input_is_truncated_with_warning_and_keeps_line_count(tiny_run):
    long_line = " ".join(["lo ka mi"] * 200)                          # > max_positions subwords
    proc = run_mt("translate", tiny_run, "--greedy", input=f"mi\n{long_line}\n\ntu\n")
    assert proc.returncode == 0, proc.stderr
    assert "1 input line(s) longer than" in proc.stderr and "truncated" in proc.stderr
    assert len(proc.stdout.split("\n")[:-1]) == 4


def test_same_config_and_seed_give_the_same_loss_curve(tmp_path):
    def curve(run):
        proc = run_mt("train", ROOT / "configs/tiny.yaml", "--run-dir", tmp_path / run, "--set",
                      f"data.dir={tmp_path / 'd'}", "train.max_steps=30", "train.log_every=5",
                      "train.valid_every=30", "model.dropout=0.1")
        assert proc.returncode == 0, proc.stderr
        recs = [json.loads(x) for x in (tmp_path / run / "train_log.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"], r["nll"]) for r in recs if "loss" in r]
    first = curve("a")
    assert len(first) == 6 and first == curve("b")
    info = json.loads((tmp_path / "a/run_info.json").read_text())
    assert info["torch"] == torch.__version__
