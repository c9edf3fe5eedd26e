"""`mt pretrain CONFIG --run-dir DIR`: masked-language-model pretraining of a translation
model's encoder on the source side of a corpus (mt/objectives/mlm.py), through the same Trainer
as `mt train`: resume, Ctrl-C, budgets, logging and ranks work as they do there. It writes
RUN_DIR/pretrained.pt, which `model.init_encoder` starts translation runs from."""

from __future__ import annotations

from pathlib import Path

from mt.artifacts import checkpoint
from mt.config import Config
from mt.errors import MTError
from mt.train.build import build_trainer
from mt.train.pretrained import ignored_options


def pretrain(cfg: Config, run_dir: Path, log=print, restart: bool = False) -> dict:
    """Train the encoder of cfg.model with the masked-LM loss on data.dir's training sources,
    for train.max_steps updates (or train.max_minutes); RUN_DIR/pretrained.pt when the budget
    is spent (a run stopped by a signal keeps last.pt and resumes). Returns the state's
    counters and the last logged loss."""
    if cfg.model.arch != "transformer":
        raise MTError(f"model.arch {cfg.model.arch}: mt pretrain trains a Transformer encoder")
    ignored = ignored_options(cfg.train)
    if ignored:
        log(f"mt pretrain does not use {', '.join(ignored)} (mt train does)")
    trainer = build_trainer(cfg, run_dir, log=log, pretraining=True, restart=restart)
    try:
        state = trainer.fit()
        if trainer.dist.is_main and not trainer.stop_signal:
            ckpt = trainer.checkpoints.checkpoint_dict(state, snapshot=True)
            checkpoint.mark_pretrained(ckpt, "masked-lm encoder")
            checkpoint.atomic_save(ckpt, run_dir / "pretrained.pt")
    finally:
        trainer.close()
    return {
        "step": state.step,
        "stopped": trainer.stop_signal,
        "mlm_loss": trainer.last_record.get("loss"),
        "is_main": trainer.dist.is_main,
    }
