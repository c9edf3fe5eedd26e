"""What a run's checkpoints hold and where they go: last.pt (to resume, with every rank's
generators), best.pt, and the step_N.pt snapshots that are averaged at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mt.artifacts import checkpoint
from mt.data.tokenizer import Tokenizer
from mt.model import Seq2Seq
from mt.runtime.distributed import Dist
from mt.train.ema import WeightAverage
from mt.train.schedule import Noam
from mt.train.state import TrainState


class Checkpoints:
    """Writes the run's checkpoints (rank 0 alone; the other ranks' calls do nothing).
    run_config: the whole config as a dict, which every checkpoint carries; training: the
    model, its optimizer (mt.fast.optim.Adam), schedule and GradScaler; ema: the weight
    average, if the run keeps one; keep: how many step_N.pt snapshots stay
    (train.keep_checkpoints, 0: none are written)."""

    def __init__(
        self,
        run_dir: Path,
        run_config: dict,
        tokenizer: Tokenizer,
        training: tuple[Seq2Seq, Any, Noam, torch.amp.GradScaler],
        ema: WeightAverage | None,
        dist: Dist,
        *,
        keep: int,
    ):
        self.run_dir, self.run_config, self.tokenizer = run_dir, run_config, tokenizer
        self.model, self.optimizer, self.scheduler, self.scaler = training
        self.ema, self.dist, self.keep = ema, dist, keep
        self.last_step = -1  # the step of the last last.pt written or resumed from (-1: none)
        self.last_state: dict | None = None  # the counters of the last last.pt this process wrote

    def checkpoint_dict(
        self,
        state: TrainState,
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
            train_state=state.state_dict(),
            rank_rng=rank_rng,
            training=None if snapshot else (self.optimizer, self.scheduler, self.scaler),
            ema=ema,
        )

    def rng_states(self) -> list[dict]:
        """The generator states of every rank, in rank order (a collective: all ranks call it)."""
        return self.dist.gather(checkpoint.rng_state())

    def save(self, name: str, state: TrainState, rank_rng: list[dict] | None = None) -> None:
        if not self.dist.is_main:
            return
        last = name == "last.pt"
        checkpoint.atomic_save(
            self.checkpoint_dict(state, rank_rng, for_resume=last),
            self.run_dir / name,
            keep_previous=last,
        )
        if last:
            self.last_step, self.last_state = state.step, state.state_dict()

    def holds(self, state: TrainState) -> bool:
        """Whether the last.pt this process wrote holds `state` as it is now."""
        return self.last_state == state.state_dict()

    def save_snapshot(self, state: TrainState) -> None:
        """step_N.pt: the model alone (for averaging), keeping the last `keep`."""
        if self.keep == 0 or not self.dist.is_main:
            return
        checkpoint.atomic_save(
            self.checkpoint_dict(state, snapshot=True), self.run_dir / f"step_{state.step}.pt"
        )
        for old in checkpoint.snapshots(self.run_dir)[: -self.keep]:
            old.unlink()
