"""One optimizer update, written two ways behind one call, `update(batches, state)`, which
returns the update's log row (its loss and NLL sums and target tokens) or None when it was
skipped, and leaves the schedule, the step count and the weight average to the Trainer.

`PlainUpdate` is the update as a textbook writes it, for one process on a CPU: zero the
gradients, `loss.backward()` over the micro-batches, clip, `optimizer.step()`. The host reads
the loss once per update to skip a non-finite one, which costs a CPU nothing.

`DeviceUpdate` is the same update for a GPU and for several ranks, where each read of the
device by the host keeps the GPU waiting for Python and each rank's collective costs a round
trip: the gradients are gathered into flat buffers and exchanged in one all-reduce with the
sums riding along (mt/train/update/exchange.py), divided by the update's tokens and clipped on the
device, and a skipped update is skipped by Adam on the device, counted there and taken back at
the host's next read (mt/train/update/skips.py). Both give the same weights from the same batches
(tests/test_step.py), write the same checkpoints and logs, and a run resumes across them.

train.update chooses (build.py): auto takes the device update on a GPU or with several
ranks, the plain one in one CPU process, as the search takes its pace from the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mt.data.batching import Batch
from mt.runtime.device import autocast
from mt.runtime.distributed import Dist
from mt.train.state import TrainState
from mt.train.update.exchange import out_of_memory_under_ddp
from mt.train.update.skips import FP16_OVERFLOW, NONFINITE, OUT_OF_MEMORY, Skips


def forward(model, loss: Callable, batch: Batch, device: torch.device, amp_dtype) -> tuple:
    """loss(model, batch): the (loss, NLL) sums over its target tokens, under autocast."""
    with autocast(device, amp_dtype):
        return loss(model, batch)


class Kind:
    """What the kinds share (mt/train/update/build.py's Update): the batches they are handed
    are theirs alone, and a skip answers None once Skips has counted and logged it (and
    stopped a run of non-finite ones; the next update writes over the gradients)."""

    copies_batches = False
    skips: Skips
    device: torch.device
    optimizer: Any
    scaler: torch.amp.GradScaler

    def _skipped(self, state: TrainState, reason: str, **details) -> torch.Tensor | None:
        self.skips.skip(state, reason, **details)
        return None

    def _scaled_step(self, state: TrainState) -> bool:
        """optimizer.step() through the GradScaler; False where fp16's scaler found inf/NaN
        gradients, skipped the step and lowered its scale (counted: fairseq too counts no
        step then)."""
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if scale is not None and self.scaler.get_scale() < scale:
            self._skipped(state, FP16_OVERFLOW, loss_scale=self.scaler.get_scale())
            return False
        return True

    def _out_of_memory(self, state: TrainState, batch: Batch) -> torch.Tensor | None:
        """The update skipped for running out of memory on `batch`, the allocator's cache
        emptied first on a GPU."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return self._skipped(state, OUT_OF_MEMORY, src_shape=list(batch.src.shape))


class PlainUpdate(Kind):
    """loss: the objective's loss(model, batch), summed over target tokens (or its compiled
    form); clip_norm: train.clip_norm (0: none); scaler: the GradScaler (on for fp16)."""

    def __init__(
        self,
        model,
        loss,
        optimizer,
        scaler,
        clip_norm: float,
        skips: Skips,
        device: torch.device,
        amp_dtype,
    ) -> None:
        self.model, self.loss, self.optimizer, self.scaler = model, loss, optimizer, scaler
        self.clip_norm, self.skips = clip_norm, skips
        self.device, self.amp_dtype = device, amp_dtype

    def __call__(self, batches: list[Batch], state: TrainState) -> torch.Tensor | None:
        """One update from `batches` (gradient accumulation): the gradient of the mean token
        loss over all of them, as one batch of them all would give."""
        self.optimizer.zero_grad()
        tokens = sum(b.n_tokens for b in batches)
        sums = torch.zeros(2, device=self.device)  # the loss and NLL summed over tokens
        try:
            for batch in batches:
                loss, nll = forward(self.model, self.loss, batch, self.device, self.amp_dtype)
                self.scaler.scale(loss / tokens).backward()  # (fp16: times its loss scale)
                sums += torch.stack([loss.detach(), nll.detach()]).float()
        except torch.OutOfMemoryError:
            return self._out_of_memory(state, batches[0])
        if not math.isfinite(sums[0].item()):  # an update from it would poison the weights
            return self._skipped(state, NONFINITE)
        if self.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        if not self._scaled_step(state):
            return None
        state.nonfinite_in_a_row = 0
        return torch.cat([sums, sums.new_tensor([float(tokens)])])

    def settle(self, state: TrainState) -> None:
        """Nothing to take back: every skip is known at once."""


class DeviceUpdate(Kind):
    """exchange: mt/train/update/exchange.py's Flat or DDP; loss: the objective's loss(model,
    batch), or its compiled form; scheduler and ema: what a skip found late is taken back
    from (ema None: no weight average)."""

    def __init__(
        self,
        model,
        loss,
        exchange,
        optimizer,
        scheduler,
        scaler,
        ema,
        skips: Skips,
        clip_norm: float,
        dist: Dist,
        device: torch.device,
        amp_dtype,
    ):
        self.model, self.loss, self.exchange = model, loss, exchange
        self.optimizer, self.scheduler, self.scaler, self.ema = optimizer, scheduler, scaler, ema
        self.skips, self.clip_norm, self.dist = skips, clip_norm, dist
        self.device, self.amp_dtype = device, amp_dtype

    def __call__(self, batches: list[Batch], state: TrainState) -> torch.Tensor | None:
        """One update from `batches` and the other ranks', normalised by all their target
        tokens, so that accumulation and ranks equal one big batch (mt/train/update/exchange.py).
        None, changing nothing, for an update known at once to be skipped (one process out
        of memory; fp16); one skipped on the device counts (its row zeros) until the host's
        next read takes it back (settle)."""
        n_tokens = sum(b.n_tokens for b in batches)
        self.exchange.begin(n_tokens)
        out_of_memory = not self._backward(batches, state)
        if out_of_memory and not self.dist.enabled:
            return self._out_of_memory(state, batches[0])
        if out_of_memory and self.device.type == "cuda":  # (on the rank that ran out, at once)
            torch.cuda.empty_cache()
        # every rank takes part, also one out of memory: the others skip the update with it
        self.exchange.reduce(out_of_memory)
        deferred = self.skips.deferred
        if deferred is None:  # fp16's GradScaler reads the device anyway
            return self._read_and_update(out_of_memory, batches, state)
        found_inf, kept, row, scale = self.exchange.finish(deferred.count, self.clip_norm)
        deferred.updates += 1
        self.optimizer.step(found_inf=found_inf, kept=kept, grad_scale=scale)
        return row

    def _backward(self, batches: list[Batch], state: TrainState) -> bool:
        """Every batch's loss and gradients added into the exchange's (mt/train/update/exchange.py).
        False when this rank ran out of memory (under DDP that ends the run)."""
        step_loss = self.exchange.wrap(self.loss)
        try:
            for i, batch in enumerate(batches):
                with self.exchange.no_sync(last=i == len(batches) - 1):
                    loss, nll = forward(self.model, step_loss, batch, self.device, self.amp_dtype)
                    # (through CUDA graphs the next call writes its outputs over these: they
                    # are added into the exchange's buffers before it)
                    self.exchange.backward(loss, nll, self.scaler)
        except torch.OutOfMemoryError:
            if not self.exchange.skips_out_of_memory:
                raise out_of_memory_under_ddp(self.dist.rank, state.step, batches) from None
            return False  # (the failed pass's tensors are freed with the exception)
        return True

    def _read_and_update(
        self, here: bool, batches: list[Batch], state: TrainState
    ) -> torch.Tensor | None:
        """The update under fp16's GradScaler: skipped at once when a rank ran out of memory
        or the loss is not finite (one read of the device)."""
        sums = self.exchange.sums()
        # (clipped after unscaling; the GradScaler steps Adam, so nothing is folded into it)
        _, _, row, _ = self.exchange.finish(None, clip_norm=0.0, fold=False)
        out_of_memory, loss = torch.stack([sums.out_of_memory, sums.loss]).tolist()
        if out_of_memory:
            where = {} if here else {"on": "another rank"}
            return self._skipped(
                state, OUT_OF_MEMORY, src_shape=list(batches[0].src.shape), **where
            )
        if not math.isfinite(loss):
            return self._skipped(state, NONFINITE)
        state.nonfinite_in_a_row = 0
        if self.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            self.exchange.clip_grad_norm_(self.clip_norm)
        return row if self._scaled_step(state) else None

    def settle(self, state: TrainState) -> None:
        """The updates skipped on the device since the host's last read taken back off the
        step count, the schedule and the weight average (Skips.take_back). Nothing to do
        under fp16's GradScaler, whose skips are known at once."""
        self.skips.take_back(state, self.scheduler, self.ema)
