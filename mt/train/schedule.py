"""The "Noam" learning-rate schedule (Vaswani et al. 2017, eq. 3) and the Adam optimizer."""
from __future__ import annotations


import torch


def noam(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step >= 1:
    linear warm-up for `warmup` updates, then decay with the inverse square root."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


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


class Adam:
    """Adam (Kingma & Ba 2015) through PyTorch's fused kernel, the one that
    `torch.optim.Adam(fused=True)` runs: one kernel updates every parameter instead of a loop
    of small ops per tensor (docs/performance.md).

    Why not torch.optim.Adam itself: `torch.optim.Optimizer` imports torch._dynamo on first
    use (its methods are wrapped to be skipped by the compiler), which costs 72 MB of
    resident memory, a sixth of what a small model's training needs besides. The update,
    the state and the state_dict are torch.optim.Adam's (tests/test_schedule.py), so
    checkpoints move between the two.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float = 0.0):
        # the keys torch.optim.Adam keeps, so that its load_state_dict accepts ours
        self.param_groups = [{
            "params": list(params), "lr": lr, "betas": tuple(betas), "eps": eps,
            "weight_decay": weight_decay, "amsgrad": False, "maximize": False, "foreach": None,
            "capturable": False, "differentiable": False, "fused": True,
            "decoupled_weight_decay": False}]
        self.state: dict[torch.Tensor, dict] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        g = self.param_groups[0]
        groups: dict[tuple, list[list[torch.Tensor]]] = {}     # by (device, dtype), as fused needs
        for p in g["params"]:
            if p.grad is None:
                continue
            st = self.state.get(p)
            if st is None:
                st = self.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32, device=p.device),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            lists = groups.setdefault((p.device, p.dtype), [[], [], [], [], []])
            for lst, t in zip(lists, (p, p.grad, st["exp_avg"], st["exp_avg_sq"], st["step"])):
                lst.append(t)
        beta1, beta2 = g["betas"]
        for params, grads, exp_avgs, exp_avg_sqs, steps in groups.values():
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=g["lr"],
                               beta1=beta1, beta2=beta2, weight_decay=g["weight_decay"],
                               eps=g["eps"], amsgrad=False, maximize=False)

    def state_dict(self) -> dict:
        params = self.param_groups[0]["params"]
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {"state": {i: dict(self.state[p]) for i, p in enumerate(params) if p in self.state},
                "param_groups": [{**group, "params": list(range(len(params)))}]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Ours or torch.optim.Adam's (one parameter group). The saved hyper-parameters are
        taken, as torch.optim does."""
        params = self.param_groups[0]["params"]
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(params):
            raise ValueError(f"the optimizer state is for {sum(len(x['params']) for x in groups)} "
                             f"parameters in {len(groups)} groups, not {len(params)} in 1")
        saved = dict(groups[0])
        saved["params"] = params
        self.param_groups[0].update(saved)
        self.param_groups[0]["betas"] = tuple(self.param_groups[0]["betas"])
        self.state = {}
        for i, p in enumerate(params):
            st = state_dict["state"].get(i)
            if st is None:
                continue
            step = torch.as_tensor(st["step"], dtype=torch.float32)
            self.state[p] = {"step": step.to(p.device),
                             "exp_avg": st["exp_avg"].to(p.device, p.dtype),
                             "exp_avg_sq": st["exp_avg_sq"].to(p.device, p.dtype)}


class Noam:
    """Sets the optimizer's learning rate to noam(k + 1) after k updates (k = `last_epoch`,
    the name and state_dict of torch.optim.lr_scheduler.LambdaLR, which this replaces),
    times the cool-down factor of the budget spent so far (`set_progress`)."""

    def __init__(self, optimizer, d_model: int, warmup: int, factor: float = 1.0,
                 cooldown: float = 0.0):
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
        self.scale = float(state_dict.get("scale", 1.0))   # checkpoints from before cool-down
        self._apply()


def build_optimizer(params, cfg_train, d_model: int) -> tuple[Adam, Noam]:
    """Adam (beta1, beta2, eps as configured; the paper uses 0.9, 0.98, 1e-9) with the Noam
    schedule and the configured cool-down."""
    opt = Adam(params, lr=1.0, betas=(cfg_train.adam_beta1, cfg_train.adam_beta2),
               eps=cfg_train.adam_eps, weight_decay=cfg_train.weight_decay)
    return opt, Noam(opt, d_model, cfg_train.warmup, cfg_train.lr_factor, cfg_train.cooldown)
