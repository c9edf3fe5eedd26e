import os
import pickle

import pytest
import torch

from mt.artifacts import checkpoint
from mt.data.tokenizer import Tokenizer
from mt.errors import MTError
from tests.conftest import (
    assert_user_error,
    run_mt,
)

TEXT = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee, 2024!", "Eine Frau liest."] * 30
EN = ["A man rides a bike.", "Two dogs play in the snow, 2024!", "A woman reads."] * 30


@pytest.mark.parametrize("joint", [True, False])
def test_bpe_round_trip(tmp_path, joint):
    tok = Tokenizer.train(
        TEXT, EN, vocab_size=80, joint=joint, character_coverage=1.0, max_sentences=10_000, seed=0
    )
    for line in EN[:3]:
        assert tok.decode_tgt(tok.encode_tgt([line]))[0] == line
    tok.save(tmp_path)
    again = Tokenizer.load(tmp_path)
    assert again.joint == joint
    assert again.encode_src(TEXT[:3]) == tok.encode_src(TEXT[:3])
    assert min(min(x) for x in tok.encode_src(TEXT)) > 3  # pad/unk/bos/eos never emitted


def test_checkpoint_round_trip(tiny_run, tmp_path):
    ckpt = checkpoint.load(tiny_run / "last.pt")
    assert {
        "config",
        "model",
        "optimizer",
        "scheduler",
        "scaler",
        "train_state",
        "rng",
        "spm",
    } <= set(ckpt)
    checkpoint.atomic_save(ckpt, tmp_path / "copy.pt")
    again = checkpoint.load(tmp_path / "copy.pt")
    for k, v in ckpt["model"].items():
        assert torch.equal(v, again["model"][k])
    assert again["train_state"] == ckpt["train_state"]
    tok = checkpoint.tokenizer_from(again)
    assert tok.src_model == (tiny_run / "spm.model").read_bytes()
    assert not list(tmp_path.glob("*.tmp"))  # no temp file left behind


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_malicious_checkpoint_is_refused_and_does_not_run(tmp_path):
    bad = tmp_path / "evil.pt"
    torch.save({"format_version": 1, "model": _Evil()}, bad)
    with pytest.raises(MTError, match="holds Python objects that mt checkpoints never hold"):
        checkpoint.load(bad)
    assert not (tmp_path / "PWNED").exists()
    proc = run_mt("translate", bad, cwd=tmp_path, input="hallo\n")
    assert_user_error(proc, "evil.pt")
    assert not (tmp_path / "PWNED").exists()


def test_truncated_checkpoint_gives_one_line_error(tiny_run, tmp_path):
    data = (tiny_run / "last.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    assert_user_error(run_mt("translate", tmp_path / "cut.pt", input="x\n"), "cut.pt")
    assert_user_error(run_mt("translate", tmp_path / "nothing"), "not found")
    (tmp_path / "p.pkl").write_bytes(pickle.dumps([1, 2]))
    assert_user_error(
        run_mt(
            "eval", tmp_path / "p.pkl", "--src", tmp_path / "p.pkl", "--ref", tmp_path / "p.pkl"
        ),
        "p.pkl",
    )


@pytest.mark.parametrize("saved,here", [(8, 1), (1, 4), (2, 0)])
def test_resume_restores_the_gpu_generators_that_exist_on_both_sides(monkeypatch, saved, here):
    restored, notes = [], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: here > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: here)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, i: restored.append(i))
    state = {
        "torch": torch.get_rng_state(),
        "cuda": [torch.zeros(16, dtype=torch.uint8) for _ in range(saved)],
    }
    checkpoint.set_rng_state(state, notes.append)
    assert restored == list(range(min(saved, here)))
    assert len(notes) == 1 and f"{saved} GPU(s)" in notes[0] and f"has {here}" in notes[0]


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    good = {"format_version": checkpoint.FORMAT_VERSION, "model": {"w": torch.ones(3)}}
    path = tmp_path / "last.pt"
    checkpoint.atomic_save(good, path)

    def crash(obj, f, *a, **k):
        f.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(MTError, match=r"last\.pt: the disk is full"):
        checkpoint.atomic_save(
            {"format_version": 1, "model": {"w": torch.zeros(3)}}, path, keep_previous=True
        )
    monkeypatch.undo()
    assert torch.equal(checkpoint.load(path)["model"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temp file left
