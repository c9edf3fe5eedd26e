"""model.init_from an mt run: a new run of any architecture starts from another's weights and
BPE model, with an optimizer and schedule of its own; what contradicts the source is refused."""

from __future__ import annotations

import json

import pytest

from mt.errors import MTError
from tests.conftest import ROOT, train_tiny


@pytest.mark.parametrize("shape", [("model.norm=pre",), ("model.arch=rnn",)])
def test_a_run_started_from_another_validates_as_it_did_before_any_update(tmp_path, shape):
    """A pre-LN Transformer and an RNN, each trained 20 updates and validated: a run started
    from it (its architecture inherited, not written) gives the source's validation loss
    exactly before any update, at step 0 with a fresh optimizer; a shape or tokenizer the
    user writes against the source's is refused, naming the key."""
    from mt.train.build import build_trainer, load_run_config

    source, data = tmp_path / "a", tmp_path / "d"
    budget = ["train.max_steps=20", "train.valid_every=20", "train.save_every=20"]
    train_tiny(source, data, *shape, *budget, "train.average_last=0")
    logged = [json.loads(x) for x in (source / "train_log.jsonl").read_text().splitlines()]
    before = next(r["valid_loss"] for r in logged if r.get("step") == 20 and "valid_loss" in r)
    sets = [f"data.dir={data}", "train.device=cpu", f"model.init_from={source}"]
    cfg = load_run_config(ROOT / "configs/tiny.yaml", sets)
    assert cfg.model.arch == ("rnn" if "model.arch=rnn" in shape else "transformer")
    said: list[str] = []
    trainer = build_trainer(cfg, tmp_path / "b", log=said.append)
    try:
        assert any("starting from its weights" in line for line in said), said
        assert trainer.state.step == 0 and not trainer.optimizer.state
        assert trainer.validate()["valid_loss"] == before
    finally:
        trainer.lock.release()
    for wrong in ("model.d_model=32", "tokenizer.vocab_size=100"):
        with pytest.raises(MTError, match=f"{wrong.split('=')[0]} is .* remove"):
            load_run_config(ROOT / "configs/tiny.yaml", [*sets, wrong])


def test_a_source_that_is_no_run_is_one_line(tmp_path):
    from mt.train.build import load_run_config

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("")  # (a run that never saved)
    for source, words in ((tmp_path / "nope.pt", "not found"), (tmp_path / "run", "no best.pt")):
        with pytest.raises(MTError, match=words):
            load_run_config(ROOT / "configs/tiny.yaml", [f"model.init_from={source}"])


def test_init_optimizer_continues_the_source_runs_adam_and_schedule(tmp_path):
    """model.init_optimizer: the new run takes the source's last.pt optimizer state (Adam's
    moments) and its schedule's step, so that the learning rate goes on from there; without
    it the optimizer is fresh. A best.pt (weights alone) or no init_from is one line."""
    import torch

    from mt.artifacts import checkpoint
    from mt.train.build import build_trainer, load_run_config

    source, data = tmp_path / "a", tmp_path / "d"
    train_tiny(source, data, "train.max_steps=20", "train.valid_every=20", "train.save_every=20")
    saved = checkpoint.load(source / "last.pt")["optimizer"]["state"]
    sets = [f"data.dir={data}", "train.device=cpu", f"model.init_from={source}"]
    cfg = load_run_config(ROOT / "configs/tiny.yaml", [*sets, "model.init_optimizer=true"])
    said: list[str] = []
    trainer = build_trainer(cfg, tmp_path / "b", log=said.append)
    try:
        got = trainer.optimizer.state_dict()["state"]
        assert sorted(got) == sorted(saved) and len(saved) > 10
        for i, moments in saved.items():
            for name, value in moments.items():
                assert torch.equal(torch.as_tensor(got[i][name]), torch.as_tensor(value)), name
        assert trainer.scheduler.last_epoch == 20 and trainer.state.step == 0
        assert any("from step 20" in line for line in said), said
    finally:
        trainer.lock.release()
    weights = {k: v for k, v in checkpoint.load(source / "last.pt").items() if k != "optimizer"}
    torch.save(weights, tmp_path / "weights.pt")  # (as an average or an export keeps them)
    more = [f"model.init_from={tmp_path / 'weights.pt'}", "model.init_optimizer=true"]
    cfg = load_run_config(ROOT / "configs/tiny.yaml", [*sets[:2], *more])
    with pytest.raises(MTError, match="weights alone"):
        build_trainer(cfg, tmp_path / "c", log=lambda *_: None)
    with pytest.raises(MTError, match=r"set model\.init_from"):
        load_run_config(
            ROOT / "configs/tiny.yaml", [f"data.dir={data}", "model.init_optimizer=true"]
        )
