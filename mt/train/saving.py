"""What a run's checkpoints hold and where they go: last.pt (to resume, with every rank's
generators), best.pt, and the step_N.pt snapshots that are averaged at the end; written by a
background thread from a copy in host memory, so that training goes on while they are."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mt.artifacts import checkpoint
from mt.data.tokenizer import Tokenizer
from mt.model import Seq2Seq
from mt.runtime.distributed import Dist
from mt.train.ema import WeightAverage
from mt.train.state import TrainState
from mt.train.update.schedule import Noam


class Checkpoints:
    """Writes the run's checkpoints (rank 0 alone; the other ranks' calls do nothing).
    run_config: the whole config as a dict, which every checkpoint carries; training: the
    model, its optimizer (mt.train.update.optim.Adam), schedule and GradScaler; ema: the weight
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
        self.writer = Writer(background=dist.is_main)

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
        """Write `name` in the background from a copy of what it holds now; a last.pt counts
        (last_step, holds) once it has replaced the old one."""
        if not self.dist.is_main:
            return
        last = name == "last.pt"
        done = None
        if last:
            step, counters = state.step, state.state_dict()

            def done() -> None:
                self.last_step, self.last_state = step, counters

        self.writer.write(
            self.checkpoint_dict(state, rank_rng, for_resume=last),
            self.run_dir / name,
            keep_previous=last,
            then=done,
        )

    def holds(self, state: TrainState) -> bool:
        """Whether the last.pt this process wrote holds `state` as it is now."""
        self.writer.wait()
        return self.last_state == state.state_dict()

    def save_snapshot(self, state: TrainState) -> None:
        """step_N.pt: the model alone (for averaging), keeping the last `keep`."""
        if self.keep == 0 or not self.dist.is_main:
            return
        run_dir, keep = self.run_dir, self.keep

        def drop_old() -> None:
            for old in checkpoint.snapshots(run_dir)[:-keep]:
                old.unlink()

        self.writer.write(
            self.checkpoint_dict(state, snapshot=True),
            run_dir / f"step_{state.step}.pt",
            then=drop_old,
        )

    def wait(self) -> None:
        """Until every checkpoint asked for is on disk (a write's error is raised here)."""
        self.writer.wait()

    def close(self) -> str | None:
        """Wait for the writes and stop the writer; the error of a failed write, as text."""
        return self.writer.close()


class Writer:
    """Writes checkpoint files one after the other, in the order asked, from a copy in host
    memory, in a background thread (background=False: at once, in the caller's thread). Each
    file is written by checkpoint.atomic_save (a temp file renamed over the old one), so a
    crash mid-write leaves the previous file; `then` runs once the rename is done. A failed
    write is raised by the next write or wait."""

    def __init__(self, background: bool):
        self.pool = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mt-checkpoints")
            if background
            else None
        )
        self.pending: list[concurrent.futures.Future] = []

    def write(
        self,
        obj: dict,
        path: Path,
        keep_previous: bool = False,
        then: Callable[[], None] | None = None,
    ) -> None:
        self._raise_failed()
        if self.pool is None:
            _write(obj, path, keep_previous, then)
            return
        copy = host_copy(obj)  # (the live weights change with the next update)
        self.pending.append(self.pool.submit(_write, copy, path, keep_previous, then))

    def wait(self) -> None:
        pending, self.pending = self.pending, []
        for write in pending:
            write.result()

    def close(self) -> str | None:
        try:
            self.wait()
        except Exception as e:  # (closing after another error: this one is reported)
            return str(e)
        finally:
            if self.pool is not None:
                self.pool.shutdown()
        return None

    def _raise_failed(self) -> None:
        failed = [w for w in self.pending if w.done() and w.exception() is not None]
        if failed:
            self.pending = []
            raise failed[0].exception()  # type: ignore[misc]
        self.pending = [w for w in self.pending if not w.done()]


def _write(obj: dict, path: Path, keep_previous: bool, then: Callable[[], None] | None) -> None:
    checkpoint.atomic_save(obj, path, keep_previous=keep_previous)
    if then is not None:
        then()


def host_copy(obj: Any, copies: dict | None = None) -> Any:
    """`obj` with every tensor copied to the CPU and every dict, list and tuple rebuilt: a
    snapshot that the training after it cannot change. A tensor met twice (tied embeddings)
    is copied once, so the file holds it once, as torch.save of the live tensors would."""
    copies = {} if copies is None else copies
    if isinstance(obj, torch.Tensor):
        key = (
            obj.untyped_storage().data_ptr(),
            obj.storage_offset(),
            tuple(obj.shape),
            tuple(obj.stride()),
            obj.dtype,
            obj.device,
        )
        if key not in copies:
            copies[key] = obj.detach().to("cpu", copy=True)
        return copies[key]
    if isinstance(obj, dict):
        return {k: host_copy(v, copies) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(host_copy(v, copies) for v in obj)
    return obj
