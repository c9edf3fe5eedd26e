"""Updates that did not happen. Three things can stop an update: a batch that runs out of
memory (every rank drops it), a loss that is not finite (an update from it would poison the
weights and Adam's moments), and fp16 gradients that overflow (the GradScaler's business).
Whatever stopped it, a skipped update is not a step: neither the step count nor the schedule
moves, and `Skips.skip` counts and logs it.

The plain update (mt/train/update/step.py: one CPU process) reads each update's loss and skips at
once. The device update (a GPU, several ranks) does not ask after every update whether its loss
was finite or a rank ran out of memory, a host sync that keeps a GPU waiting for Python (and,
with several ranks, a collective). The update is skipped on the device instead: Adam's fused
kernel takes a found-inf flag and leaves weights and moments untouched (optim.py), and
the logged sums leave it out (LogWindow). The host reads how many were skipped every READ_EVERY
updates and before it logs, validates, saves or stops, and takes them back off the step count
and the schedule, so a saved state never counts an update Adam skipped (resuming stays exact:
the reads come at steps the schedule fixes). fp16's GradScaler skips by reading the device
once per update, so with it the device update reads the update's sums at once too."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mt.errors import MTError
from mt.train.state import TrainState

READ_EVERY = 8  # updates between the host's reads of the count skipped on the device

# the reasons, as the log names them
NONFINITE, OUT_OF_MEMORY, FP16_OVERFLOW = (
    "non-finite loss",
    "out of memory",
    "fp16 gradient overflow",
)


class Skips:
    """Counts and logs skipped updates, and stops a run of non-finite ones at max_nonfinite in
    a row. deferred: skipped updates are found on the device (`deferred`) and settled at the
    host's reads (the device update without fp16's GradScaler); else each update's skip is
    known at once (the plain update, and fp16's, which read each update's sums)."""

    def __init__(
        self,
        device: torch.device,
        deferred: bool,
        max_nonfinite: int,
        write_log: Callable[[dict], None],
    ):
        self.deferred = DeferredSkips(device) if deferred else None
        self.max_nonfinite, self.write_log = max_nonfinite, write_log

    def skip(self, st: TrainState, reason: str, count: int = 1, **details) -> None:
        """`count` updates were skipped for `reason` (st.step: the updates made)."""
        if reason == OUT_OF_MEMORY:
            st.oom_skipped += count
        elif reason == FP16_OVERFLOW:
            st.fp16_skipped += count
        else:
            st.nonfinite_in_a_row += count
            details["in_a_row"] = st.nonfinite_in_a_row
        self.write_log({"step": st.step, "skipped": reason, "count": count, **details})
        if reason == NONFINITE and st.nonfinite_in_a_row >= self.max_nonfinite:
            raise MTError(
                f"the loss was NaN/inf for {st.nonfinite_in_a_row} updates in a row at step "
                f"{st.step}; training stopped, the last good checkpoint is kept (last.pt); "
                f"lower train.lr_factor or raise train.warmup"
            )

    def take_back(self, st: TrainState, scheduler, ema) -> None:
        """Read how many updates since the last read were skipped on the device, and take
        them back off the step count, the schedule (`scheduler.rewind`) and the weight
        average (ema; None: none), so that nothing saved or logged counts them (the log
        window left them out). Nothing to do where skips are known at once (not deferred)."""
        if self.deferred is None:
            return
        count, out_of_memory, updates = self.deferred.take()
        if count < updates:  # a good update among them (the order is not known: the
            st.nonfinite_in_a_row = 0  # skipped ones count as the latest)
        if not count:
            return
        st.step -= count
        scheduler.rewind(count)
        if ema is not None:
            ema.updates -= count
        if out_of_memory:
            self.skip(st, OUT_OF_MEMORY, count=out_of_memory)
        if count > out_of_memory:
            self.skip(st, NONFINITE, count=count - out_of_memory)

    def due(self, step: int, *intervals: int) -> bool:
        """Whether update `step` is a check step, where the host reads the deferred count and
        the ranks agree on the clock and signals: every READ_EVERY updates, and at every step
        where the trainer logs, validates or saves (`intervals`)."""
        return any(step % every == 0 for every in (READ_EVERY, *intervals))


class DeferredSkips:
    """The updates skipped on the device since the last read, and how many of them for lack
    of memory (the others: a loss that was not finite)."""

    def __init__(self, device: torch.device):
        # (skipped, of them out of memory), added to on the device (mt/train/update/exchange.py)
        self.count = torch.zeros(2, dtype=torch.float32, device=device)
        self.updates = 0  # made since the last take (known on the host)

    def take(self) -> tuple[int, int, int]:
        """(skipped updates, of them for lack of memory, updates recorded) since the last
        take: one read of the device; the counts start again from 0."""
        count, memory = self.count.tolist()
        self.count.zero_()
        updates, self.updates = self.updates, 0
        return int(count), int(memory), updates
