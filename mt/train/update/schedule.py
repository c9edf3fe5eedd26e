"""The "Noam" learning-rate schedule (Vaswani et al. 2017, eq. 3), the cool-down at the end of a
budget, and the optimizer they drive (Adam, mt/train/update/optim.py)."""

from __future__ import annotations

from mt.train.update.optim import Adam


def noam(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step >= 1:
    linear warm-up for `warmup` updates, then decay with the inverse square root."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def budget_progress(step: int, seconds: float, max_steps: int, max_minutes: float) -> float:
    """How much of the training budget is spent, 0..1: the larger of the updates' share of
    max_steps and, when there is a time budget (max_minutes > 0), the clock's share of it."""
    progress = step / max_steps
    if max_minutes > 0:
        progress = max(progress, seconds / (60.0 * max_minutes))
    return min(1.0, progress)


def cooldown_scale(progress: float, fraction: float) -> float:
    """The factor on the learning rate in the last `fraction` of the budget: 1 before it, then
    a straight line to 0 at the end. A schedule that anneals to zero by the end of a fixed
    budget beats one that never does (Li et al. 2020, "Budgeted Training"), and a short
    linear cool-down after a long phase at the schedule's own rate matches a full cosine
    (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
    Durations"). fraction 0: no cool-down."""
    if fraction <= 0.0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - progress) / fraction))


class Noam:
    """Sets the optimizer's learning rate to noam(k + 1) after k updates (k = `last_epoch`,
    the name and state_dict of torch.optim.lr_scheduler.LambdaLR, which this replaces: LambdaLR
    takes a torch.optim.Optimizer, and mt's Adam is not one), times the cool-down factor of
    the budget spent so far (`set_progress`)."""

    def __init__(
        self, optimizer, d_model: int, warmup: int, factor: float = 1.0, cooldown: float = 0.0
    ):
        self.optimizer, self.d_model, self.warmup, self.factor = optimizer, d_model, warmup, factor
        self.cooldown = cooldown
        self.last_epoch = 0
        self.scale = 1.0
        self._apply()

    def _apply(self) -> None:
        lr = noam(self.last_epoch + 1, self.d_model, self.warmup, self.factor) * self.scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        self.last_epoch += 1
        self._apply()

    def rewind(self, updates: int) -> None:
        """Take back `updates` steps that turned out to be skipped (mt/train/update/skips.py)."""
        self.last_epoch -= updates
        self._apply()

    def set_progress(self, progress: float) -> None:
        """The next update's learning rate, now that `progress` (0..1) of the budget is spent."""
        self.scale = cooldown_scale(progress, self.cooldown)
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch, "scale": self.scale}

    def load_state_dict(self, state_dict: dict) -> None:
        self.last_epoch = int(state_dict["last_epoch"])
        self.scale = float(state_dict.get("scale", 1.0))  # checkpoints from before cool-down
        self._apply()


def build_optimizer(params, cfg_train, d_model: int) -> tuple[Adam, Noam]:
    """Adam (beta1, beta2, eps as configured; the paper uses 0.9, 0.98, 1e-9) with the Noam
    schedule and the configured cool-down."""
    opt = Adam(
        params,
        lr=1.0,
        betas=(cfg_train.adam_beta1, cfg_train.adam_beta2),
        eps=cfg_train.adam_eps,
        weight_decay=cfg_train.weight_decay,
    )
    return opt, Noam(opt, d_model, cfg_train.warmup, cfg_train.lr_factor, cfg_train.cooldown)
