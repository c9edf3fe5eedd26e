"""The training loop: one optimizer update per `step`, validation and checkpoints around it.

`Trainer` takes explicit objects; `build_trainer` (in mt.build) reads the config and makes them.
"""
from __future__ import annotations

import json
import math
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from tqdm import tqdm

from mt import checkpoint
from mt.data.batching import Batch, collate, epoch_batches
from mt.data.corpus import ParallelData
from mt.errors import MTError
from mt.loss import label_smoothed_nll
from mt.metrics import score
from mt.tokenizer import PAD
from mt.translator import Translator


@dataclass
class TrainState:
    step: int = 0                 # optimizer updates done
    epoch: int = 0
    batch_in_epoch: int = 0       # batches of `epoch` already consumed (exact resume)
    best_bleu: float = -1.0
    bad_validations: int = 0      # validations since the best one (early stopping)
    train_seconds: float = 0.0
    nonfinite_in_a_row: int = 0
    oom_skipped: int = 0          # batches dropped after running out of memory

    def state_dict(self) -> dict:
        return asdict(self)


@dataclass
class Validation:
    src: list[str]                # raw source lines
    refs: list[str]               # raw, untouched references
    data: ParallelData            # the same pairs as token ids, for the loss
    beam: int


@dataclass
class LogWindow:
    loss: list = field(default_factory=list)
    nll: list = field(default_factory=list)
    tokens: int = 0
    start: float = field(default_factory=time.perf_counter)


class Trainer:
    def __init__(self, *, model, optimizer, scheduler, scaler, train_data: ParallelData,
                 validation: Validation, tokenizer, cfg, decode_cfg, full_config: dict,
                 run_dir: Path, device: torch.device, amp_dtype: torch.dtype | None,
                 state: TrainState | None = None, log=print):
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.train_data, self.validation, self.tokenizer = train_data, validation, tokenizer
        self.cfg, self.decode_cfg, self.full_config = cfg, decode_cfg, full_config
        self.run_dir, self.device, self.amp_dtype = run_dir, device, amp_dtype
        self.state = state or TrainState()
        self.log = log
        self._window = LogWindow()

    # -- data -----------------------------------------------------------------------------
    def _batches(self) -> Iterator[Batch]:
        """Batches from the saved (epoch, position) on; a new shuffle every epoch."""
        pin = self.device.type == "cuda"
        while True:
            order = epoch_batches(self.train_data, self.cfg.max_tokens, self.cfg.seed,
                                  self.state.epoch)
            while self.state.batch_in_epoch < len(order):
                indices = order[self.state.batch_in_epoch]
                self.state.batch_in_epoch += 1
                yield collate(self.train_data, indices, pin=pin).to(self.device)
            self.state.epoch += 1
            self.state.batch_in_epoch = 0

    # -- one update -----------------------------------------------------------------------
    def _loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        keep = batch.tgt_out != PAD
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32,
                            enabled=self.amp_dtype is not None):
            logits = self.model(batch.src, batch.tgt_in, batch.src_pad_mask, keep=keep)  # (N, V)
        lprobs = torch.log_softmax(logits.float(), dim=-1)
        loss, nll, _ = label_smoothed_nll(lprobs, batch.tgt_out[keep],
                                          self.cfg.label_smoothing, PAD)
        return loss, nll

    def train_step(self, batches: list[Batch]) -> bool:
        """One optimizer update from `batches` (gradient accumulation), normalised by the
        total number of target tokens so accumulation equals one big batch.
        Returns False, changing nothing, when the loss is not finite."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        n_tokens = sum(b.n_tokens for b in batches)
        losses, nlls = [], []
        try:
            for batch in batches:
                loss, nll = self._loss(batch)
                self.scaler.scale(loss / n_tokens).backward()
                losses.append(loss.detach())
                nlls.append(nll.detach())
        except torch.OutOfMemoryError:
            # One unusually large batch should not end a long run: drop it and go on.
            del losses, nlls
            self.optimizer.zero_grad(set_to_none=True)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.state.oom_skipped += 1
            self._write_log({"step": self.state.step, "skipped": "out of memory",
                             "src_shape": list(batches[0].src.shape)})
            return False
        # The one host sync per update: an update from a NaN/inf loss would poison the weights
        # and Adam's moments. (fp16 gradient overflow is the GradScaler's business.)
        if not bool(torch.isfinite(torch.stack(losses).sum())):
            self.optimizer.zero_grad(set_to_none=True)
            self.state.nonfinite_in_a_row += 1
            self._write_log({"step": self.state.step, "skipped": "non-finite loss",
                             "in_a_row": self.state.nonfinite_in_a_row})
            return False
        self.state.nonfinite_in_a_row = 0
        self._window.loss += losses
        self._window.nll += nlls
        self._window.tokens += n_tokens
        if self.cfg.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.state.step += 1
        return True

    # -- logging, validation, checkpoints -------------------------------------------------
    def _write_log(self, record: dict) -> None:
        with open(self.run_dir / "train_log.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def log_train(self) -> dict:
        w = self._window
        elapsed = time.perf_counter() - w.start
        loss = float(torch.stack(w.loss).sum()) / w.tokens   # the only host sync per window
        nll = float(torch.stack(w.nll).sum()) / w.tokens
        record = {"step": self.state.step, "loss": round(loss, 4), "nll": round(nll, 4),
                  "ppl": round(math.exp(min(nll, 50)), 2),
                  "lr": self.scheduler.get_last_lr()[0], "tok_s": round(w.tokens / elapsed, 1),
                  "epoch": self.state.epoch}
        self._write_log(record)
        self._window = LogWindow()
        return record

    @torch.no_grad()
    def validate(self) -> dict:
        self.model.eval()
        v = self.validation
        loss_sum = nll_sum = 0.0
        n = 0
        for indices in epoch_batches(v.data, self.cfg.max_tokens, 0, 0):
            batch = collate(v.data, indices).to(self.device)
            loss, nll = self._loss(batch)
            loss_sum, nll_sum, n = loss_sum + float(loss), nll_sum + float(nll), n + batch.n_tokens
        translator = Translator(self.model, self.tokenizer, self.decode_cfg, self.device)
        hyps = translator.translate(v.src, beam=v.beam)
        s = score(hyps, v.refs)
        record = {"step": self.state.step, "valid_loss": round(loss_sum / n, 4),
                  "valid_nll": round(nll_sum / n, 4),
                  "valid_ppl": round(math.exp(min(nll_sum / n, 50)), 2),
                  "valid_bleu": round(s.bleu, 2), "valid_chrf": round(s.chrf, 2)}
        if s.bleu > self.state.best_bleu:
            self.state.best_bleu, self.state.bad_validations = s.bleu, 0
            self.save("best.pt")
            record["best"] = True
        else:
            self.state.bad_validations += 1
        self._write_log(record)
        return record

    def checkpoint_dict(self) -> dict:
        return {
            "format_version": checkpoint.FORMAT_VERSION,
            "config": self.full_config,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "train_state": self.state.state_dict(),
            "rng": {"torch": torch.get_rng_state(),
                    **({"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {})},
            "spm": checkpoint.tokenizer_state(self.tokenizer),
        }

    def save(self, name: str) -> None:
        checkpoint.atomic_save(self.checkpoint_dict(), self.run_dir / name,
                               keep_previous=name == "last.pt")

    def save_snapshot(self) -> None:
        """step_N.pt: the model alone (for averaging), keeping the last `keep_checkpoints`."""
        if self.cfg.keep_checkpoints == 0:
            return
        full = self.checkpoint_dict()
        snap = {k: full[k] for k in ("format_version", "config", "model", "spm", "train_state")}
        checkpoint.atomic_save(snap, self.run_dir / f"step_{self.state.step}.pt")
        for old in checkpoint.snapshots(self.run_dir)[:-self.cfg.keep_checkpoints]:
            old.unlink()

    def average_snapshots(self) -> dict | None:
        """Average the last `average_last` snapshots into averaged.pt, validate it, and make
        it best.pt when its validation BLEU beats the best single checkpoint."""
        paths = checkpoint.snapshots(self.run_dir)[-self.cfg.average_last:]
        if self.cfg.average_last < 2 or len(paths) < 2:
            return None
        averaged = checkpoint.average(paths)
        checkpoint.atomic_save(averaged, self.run_dir / "averaged.pt")
        current = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(averaged["model"])
        try:
            self.model.eval()
            hyps = Translator(self.model, self.tokenizer, self.decode_cfg, self.device).translate(
                self.validation.src, beam=self.validation.beam)
            s = score(hyps, self.validation.refs)
        finally:
            self.model.load_state_dict(current)
        record = {"step": self.state.step, "averaged": len(paths), "valid_bleu": round(s.bleu, 2),
                  "valid_chrf": round(s.chrf, 2)}
        if s.bleu > self.state.best_bleu:
            self.state.best_bleu = s.bleu
            averaged["train_state"] = self.state.state_dict()
            checkpoint.atomic_save(averaged, self.run_dir / "best.pt")
            record["best"] = True
        self._write_log(record)
        return record

    def plot(self) -> None:
        from mt.plot import plot_run
        try:
            plot_run(self.run_dir)
        except Exception as e:  # a picture must never stop training
            tqdm.write(f"warning: could not draw training.png ({e})", file=sys.stderr)

    # -- the loop -------------------------------------------------------------------------
    def _should_stop_early(self) -> bool:
        return self.cfg.patience > 0 and self.state.bad_validations >= self.cfg.patience

    @contextmanager
    def _stop_on_signal(self):
        """SIGINT/SIGTERM ask the loop to stop after the current update (and save);
        a second Ctrl-C falls back to the default handler and stops at once."""
        self.stop_requested = None

        def handler(signum, frame):
            self.stop_requested = signal.Signals(signum).name
            signal.signal(signal.SIGINT, signal.default_int_handler)

        try:
            old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        except ValueError:  # not the main thread: no signal handling
            old = {}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def fit(self) -> TrainState:
        with self._stop_on_signal():
            return self._fit()

    def _fit(self) -> TrainState:
        cfg, st = self.cfg, self.state
        batches = self._batches()
        bar = tqdm(total=cfg.max_steps, initial=st.step, desc="train", dynamic_ncols=True,
                   mininterval=1.0)
        last_valid = last_save = -1
        t0 = time.perf_counter() - st.train_seconds
        while st.step < cfg.max_steps:
            if not self.train_step([next(batches) for _ in range(cfg.accum_steps)]):
                if st.nonfinite_in_a_row >= cfg.max_nonfinite:
                    raise MTError(
                        f"the loss was NaN/inf for {st.nonfinite_in_a_row} updates in a row at "
                        f"step {st.step}; training stopped, the last good checkpoint is kept "
                        f"(last.pt); lower train.lr_factor or raise train.warmup")
                continue
            st.train_seconds = time.perf_counter() - t0
            bar.update(1)
            final = st.step == cfg.max_steps
            if st.step % cfg.log_every == 0 or final:
                rec = self.log_train()
                bar.set_postfix(loss=rec["loss"], lr=f"{rec['lr']:.2e}", tok_s=rec["tok_s"])
            if st.step % cfg.valid_every == 0 or final:
                rec = self.validate()
                last_valid = st.step
                self.plot()
                tqdm.write(f"step {st.step}: valid loss {rec['valid_loss']} "
                          f"ppl {rec['valid_ppl']} BLEU {rec['valid_bleu']} chrF {rec['valid_chrf']}"
                          + (" (best)" if rec.get("best") else ""), file=sys.stderr)
            if st.step % cfg.save_every == 0:
                self.save("last.pt")
                self.save_snapshot()
                last_save = st.step
            if self._should_stop_early():
                tqdm.write(f"early stop: no better validation BLEU in {cfg.patience} validations",
                           file=sys.stderr)
                break
            if self.stop_requested:
                tqdm.write(f"{self.stop_requested} at step {st.step}: saving last.pt; run the "
                          f"same command again to resume", file=sys.stderr)
                break
        bar.close()
        if self._window.loss:
            self.log_train()
        if last_valid != st.step and st.best_bleu < 0 and not self.stop_requested:
            self.validate()
            last_save = -1
        if last_save != st.step:  # not twice in a row: last.pt.prev stays an older state
            self.save("last.pt")
        if not self.stop_requested and self.cfg.average_last:
            if not checkpoint.snapshots(self.run_dir)[-1:] == [self.run_dir / f"step_{st.step}.pt"]:
                self.save_snapshot()
            rec = self.average_snapshots()
            if rec:
                tqdm.write(f"average of the last {rec['averaged']} snapshots: valid BLEU "
                           f"{rec['valid_bleu']}" + (" (best)" if rec.get("best") else ""),
                           file=sys.stderr)
        self.plot()
        if st.oom_skipped:
            tqdm.write(f"warning: {st.oom_skipped} batch(es) were skipped after running out of "
                       f"memory; lower train.max_tokens to use them", file=sys.stderr)
        return st
