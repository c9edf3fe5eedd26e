"""Training objectives: label-smoothed cross-entropy, R-Drop, scheduled sampling, the NAT and
masked-LM losses, and `Objective`, what the Trainer minimises, as one value: the loss function
and what it needs around it (mt.train.parts.build_objective makes it from a config)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mt.data.batching import Batch


@dataclass(frozen=True)
class Objective:
    """loss(model, batch) -> (loss sum, NLL sum) over the batch's `n_tokens` (the trainer
    divides by them; the NLL gives an honest perplexity where the loss is smoothed).
    prepare(batch, seed) -> the batch the loss reads, made from the walk's batch on the CPU
    and seeded by its position alone (as word dropout is), so that ranks and resumed runs draw
    the same; None: the walked batch itself. on_step(step): told the update count before each
    update (scheduled sampling's schedule). valid_loss(model, batch, index) -> (loss sum, NLL
    sum, tokens scored), for a loss that scores only some tokens and draws which (the NAT's):
    the same draw at every validation (seeded by the batch's index); None: `loss` over
    `n_tokens`. valid_loss_over: what it scores, said with the valid loss."""

    loss: Callable[..., tuple]
    prepare: Callable[[Batch, list[int]], Batch] | None = None
    on_step: Callable[[int], None] | None = None
    valid_loss: Callable[..., tuple] | None = None
    valid_loss_over: str = ""
