"""Non-finite updates found without stopping the host: on a GPU the trainer does not ask after
every update whether its loss was finite (a host sync that keeps the GPU waiting for Python).
The update itself is skipped on the device: Adam's fused kernel takes a found-inf flag and
leaves weights and moments untouched (mt/fast/optim.py), and the logged loss and token sums
leave it out. The host reads how many updates were skipped at the points where it reads the
device anyway (every CHECK_EVERY updates, and before logging, validating and saving) and
takes them back off the step count and the schedule, so a skipped update is still not a step
and saved states stay consistent (resuming stays exact: the reads come at steps the schedule
fixes, in the interrupted run as in the uninterrupted one)."""

from __future__ import annotations

import torch

CHECK_EVERY = 8  # updates between the host's reads of the skipped count


class DeferredSkips:
    """The skipped updates since the last read, and their target tokens, on the device."""

    def __init__(self, device: torch.device):
        self.count = torch.zeros((), dtype=torch.float32, device=device)
        self.tokens = torch.zeros((), dtype=torch.float32, device=device)
        self.updates = 0  # recorded since the last take (known on the host)

    def record(self, finite: torch.Tensor, n_tokens: int) -> torch.Tensor:
        """One update's flag (a 0-dim bool tensor); returns Adam's found-inf flag for it."""
        bad = (~finite).float()
        self.updates += 1
        self.count += bad
        self.tokens += bad * n_tokens
        return bad

    def take(self) -> tuple[int, int, int]:
        """(skipped updates, their target tokens, updates recorded) since the last take: one
        read of the device; the counts start again from 0."""
        count, tokens = torch.stack([self.count, self.tokens]).tolist()
        self.count.zero_()
        self.tokens.zero_()
        updates, self.updates = self.updates, 0
        return int(count), int(tokens), updates

    @staticmethod
    def due(step: int, *intervals: int) -> bool:
        """Whether the host reads the count after update `step`: every CHECK_EVERY updates,
        and at every step where it logs, validates or saves (`intervals`)."""
        return any(step % every == 0 for every in (CHECK_EVERY, *intervals))


def nonfinite_message(in_a_row: int, step: int) -> str:
    return (
        f"the loss was NaN/inf for {in_a_row} updates in a row at step {step}; training "
        f"stopped, the last good checkpoint is kept (last.pt); lower train.lr_factor or raise "
        f"train.warmup"
    )
