"""A run directory written by mt 0.1.0 before its modules moved into folders by role
(tests/fixtures/run_v0_1: a 4-update tiny model on the synthetic task, with its last.pt,
config, corpus record and BPE model) still loads, translates and resumes."""

import shutil

import torch

from mt.artifacts import checkpoint
from mt.decode.translator import Translator
from tests.conftest import ROOT, run_mt, run_tiny

FIXTURE = ROOT / "tests" / "fixtures" / "run_v0_1"
# the overrides the fixture was trained with (on top of configs/tiny.yaml)
SETS = [
    "model.d_model=16",
    "model.d_ff=32",
    "model.n_heads=2",
    "model.enc_layers=1",
    "model.dec_layers=1",
    "tokenizer.vocab_size=100",
    "train.save_every=4",
    "train.valid_every=4",
    "train.keep_checkpoints=0",
    "train.average_last=0",
    "decode.tune_beams=[]",
]


def test_an_old_checkpoint_loads_and_translates_as_it_decodes_greedily():
    ckpt = checkpoint.load(FIXTURE / "last.pt")
    assert ckpt["train_state"]["step"] == 4 and "objective" not in ckpt["train_state"]
    translator = Translator.from_checkpoint(FIXTURE / "last.pt", device="cpu")
    hyps = translator.translate(["a b c", "d e"], beam=1)
    assert len(hyps) == 2 and all(isinstance(h, str) for h in hyps)
    run = checkpoint.open_trained(FIXTURE)  # the run directory: its last.pt
    assert run.path == FIXTURE / "last.pt" and run.config.model.d_model == 16
    assert run.precision == "fp32" and run.tokenizer.src_vocab_size == 100
    for k, v in run.model.state_dict().items():
        assert torch.equal(v, checkpoint.weights_of(ckpt)[k]), k


def test_an_old_run_directory_resumes_and_translates(tmp_path):
    data = tmp_path / "d"
    assert run_mt("download", "synthetic", "--out", data).returncode == 0
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    # the fixture was trained on a corpus in another folder: the new data.dir is a change
    proc = run_tiny(run, data, "train.max_steps=6", *SETS, flags=["--allow-config-change"])
    assert "resuming from" in proc.stderr and "at step 4" in proc.stderr
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 6
    src = tmp_path / "in.txt"
    src.write_text("a b c\n")
    proc = run_mt("translate", run, "-i", src, "-o", tmp_path / "out.txt", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 1
