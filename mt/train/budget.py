"""A run's budget: train.max_steps updates, or train.max_minutes of training time, whichever
ends first. With several ranks the time is the slowest rank's clock, agreed at the check
steps (mt/train/trainer.py) and the same on every rank between them, so that the budget stops
them together and the cool-down gives them one learning rate."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from mt.runtime.distributed import Dist
from mt.train.state import TrainState
from mt.train.update.schedule import budget_progress


class TimeBudget:
    """clock: seconds from any origin (time.perf_counter; tests give their own)."""

    def __init__(
        self,
        max_steps: int,
        max_minutes: float,
        dist: Dist,
        device: torch.device,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.max_steps, self.max_minutes = max_steps, max_minutes
        self.dist, self.device, self.clock = dist, device, clock
        self.origin = 0.0  # the clock's reading when this run's training time was 0
        self.progress = 0.0  # the share of the budget spent (budget_progress), 0..1
        self.seconds = 0.0  # the ranks' agreed training time at the last tick

    def start(self, st: TrainState) -> None:
        """Training begins (or resumes, with st.train_seconds already spent)."""
        self.origin = self.clock() - st.train_seconds
        self.seconds = st.train_seconds
        self.progress = budget_progress(st.step, st.train_seconds, self.max_steps, self.max_minutes)

    def tick(self, st: TrainState) -> None:
        """After an update: this rank's training time into st, and the progress from the
        steps and the time last agreed, the same on every rank."""
        st.train_seconds = self.clock() - self.origin
        self.progress = budget_progress(st.step, self.seconds, self.max_steps, self.max_minutes)

    def agree(self, st: TrainState, signum: int) -> int:
        """At a check step (every step of one process): the slowest rank's training time
        becomes every rank's, with the largest signal number any rank received (0: none),
        which is returned; one collective, and none for one process."""
        seconds, agreed = self.dist.max_each([st.train_seconds, float(signum)], self.device)
        self.seconds = seconds
        self.progress = budget_progress(st.step, seconds, self.max_steps, self.max_minutes)
        return int(agreed)

    def out_of_time(self) -> bool:
        return self.max_minutes > 0 and self.seconds >= 60 * self.max_minutes
