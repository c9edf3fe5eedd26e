"""The training loop: one optimizer update per `train_step`, then logging, validation and
checkpoints on schedule, until the budget is spent.

The Trainer owns the model, the optimizer and the batches, and composes the objects that do
the rest, each with one job: Validator (the valid loss and BLEU), Checkpoints (what is saved
where), RunEnd (averaging, tuning and notes after the last update), Skips (updates that did
not happen) and TimeBudget (steps and minutes). `build_trainer` (mt.train.build) reads the
config and makes it.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from mt.data.batching import Batch
from mt.data.corpus import ParallelData
from mt.data.walk import training_batches
from mt.objectives import Objective
from mt.runtime.distributed import Dist, teardown
from mt.train.budget import TimeBudget
from mt.train.ema import WeightAverage
from mt.train.finish import RunEnd, draw_training_picture
from mt.train.progress import (
    Forecast,
    done_message,
    lost_work_message,
    show_progress,
    stop_on_signal,
)
from mt.train.saving import Checkpoints
from mt.train.state import LogWindow, TrainState, Validation
from mt.train.tracking import RunLog, discard, say
from mt.train.update.build import build_update
from mt.train.update.step import forward
from mt.train.validation import Validator, describe_validation


class Trainer:
    """cfg: the train section (budgets, schedule of logs, validations and saves); run_config:
    the whole config as a dict, which every checkpoint carries; objective: what is minimised
    (mt.train.parts.build_objective); validation: None for an objective that does not
    translate (encoder pretraining). epoch_data(epoch) -> ParallelData: the training data of
    each epoch where it changes from epoch to epoch (BPE-dropout), and then train_data is None:
    the plain segmentation would be a second copy of the split kept for nothing; None:
    train_data always. cfg and compile: train.compile and train.pack_width as resolved for
    this device and objective (mt.train.parts.for_device); pair_temperature: data.pairs'
    draws (mt/data/pairs.py)."""

    def __init__(
        self,
        *,
        model,
        optimizer,
        scheduler,
        scaler,
        train_data: ParallelData | None,
        validation: Validation | None,
        tokenizer,
        cfg,
        run_config: dict,
        run_dir: Path,
        device: torch.device,
        amp_dtype: torch.dtype | None,
        objective: Objective,
        state: TrainState | None = None,
        dist: Dist | None = None,
        lock=None,
        tensorboard: bool = False,
        epoch_data: Callable[[int], ParallelData] | None = None,
        compile: bool | None = None,
        pair_temperature: float = 1.0,
    ):
        if cfg.pack_width == "auto":
            raise ValueError("train.pack_width auto is decided per device (parts.for_device)")
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.scaler, self.objective = scaler, objective
        self.dist = dist = dist or Dist()  # (None: one process, no ranks)
        dist.broadcast_parameters(model)  # rank 0's weights everywhere
        self.train_data, self.epoch_data, self.cfg = train_data, epoch_data, cfg
        self.tokenizer, self.run_dir, self.pair_temperature = tokenizer, run_dir, pair_temperature
        self.device, self.amp_dtype = device, amp_dtype
        self.state, self.lock = state or TrainState(), lock
        self.run_log = RunLog(run_dir, tensorboard) if dist.is_main else None
        # (the parts get these, not the trainer's methods: a freed trainer frees its lock)
        self.write_log = self.run_log.write if self.run_log is not None else discard
        self.say = functools.partial(say, dist.is_main)
        self.ema = WeightAverage.for_run(model, cfg.ema_decay, dist.is_main)
        self.update, self.skips, self.cuda_graphs, self.compiled_loss = build_update(self, compile)
        self.budget = TimeBudget(cfg.max_steps, cfg.max_minutes, dist, device)
        self.checkpoints, self.validator, self.run_end = self._outputs(run_config, validation)
        self.window = LogWindow()  # the updates since the last log line
        self.forecast = Forecast(0)  # made again when fit() starts
        # the last update's (loss sum, NLL sum, tokens) on the device, for the first steps'
        # display (zeros for one skipped there)
        self.last_update: torch.Tensor | None = None
        self.last_record: dict = {}  # the last training log record (loss, nll, ppl, lr, ...)
        self.last_valid_step = -1  # the step of this process's last validation (-1: none)
        self.stop_signal = 0  # the number of the signal that stopped training (0: none)

    def _outputs(self, run_config: dict, validation: Validation | None) -> tuple:
        """What the run writes: (Checkpoints, the Validator or None, the RunEnd)."""
        checkpoints = Checkpoints(
            self.run_dir,
            run_config,
            self.tokenizer,
            (self.model, self.optimizer, self.scheduler, self.scaler),
            self.ema,
            self.dist,
            keep=self.cfg.keep_checkpoints,
        )
        validator = None if validation is None else self._validator(validation, checkpoints)
        run_end = RunEnd(
            self.run_dir, checkpoints, validator, self.cfg.average_last, self.say, self.write_log
        )
        return checkpoints, validator, run_end

    def _validator(self, validation: Validation, checkpoints: Checkpoints) -> Validator:
        return Validator(
            model=self.model,
            validation=validation,
            tokenizer=self.tokenizer,
            objective=self.objective,
            max_tokens=self.cfg.max_tokens,
            device=self.device,
            amp_dtype=self.amp_dtype,
            ema=self.ema,
            checkpoints=checkpoints,
            write_log=self.write_log,
            decodes=_valid_decodes(self.cfg, validation.decode),
        )

    # -- data -----------------------------------------------------------------------------
    def batches(self) -> Iterator[Batch]:
        """The training batches from the saved position on (mt.data.walk)."""
        return training_batches(
            self.state,
            self.cfg,
            self._epoch_data,
            self.device,
            rank=self.dist.rank,
            world=self.dist.world,
            progress=lambda: self.budget.progress,
            say=self.say,
            prepare=self.objective.prepare,
            # (an update that copies each batch into its own buffers takes slices)
            resident=self.update.copies_batches,
            pair_temperature=self.pair_temperature,
        )

    def _epoch_data(self, epoch: int) -> ParallelData:
        if self.epoch_data is not None:
            return self.epoch_data(epoch)
        assert self.train_data is not None  # one of the two is given
        return self.train_data

    # -- one update -----------------------------------------------------------------------
    def _loss(self, batch: Batch, loss=None) -> tuple:
        """The objective's loss (or `loss`) of `batch`, under the run's autocast."""
        return forward(self.model, loss or self.objective.loss, batch, self.device, self.amp_dtype)

    def train_step(self, batches: list[Batch]) -> bool:
        """One optimizer update from `batches` (gradient accumulation; mt/train/update/step.py),
        then the schedule, the step count and the weight average. False, changing nothing,
        for an update known at once to be skipped; one skipped on the device counts until
        the host's next read takes it back (settle_skips)."""
        if not self.model.training:  # (after validation; a walk of every module each time)
            self.model.train()
        if self.objective.on_step is not None:
            self.objective.on_step(self.state.step)
        row = self.update(batches, self.state)
        if row is None:
            return False
        self.window.add(row)
        self.last_update = row
        self.scheduler.step()
        self.state.step += 1
        if self.ema is not None:
            self.ema.update()
        return True

    def settle_skips(self) -> None:
        """Take the updates skipped on the device since the host's last read back off the
        step count, the schedule and the weight average (DeviceUpdate.settle)."""
        self.update.settle(self.state)

    # -- logging and validation -----------------------------------------------------------
    def log_train(self) -> dict:
        """The log line of the updates since the last one (all ranks' sums)."""
        record = {"step": self.state.step, **self.window.summary()}
        record.update(lr=self.scheduler.get_last_lr()[0], epoch=self.state.epoch)
        self.write_log(record)
        self.last_record = record
        self.window = LogWindow()
        return record

    def validate(self) -> dict:
        """The valid loss and BLEU, logged; best.pt when the BLEU is the best so far (rank 0;
        Validator)."""
        assert self.validator is not None
        self.last_valid_step = self.state.step
        return self.validator.validate(self.state)

    # -- the loop -------------------------------------------------------------------------
    def fit(self) -> TrainState:
        """Train to the end of the budget, or until a signal stops the run (then
        `stop_signal` says which; the CLI exits 128 + its number)."""

        def on_signal(signum: int) -> None:
            self.stop_signal = signum

        def lost_work() -> str:
            return lost_work_message(self.state.step, self.checkpoints.last_step)

        with stop_on_signal(on_signal, lost_work):
            return self._fit()

    def _fit(self) -> TrainState:
        cfg, st = self.cfg, self.state
        if st.finished and self.budget_spent():
            self.say(done_message(self.run_dir, st, cfg))
            return st
        st.finished = False
        batches = self.batches()
        bar = tqdm(
            total=cfg.max_steps,
            initial=st.step,
            desc="train",
            dynamic_ncols=True,
            mininterval=1.0,
            # (TQDM_DISABLE, tqdm's own switch, which the argument would override: a run of
            # several members shows one bar over all of them, mt/train/members.py)
            disable=not self.dist.is_main or bool(os.environ.get("TQDM_DISABLE")),
        )
        if st.step:  # resumed: last.pt holds this step
            self.checkpoints.last_step = st.step
        sync = functools.partial(torch.cuda.synchronize, self.device)
        self.forecast = Forecast(
            st.step, sync=sync if self.device.type == "cuda" else None, valid_every=cfg.valid_every
        )
        self.budget.start(st)
        self.window = LogWindow()  # (its clock starts with the first update, not the build)
        while st.step < cfg.max_steps:
            updated = self.train_step([next(batches) for _ in range(cfg.accum_steps)])
            if updated and self._after_update(bar):
                break
        bar.close()
        self._finish()
        return st

    def budget_spent(self) -> bool:
        """Whether train.max_steps or train.max_minutes leaves no update to make."""
        cfg, st = self.cfg, self.state
        return st.step >= cfg.max_steps or 0 < cfg.max_minutes * 60 <= st.train_seconds

    def _after_update(self, bar) -> bool:
        """The clock, the cool-down, the progress shown, and what _after_step does; True when
        training should stop now."""
        st = self.state
        self.budget.tick(st)  # the same progress on every rank: from agreed values
        if self.cfg.cooldown > 0:
            self.scheduler.set_progress(self.budget.progress)
        bar.update(1)
        show_progress(bar, st, self.cfg, self.forecast, self.last_update, self.say)
        return self._after_step(bar)

    def _after_step(self, bar) -> bool:
        """Log, validate and save on schedule; True when training should stop now. The ranks
        agree on the clock and on signals at the check steps alone (Skips.due: every few
        updates, and wherever they log, validate or save), where the host also reads the
        updates skipped on the device; one process checks its clock after every update."""
        cfg, st = self.cfg, self.state
        due = self.skips.due(st.step, cfg.log_every, cfg.valid_every, cfg.save_every)
        signum = 0  # the signal that the ranks agree stops them (a rank's own waits for it)
        if due or st.step >= cfg.max_steps or not self.dist.enabled:
            signum = self.budget.agree(st, self.stop_signal)
        out_of_time = self.budget.out_of_time()
        if due or st.step >= cfg.max_steps or out_of_time:  # before they log, save or stop
            self.settle_skips()
        final = st.step == cfg.max_steps or out_of_time
        if st.step % cfg.log_every == 0 or final:
            rec = self.log_train()
            bar.set_postfix(loss=rec.get("loss"), lr=f"{rec['lr']:.2e}", tok_s=rec["tok_s"])
        early = False
        if self.validator is not None and (st.step % cfg.valid_every == 0 or final):
            if self.dist.is_main:  # (the same test on every rank)
                self._validate_and_say()
                early = cfg.patience > 0 and st.bad_validations >= cfg.patience
            early = self.dist.wait_for_main(early)  # the others wait in the long-timeout group
        if st.step % cfg.save_every == 0:
            self.checkpoints.save("last.pt", st, self.checkpoints.rng_states())
            self.checkpoints.save_snapshot(st)
        if final and st.step < cfg.max_steps:
            self.say(f"time budget of {cfg.max_minutes:g} minutes reached at step {st.step}")
            return True
        if early:
            self.say(f"early stop: no better validation BLEU in {cfg.patience} validations")
            return True
        if signum:
            self.stop_signal = signum
            self.say(
                f"{signal.Signals(self.stop_signal).name} at step {st.step}: saving last.pt; "
                f"run the same command again to resume"
            )
            return True
        return False

    def _validate_and_say(self) -> None:
        began = self.forecast.clock()
        rec = self.validate()
        draw_training_picture(self.run_dir, self.say)
        seconds = self.forecast.clock() - began
        self.forecast.validated(seconds)  # (the rate leaves it out)
        self.window.pause(seconds)  # (and so does the next log line's)
        self.say(describe_validation(rec))

    def _finish(self) -> None:
        self.settle_skips()  # whatever stopped the run: last.pt never counts a skipped update
        if self.window.sums:
            self.log_train()
        rank_rng = self.checkpoints.rng_states()  # every rank, for the last.pt rank 0 saves
        if self.dist.is_main:
            validated = self.last_valid_step == self.state.step
            self.run_end.finish(self.state, rank_rng, bool(self.stop_signal), validated)
        self.checkpoints.wait()  # every file on disk when fit() returns

    def close(self) -> None:
        """Leave the process group and free the run directory (every rank calls this, also
        after an error)."""
        failed = self.checkpoints.close()  # (a write in flight finishes first)
        if failed:
            self.say(f"error: {failed}")
        if self.run_log is not None:
            self.run_log.close()
        teardown(self.dist)
        if self.lock is not None:
            self.lock.release()


def _valid_decodes(cfg, decode) -> int:
    """About how many times a run decodes its valid split: every validation, then the end's
    average and tuning grid (cfg: the train section; decode: the validation's)."""
    grid = len(decode.tune_beams) * len(decode.tune_length_penalties)
    return -(-cfg.max_steps // cfg.valid_every) + 1 + grid
