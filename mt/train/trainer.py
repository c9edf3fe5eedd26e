"""The training loop: one optimizer update per `step`, validation and checkpoints around it.

`Trainer` takes explicit objects; `build_trainer` (in mt.train.build) reads the config and makes
them.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from mt.data.batching import Batch
from mt.data.corpus import ParallelData
from mt.data.walk import training_batches
from mt.errors import MTError
from mt.objectives.objective import Objective
from mt.runtime.distributed import Dist, teardown
from mt.train.compiled import compiled
from mt.train.ema import WeightAverage
from mt.train.finish import draw_training_picture, finish_run
from mt.train.progress import Forecast, lost_work_message, show_progress, stop_on_signal
from mt.train.saving import Saving
from mt.train.schedule import budget_progress
from mt.train.skips import DeferredSkips, nonfinite_message
from mt.train.state import LogWindow, TrainState, Validation
from mt.train.tracking import RunLog
from mt.train.validation import Validating


class Trainer(Validating, Saving):
    """cfg: the train section (budgets, schedule of logs, validations and saves); run_config:
    the whole config as a dict, which every checkpoint carries; objective: what is minimised
    (mt.train.objective.build_objective); validation: None for an objective that does not
    translate (encoder pretraining). epoch_data(epoch) -> ParallelData: the training data of
    each epoch where it changes from epoch to epoch (BPE-dropout), and then train_data is None:
    the plain segmentation would be a second copy of the split kept for nothing; None:
    train_data always."""

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
        log=print,
        dist: Dist | None = None,
        lock=None,
        tensorboard: bool = False,
        epoch_data=None,
        compile: bool | None = None,
    ):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.scaler, self.objective = scaler, objective
        self.dist = dist = dist or Dist()  # (None: one process, no ranks)
        # Data parallel without a DDP wrapper: every rank starts from rank 0's weights (buffers
        # are fixed tables), gradients are averaged once all ranks succeeded (train_step).
        dist.broadcast_parameters(model)
        self.train_model = model  # the model the updates run (no DDP wrapper)
        # on a GPU (without fp16's GradScaler) non-finite updates are skipped on the device
        # and counted every few updates, not read after each one (mt/train/skips.py)
        self.deferred = (
            DeferredSkips(device) if device.type == "cuda" and not scaler.is_enabled() else None
        )
        # train.compile: the model and the loss in one compiled function (compile: the setting
        # as resolved for this device and objective, mt.train.objective.compile_applies)
        compile = cfg.compile is True if compile is None else compile
        static = bool(cfg.shape_buckets or cfg.pack_width)  # a few batch shapes, or one
        # and on a GPU each static shape's step replayed as a CUDA graph (compiled.py)
        self.cuda_graphs = bool(compile) and static and device.type == "cuda"
        self.train_loss = compiled(objective.loss, static, self.cuda_graphs) if compile else None
        self.train_data, self.validation, self.tokenizer = train_data, validation, tokenizer
        self.epoch_data, self.cfg, self.run_config = epoch_data, cfg, run_config
        self.run_dir, self.device, self.amp_dtype = run_dir, device, amp_dtype
        self.state, self.log = state or TrainState(), log
        self.lock = lock  # the run directory's RunLock (rank 0), released by close()
        self.run_log = RunLog(run_dir, tensorboard) if dist.is_main else None
        # train.ema_decay: rank 0 alone validates and saves, so it alone keeps the average
        keep_average = cfg.ema_decay > 0 and dist.is_main
        self.ema = WeightAverage(model, cfg.ema_decay) if keep_average else None
        self._window = LogWindow()
        self._progress = 0.0  # the share of the budget spent (budget_progress)
        # for the end of the run: the steps of this process's last validation and last.pt (-1:
        # none yet), and whether a signal asked it to stop
        self.last_valid_step = self.last_save_step = -1
        self.last_record: dict = {}  # the last training log record (loss, nll, ppl, lr, ...)
        self.stop_signal = 0  # the number of the signal that stopped training (0: none)

    # -- data -----------------------------------------------------------------------------
    def _batches(self) -> Iterator[Batch]:
        """The training batches from the saved position on (mt.data.walk)."""
        return training_batches(
            self.state,
            self.cfg,
            self._epoch_data,
            self.device,
            rank=self.dist.rank,
            world=self.dist.world,
            progress=lambda: self._progress,
            say=self.say,
            prepare=self.objective.prepare,
        )

    def _epoch_data(self, epoch: int) -> ParallelData:
        if self.epoch_data is not None:
            return self.epoch_data(epoch)
        assert self.train_data is not None  # one of the two is given
        return self.train_data

    # -- one update -----------------------------------------------------------------------
    def _loss(self, batch: Batch, model=None, loss=None) -> tuple:
        """The objective's loss (or `loss`) of `batch`, under the run's autocast."""
        with torch.autocast(
            self.device.type,
            dtype=self.amp_dtype or torch.float32,
            enabled=self.amp_dtype is not None,
        ):
            return (loss or self.objective.loss)(self.model if model is None else model, batch)

    def train_step(self, batches: list[Batch]) -> bool:
        """One optimizer update from `batches` (gradient accumulation), normalised by the
        total number of target tokens so accumulation equals one big batch.
        Returns False, changing nothing, when the loss is not finite."""
        self.model.train()
        self._clear_gradients()
        if self.objective.on_step is not None:
            self.objective.on_step(self.state.step)
        n_tokens = sum(b.n_tokens for b in batches)
        # Normalise by the target tokens of all ranks: DDP's gradient mean times world size
        # then equals the gradient of one big batch.
        n_total = (
            int(self.dist.sum(torch.tensor(n_tokens, device=self.device)))  # NCCL: on GPU
            if self.dist.enabled
            else n_tokens
        )
        losses: list[torch.Tensor] | None = None
        with contextlib.suppress(torch.OutOfMemoryError):
            losses, nlls = self._backward(batches, self.dist.world / n_total)
        # Every rank learns whether any rank ran out of memory before a gradient is exchanged:
        # a rank skipping the batch alone would leave the others waiting in the all-reduce.
        if self.dist.any(losses is None, self.device) or losses is None:
            self._skip_out_of_memory(batches, here=losses is None)
            return False
        self.dist.average_gradients(self.model.parameters())
        total = self.dist.sum(torch.stack(losses).sum())
        found_inf = None
        if self.deferred is not None:  # skipped on the device, counted later (skips.py)
            finite = torch.isfinite(total)
            found_inf = self.deferred.record(finite, n_tokens)
            losses = [torch.where(finite, x, torch.zeros_like(x)) for x in losses]
            nlls = [torch.where(finite, x, torch.zeros_like(x)) for x in nlls]
        # Else the one host sync per update: an update from a NaN/inf loss would poison the
        # weights and Adam's moments. (fp16 gradient overflow is the GradScaler's business.)
        elif not bool(torch.isfinite(total)):
            self.optimizer.zero_grad(set_to_none=True)
            self.state.nonfinite_in_a_row += 1
            self.write_log(
                {
                    "step": self.state.step,
                    "skipped": "non-finite loss",
                    "in_a_row": self.state.nonfinite_in_a_row,
                }
            )
            return False
        else:
            self.state.nonfinite_in_a_row = 0
        self._window.loss += losses
        self._window.nll += nlls
        self._window.tokens += n_tokens
        self._last_update = (losses, n_tokens)  # this rank's, for the first steps' display
        return self._update(found_inf)

    def _update(self, found_inf: torch.Tensor | None = None) -> bool:
        """Clip, step the optimizer (through the GradScaler) and the schedule; False when the
        fp16 GradScaler skipped the update. found_inf: skip it on the device when 1."""
        if self.cfg.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        if found_inf is not None:  # no GradScaler then (see `deferred`)
            self.optimizer.step(found_inf=found_inf)
        else:
            self.scaler.step(self.optimizer)
        self.scaler.update()
        if scale is not None and self.scaler.get_scale() < scale:
            # fp16: the GradScaler found inf/NaN gradients, skipped the update and lowered its
            # scale. Not an update, so neither the step count nor the schedule moves (fairseq).
            self.state.fp16_skipped += 1
            self.write_log(
                {
                    "step": self.state.step,
                    "skipped": "fp16 gradient overflow",
                    "loss_scale": self.scaler.get_scale(),
                }
            )
            return False
        self.scheduler.step()
        self.state.step += 1
        if self.ema is not None:
            self.ema.update()
        return True

    def _clear_gradients(self) -> None:
        """Before an update. Accumulated over several batches through CUDA graphs, gradients
        live in buffers allocated here, outside the graphs, and zeroed: a gradient the
        backward graph allocated would be overwritten by the next batch's replay before it is
        added to. Otherwise they are set to None, and the first backward's gradient is kept
        as it is (no zeroing, no addition)."""
        if not (self.cuda_graphs and self.cfg.accum_steps > 1):
            self.optimizer.zero_grad(set_to_none=True)
            return
        for p in self.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        self.optimizer.zero_grad(set_to_none=False)

    def _skip_out_of_memory(self, batches: list[Batch], here: bool) -> None:
        """One unusually large batch should not end a long run: every rank drops this update
        and goes on (called after the except block, whose traceback held the failed pass's
        tensors)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.state.oom_skipped += 1
        self.write_log(
            {
                "step": self.state.step,
                "skipped": "out of memory",
                "src_shape": list(batches[0].src.shape),
                **({} if here else {"on": "another rank"}),
            }
        )

    def _backward(self, batches: list[Batch], scale: float) -> tuple[list, list]:
        """Gradients of every batch's loss times `scale`, summed, on this rank only (the
        ranks exchange them afterwards, in `Dist.average_gradients`, so that an out-of-memory
        batch on any rank can be skipped by all). Returns the (summed) losses and NLLs, still
        on device."""
        losses, nlls = [], []
        for batch in batches:
            loss, nll = self._loss(batch, self.train_model, self.train_loss)
            self.scaler.scale(loss * scale).backward()
            # copies: through CUDA graphs the next call writes its outputs over these
            losses.append(loss.detach().clone())
            nlls.append(nll.detach().clone())
        return losses, nlls

    # -- logging, validation, checkpoints -------------------------------------------------
    def write_log(self, record: dict) -> None:
        if self.run_log is not None:  # rank 0's
            self.run_log.write(record)

    def log_train(self) -> dict:
        w = self._window
        elapsed = time.perf_counter() - w.start
        sums = self.dist.sum(
            torch.stack(
                [
                    torch.stack(w.loss).sum(),
                    torch.stack(w.nll).sum(),
                    torch.tensor(float(w.tokens), device=w.loss[0].device),
                ]
            )
        )
        loss_sum, nll_sum, tokens = sums.tolist()  # the only host sync per log window
        loss, nll = loss_sum / tokens, nll_sum / tokens
        record = {
            "step": self.state.step,
            "loss": round(loss, 4),
            "nll": round(nll, 4),
            "ppl": round(math.exp(min(nll, 50)), 2),
            "lr": self.scheduler.get_last_lr()[0],
            "tok_s": round(tokens / elapsed, 1),
            "tokens": int(tokens),
            "epoch": self.state.epoch,
        }
        self.write_log(record)
        self.last_record = record
        self._window = LogWindow()
        return record

    # -- the loop -------------------------------------------------------------------------
    def _agreed_seconds(self) -> float:
        """The training time on the slowest rank's clock, the same on every rank, so that the
        time budget stops all ranks together and the cool-down gives them one learning rate;
        one collective per update, and none without a time budget."""
        if self.cfg.max_minutes <= 0:
            return self.state.train_seconds
        return self.dist.max(self.state.train_seconds, self.device)

    def _should_stop_early(self) -> bool:
        return self.cfg.patience > 0 and self.state.bad_validations >= self.cfg.patience

    def _lost_work_message(self) -> str:
        return lost_work_message(self.state.step, getattr(self, "_saved_step", -1))

    def fit(self) -> TrainState:
        """Train to the end of the budget, or until a signal stops the run (then
        `stop_signal` says which; the CLI exits 128 + its number)."""

        def on_signal(signum: int) -> None:
            self.stop_signal = signum

        with stop_on_signal(on_signal, self._lost_work_message):
            return self._fit()

    def _fit(self) -> TrainState:
        cfg, st = self.cfg, self.state
        batches = self._batches()
        bar = tqdm(
            total=cfg.max_steps,
            initial=st.step,
            desc="train",
            dynamic_ncols=True,
            mininterval=1.0,
            disable=not self.dist.is_main,
        )
        self._saved_step = st.step if st.step else -1
        self._forecast = Forecast(st.step, st.train_seconds)
        t0 = time.perf_counter() - st.train_seconds
        self._progress = budget_progress(st.step, st.train_seconds, cfg.max_steps, cfg.max_minutes)
        while st.step < cfg.max_steps:
            if not self.train_step([next(batches) for _ in range(cfg.accum_steps)]):
                if st.nonfinite_in_a_row >= cfg.max_nonfinite:
                    raise MTError(nonfinite_message(st.nonfinite_in_a_row, st.step))
                continue
            st.train_seconds = time.perf_counter() - t0
            seconds = self._agreed_seconds()
            # the same on every rank: their agreed clock (or the step count alone)
            self._progress = budget_progress(st.step, seconds, cfg.max_steps, cfg.max_minutes)
            if cfg.cooldown > 0:
                self.scheduler.set_progress(self._progress)
            bar.update(1)
            show_progress(bar, st, cfg, self._forecast, self._last_update, self.say)
            if self._after_step(bar, seconds):
                break
        bar.close()
        self._finish()
        return st

    def _after_step(self, bar, seconds: float) -> bool:
        """Log, validate and save on schedule; True when training should stop now (`seconds`:
        the ranks' agreed training time, against train.max_minutes)."""
        cfg, st = self.cfg, self.state
        if self.deferred is not None and (
            st.step >= cfg.max_steps
            or self.deferred.due(st.step, cfg.log_every, cfg.valid_every, cfg.save_every)
        ):
            self._settle_skips()
        out_of_time = cfg.max_minutes > 0 and seconds >= 60 * cfg.max_minutes
        final = st.step == cfg.max_steps or out_of_time
        if st.step % cfg.log_every == 0 or final:
            rec = self.log_train()
            bar.set_postfix(loss=rec["loss"], lr=f"{rec['lr']:.2e}", tok_s=rec["tok_s"])
        if self.validation is not None and (st.step % cfg.valid_every == 0 or final):
            if self.dist.is_main:  # (the same test on every rank)
                rec = self.validate()
                self.last_valid_step = st.step
                draw_training_picture(self.run_dir, self.say)
                over = f" (over {rec['valid_loss_over']})" if "valid_loss_over" in rec else ""
                self.say(
                    f"step {st.step}: valid loss{over} {rec['valid_loss']} ppl "
                    f"{rec['valid_ppl']} BLEU {rec['valid_bleu']} chrF {rec['valid_chrf']}"
                    + (" (best)" if rec.get("best") else "")
                )
            self.dist.wait_for_main()  # the others wait in the long-timeout group
        if st.step % cfg.save_every == 0:
            self.save("last.pt", self.rng_states())
            self.save_snapshot()
            self.last_save_step = st.step
        if final and st.step < cfg.max_steps:
            self.say(f"time budget of {cfg.max_minutes:g} minutes reached at step {st.step}")
            return True
        early = self.dist.is_main and self._should_stop_early()
        # all ranks agree, in one collective: early stop, and the signal any rank received
        early_any, signum = self.dist.max_each([float(early), float(self.stop_signal)], self.device)
        if early_any:
            if early:
                self.say(f"early stop: no better validation BLEU in {cfg.patience} validations")
            return True
        if signum:
            self.stop_signal = int(signum)
            self.say(
                f"{signal.Signals(self.stop_signal).name} at step {st.step}: saving last.pt; "
                f"run the same command again to resume"
            )
            return True
        return False

    def _settle_skips(self) -> None:
        """Read how many updates since the last read were skipped on the device, and take
        them back off the step count, the schedule and the weight average (skips.py)."""
        assert self.deferred is not None
        count, tokens, updates = self.deferred.take()
        st = self.state
        if not count:
            st.nonfinite_in_a_row = 0
            return
        # in a row: all of them since the last read continue a run of skips; else (the
        # order is not known) the skipped ones count as the latest
        st.nonfinite_in_a_row = (st.nonfinite_in_a_row if count == updates else 0) + count
        st.step -= count
        self.scheduler.rewind(count)
        if self.ema is not None:
            self.ema.updates -= count
        self._window.tokens -= tokens
        self.write_log({"step": st.step, "skipped": "non-finite loss", "count": count})
        if st.nonfinite_in_a_row >= self.cfg.max_nonfinite:
            raise MTError(nonfinite_message(st.nonfinite_in_a_row, st.step))

    def close(self) -> None:
        """Leave the process group and free the run directory (every rank calls this, also
        after an error)."""
        self.train_model = self.model
        if self.run_log is not None:
            self.run_log.close()
        teardown(self.dist)
        if self.lock is not None:
            self.lock.release()

    def _finish(self) -> None:
        if self._window.loss:
            self.log_train()
        rank_rng = self.rng_states()  # every rank, for the last.pt that rank 0 may save
        if self.dist.is_main:
            finish_run(self, rank_rng)

    def say(self, msg: str) -> None:
        if self.dist.is_main:
            tqdm.write(msg, file=sys.stderr)
