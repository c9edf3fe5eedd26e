"""Adam without torch.optim's import cost: PyTorch's fused Adam kernel called directly."""

from __future__ import annotations

import operator
from typing import Any

import torch


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

    def __init__(
        self, params, lr: float, betas: tuple[float, float], eps: float, weight_decay: float = 0.0
    ):
        # the keys torch.optim.Adam keeps, so that its load_state_dict accepts ours
        self.param_groups: list[dict[str, Any]] = [
            {
                "params": list(params),
                "lr": lr,
                "betas": tuple(betas),
                "eps": eps,
                "weight_decay": weight_decay,
                "amsgrad": False,
                "maximize": False,
                "foreach": None,
                "capturable": False,
                "differentiable": False,
                "fused": True,
                "decoupled_weight_decay": False,
            }
        ]
        self.state: dict[torch.Tensor, dict] = {}
        # (the gradients the lists were built for, the lists by (device, dtype)): _group_lists
        self._lists: tuple[list, dict] | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(
        self,
        found_inf: torch.Tensor | None = None,
        kept: torch.Tensor | None = None,
        grad_scale: torch.Tensor | None = None,
        lr: torch.Tensor | None = None,
    ) -> None:
        """One update; found_inf (a 0-dim float tensor on the parameters' device, 1.0 or 0.0)
        skips it on the device when 1: weights, moments and step counts stay as they were,
        with no read of the device (mt/train/update/skips.py). kept: 1 - found_inf, where the
        caller has it already (a kernel fewer). grad_scale (0-dim float32): every gradient
        is divided by it as the kernel reads it (and left so), instead of by a pass of its
        own (mt/train/update/exchange.py's settle). lr: a 0-dim float32 tensor on the device that
        replaces the group's lr, for an update captured once and replayed (graphed.py)."""
        g = self.param_groups[0]
        now = [p.grad for p in g["params"]]
        if self._lists is None or not all(map(operator.is_, now, self._lists[0])):
            self._lists = now, self._group_lists(g["params"])
        groups = self._lists[1]
        beta1, beta2 = g["betas"]
        for (device, _), (params, grads, exp_avgs, exp_avg_sqs, steps) in groups.items():
            inf, scale = found_inf, grad_scale
            if scale is not None and scale.device != device:
                scale = scale.to(device)
            if inf is None:
                torch._foreach_add_(steps, 1)
            else:  # a skipped update does not count (as in torch.optim)
                inf = inf if inf.device == device else inf.to(device)
                add = 1 - inf if kept is None else kept
                torch._foreach_add_(steps, [add] * len(steps))
            torch._fused_adam_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                lr=g["lr"] if lr is None else lr,
                beta1=beta1,
                beta2=beta2,
                weight_decay=g["weight_decay"],
                eps=g["eps"],
                amsgrad=False,
                maximize=False,
                grad_scale=scale,
                found_inf=inf,
            )

    def _group_lists(self, params) -> dict[tuple, list[list[torch.Tensor]]]:
        """The fused kernel's lists (parameters, gradients, moments, step counts) by device
        and dtype, over the parameters that have a gradient, their state made where missing.
        Built once and kept while every gradient is the same tensor (the trainer's live in
        flat buffers: mt/train/update/exchange.py)."""
        groups: dict[tuple, list[list[torch.Tensor]]] = {}
        for p in params:
            if p.grad is None:
                continue
            st = self.state.get(p)
            if st is None:
                st = self.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32, device=p.device),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
            lists = groups.setdefault((p.device, p.dtype), [[], [], [], [], []])
            for lst, t in zip(
                lists, (p, p.grad, st["exp_avg"], st["exp_avg_sq"], st["step"]), strict=True
            ):
                lst.append(t)
        return groups

    def state_dict(self) -> dict:
        params = self.param_groups[0]["params"]
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {
            "state": {i: dict(self.state[p]) for i, p in enumerate(params) if p in self.state},
            "param_groups": [{**group, "params": list(range(len(params)))}],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Ours or torch.optim.Adam's (one parameter group). The saved hyper-parameters are
        taken, as torch.optim does."""
        params = self.param_groups[0]["params"]
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(params):
            raise ValueError(
                f"the optimizer state is for {sum(len(x['params']) for x in groups)} "
                f"parameters in {len(groups)} groups, not {len(params)} in 1"
            )
        saved = dict(groups[0])
        saved["params"] = params
        self.param_groups[0].update(saved)
        self.param_groups[0]["betas"] = tuple(self.param_groups[0]["betas"])
        self.state = {}
        self._lists = None  # (they hold the old state's tensors)
        for i, p in enumerate(params):
            st = state_dict["state"].get(i)
            if st is None:
                continue
            step = torch.as_tensor(st["step"], dtype=torch.float32)
            self.state[p] = {
                "step": step.to(p.device),
                "exp_avg": st["exp_avg"].to(p.device, p.dtype),
                "exp_avg_sq": st["exp_avg_sq"].to(p.device, p.dtype),
            }
