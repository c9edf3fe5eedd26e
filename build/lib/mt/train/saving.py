"""What the Trainer's checkpoints hold and where they go: last.pt (to resume, with every
rank's generators), best.pt, and the step_N.pt snapshots that are averaged at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mt.artifacts import checkpoint
from mt.config import TrainConfig
from mt.data.tokenizer import Tokenizer
from mt.model import Seq2Seq
from mt.runtime.distributed import Dist
from mt.train.ema import WeightAverage
from mt.train.schedule import Noam
from mt.train.state import TrainState


class Saving:
    """The Trainer's checkpoint writing (a part of the Trainer: it reads the Trainer's model,
    optimizer, schedule, scaler, state and run directory)."""

    # what it reads of the Trainer, which sets them
    model: Seq2Seq
    ema: WeightAverage | None
    optimizer: Any  # mt.fast.optim.Adam, with torch.optim.Optimizer's interface
    scheduler: Noam
    scaler: torch.amp.GradScaler
    tokenizer: Tokenizer
    state: TrainState
    cfg: TrainConfig
    dist: Dist
    run_dir: Path
    run_config: dict
    _saved_step: int

    def checkpoint_dict(
        self,
        rank_rng: list[dict] | None = None,
        snapshot: bool = False,
        for_resume: bool = False,
    ) -> dict:
        """rank_rng: every rank's generator states (`rng_states`), so that a multi-rank run
        resumes with each rank's own dropout stream; snapshot: the weights alone. With
        train.ema_decay the weights are the average, except in the checkpoint training
        resumes from (for_resume: last.pt), which holds the raw weights and the average."""
        weights, ema = self.model.state_dict(), None
        if self.ema is not None:
            if for_resume:
                ema = self.ema.state_dict(self.model)
            else:
                weights = self.ema.weights(self.model)
        return checkpoint.build(
            config=self.run_config,
            model_state=weights,
            tokenizer=self.tokenizer,
            train_state=self.state.state_dict(),
            rank_rng=rank_rng,
            training=None if snapshot else (self.optimizer, self.scheduler, self.scaler),
            ema=ema,
        )

    def rng_states(self) -> list[dict]:
        """The generator states of every rank, in rank order (a collective: all ranks call it)."""
        return self.dist.gather(checkpoint.rng_state())

    def save(self, name: str, rank_rng: list[dict] | None = None) -> None:
        if not self.dist.is_main:
            return
        checkpoint.atomic_save(
            self.checkpoint_dict(rank_rng, for_resume=name == "last.pt"),
            self.run_dir / name,
            keep_previous=name == "last.pt",
        )
        if name == "last.pt":
            self._saved_step = self.state.step

    def save_snapshot(self) -> None:
        """step_N.pt: the model alone (for averaging), keeping the last `keep_checkpoints`."""
        if self.cfg.keep_checkpoints == 0 or not self.dist.is_main:
            return
        checkpoint.atomic_save(
            self.checkpoint_dict(snapshot=True), self.run_dir / f"step_{self.state.step}.pt"
        )
        for old in checkpoint.snapshots(self.run_dir)[: -self.cfg.keep_checkpoints]:
            old.unlink()
