"""An exponential moving average of the weights (Polyak & Juditsky 1992; Marian's
exponential smoothing, fairseq's --ema-decay): training goes on with the raw weights, while
validation, the step_N.pt snapshots and best.pt hold the average, which moves less with each
noisy update than the weights themselves."""

from __future__ import annotations

import torch


class WeightAverage:
    """average <- d * average + (1 - d) * weights after every update, with
    d = min(decay, (1 + n) / (10 + n)) after n updates, so that the first updates' weights,
    close to the random initialisation, fade quickly (TensorFlow's ExponentialMovingAverage
    with num_updates)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay, self.updates = decay, 0
        self.params = list(model.parameters())  # tied parameters once
        self.average = [p.detach().clone() for p in self.params]

    @classmethod
    def for_run(cls, model: torch.nn.Module, decay: float, is_main: bool) -> WeightAverage | None:
        """The average of a run with train.ema_decay `decay` (0: none), on rank 0 alone: it
        alone validates and saves."""
        return cls(model, decay) if decay > 0 and is_main else None

    def update(self) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        with torch.no_grad():
            torch._foreach_lerp_(self.average, [p.detach() for p in self.params], 1.0 - d)

    def weights(self, model: torch.nn.Module) -> dict:
        """model.state_dict() with every parameter's average in its place (under each name of
        a tied parameter); buffers as they are."""
        average = {id(p): a for p, a in zip(self.params, self.average, strict=True)}
        return {
            k: average.get(id(v), v).detach() for k, v in model.state_dict(keep_vars=True).items()
        }

    def state_dict(self, model: torch.nn.Module) -> dict:
        return {"updates": self.updates, "weights": self.weights(model)}

    def load_state_dict(self, state: dict, model: torch.nn.Module) -> None:
        named = model.state_dict(keep_vars=True)
        by_param = {id(v): k for k, v in named.items()}
        for p, a in zip(self.params, self.average, strict=True):
            a.copy_(state["weights"][by_param[id(p)]])
        self.updates = int(state["updates"])
