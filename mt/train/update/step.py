"""One optimizer update, written two ways behind one call, `update(batches, state)`, which
returns the update's log row (its loss and NLL sums and target tokens) or None when it was
skipped, and leaves the schedule, the step count and the weight average to the Trainer.

`PlainUpdate` is the update as a textbook writes it: zero the gradients, `loss.backward()`
over the micro-batches, clip, `optimizer.step()`. The host reads the loss once per update to
skip a non-finite one, which costs a CPU nothing, and which fp16's GradScaler does anyway.
Under ranks with train.data_parallel ddp, PyTorch's DistributedDataParallel wraps the
objective, as in nanoGPT: its all-reduces run in the last micro-batch's backward pass.

`DeviceUpdate` is the same update for a GPU and for ranks on the flat exchange, where each read
of the device by the host keeps the GPU waiting for Python and each collective costs a round
trip: the gradients are gathered into flat buffers and exchanged in one all-reduce with the
sums riding along (mt/train/update/exchange.py), divided by the update's tokens and clipped on
the device, and a skipped update is skipped by Adam on the device, counted there and taken
back at the host's next read (mt/train/update/skips.py). Both give the same weights from the
same batches (tests/test_step.py), write the same checkpoints and logs, and a run resumes
across them.

train.update chooses (build.py): auto takes the device update on a GPU or with ranks, but the
plain one for fp16 and for DDP, and in one CPU process.
"""

from __future__ import annotations

import contextlib
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
    form); clip_norm: train.clip_norm (0: none); scaler: the GradScaler (on for fp16); ddp:
    the objective wrapped in DistributedDataParallel (exchange.ddp_objective) under ranks,
    else None."""

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
        dist: Dist | None = None,
        ddp=None,
    ) -> None:
        self.model, self.loss, self.optimizer, self.scaler = model, loss, optimizer, scaler
        self.clip_norm, self.skips = clip_norm, skips
        self.device, self.amp_dtype = device, amp_dtype
        self.dist, self.ddp = dist or Dist(), ddp

    def __call__(self, batches: list[Batch], state: TrainState) -> torch.Tensor | None:
        """One update from `batches` (gradient accumulation) and the other ranks': the
        gradient of the mean token loss over all of them, as one batch of them all would
        give (DDP averages the ranks' gradients, so each rank divides by its share of the
        tokens of them all)."""
        self.optimizer.zero_grad(set_to_none=self.ddp is None)  # (DDP's buckets stay)
        tokens = self._tokens(sum(b.n_tokens for b in batches))
        sums = torch.zeros(2, device=self.device)  # the loss and NLL summed over tokens
        try:
            for i, batch in enumerate(batches):
                with self._no_sync(last=i == len(batches) - 1):
                    loss, nll = self._forward(batch)
                    self.scaler.scale(loss / tokens).backward()  # (fp16: times its scale)
                sums += torch.stack([loss.detach(), nll.detach()]).float()
        except torch.OutOfMemoryError:
            if self.ddp is not None:
                raise out_of_memory_under_ddp(self.dist.rank, state.step, batches) from None
            return self._out_of_memory(state, batches[0])
        sums = self.dist.sum(sums)  # (every rank skips a non-finite update with the others)
        if not math.isfinite(sums[0].item()):  # an update from it would poison the weights
            return self._skipped(state, NONFINITE)
        if self.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        if not self._scaled_step(state):
            return None
        state.nonfinite_in_a_row = 0
        return torch.cat([sums, sums.new_tensor([tokens * self.dist.world])])

    def _tokens(self, mine: int) -> float:
        """The target tokens each rank divides its loss by: its own, or under DDP the ranks'
        together over their number (DDP averages what they give)."""
        if self.ddp is None:
            return float(mine)
        total = self.dist.sum(torch.full((), float(mine), device=self.device))
        return total.item() / self.dist.world

    def _forward(self, batch: Batch) -> tuple:
        if self.ddp is None:
            return forward(self.model, self.loss, batch, self.device, self.amp_dtype)
        with autocast(self.device, self.amp_dtype):
            return self.ddp(batch)

    def _no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Accumulation under DDP: the ranks exchange in the last micro-batch's backward."""
        return self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext()

    def settle(self, state: TrainState) -> None:
        """Nothing to take back: every skip is known at once."""


class DeviceUpdate(Kind):
    """exchange: mt/train/update/exchange.py's Flat; loss: the objective's loss(model,
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
        None, changing nothing, for one process out of memory; an update skipped on the
        device counts (its row zeros) until the host's next read takes it back (settle)."""
        n_tokens = sum(b.n_tokens for b in batches)
        self.exchange.begin(n_tokens)
        out_of_memory = not self._backward(batches)
        if out_of_memory and not self.dist.enabled:
            return self._out_of_memory(state, batches[0])
        if out_of_memory and self.device.type == "cuda":  # (on the rank that ran out, at once)
            torch.cuda.empty_cache()
        # every rank takes part, also one out of memory: the others skip the update with it
        self.exchange.reduce(out_of_memory)
        deferred = self.skips.deferred
        assert deferred is not None  # (the device update's skips are counted on the device)
        found_inf, kept, row, scale = self.exchange.finish(deferred.count, self.clip_norm)
        deferred.updates += 1
        self.optimizer.step(found_inf=found_inf, kept=kept, grad_scale=scale)
        return row

    def _backward(self, batches: list[Batch]) -> bool:
        """Every batch's loss and gradients added into the exchange's buffers
        (mt/train/update/exchange.py). False when this rank ran out of memory."""
        try:
            for batch in batches:
                loss, nll = forward(self.model, self.loss, batch, self.device, self.amp_dtype)
                # (through CUDA graphs the next call writes its outputs over these: they are
                # added into the exchange's buffers before it)
                self.exchange.backward(loss, nll, self.scaler)
        except torch.OutOfMemoryError:
            return False  # (the failed pass's tensors are freed with the exception)
        return True

    def settle(self, state: TrainState) -> None:
        """The updates skipped on the device since the host's last read taken back off the
        step count, the schedule and the weight average (Skips.take_back)."""
        self.skips.take_back(state, self.scheduler, self.ema)
