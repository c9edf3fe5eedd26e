"""torch.compile for training (train.compile): the objective's loss with the model inside it,
for dynamic shapes, or static ones when the batches come in a few shapes (train.shape_buckets)
or in one (train.pack_width); on a GPU each static shape's step is then captured as a CUDA
graph and replayed."""

from __future__ import annotations

import torch

from mt.objectives import Objective


def compiled(loss, static_shapes: bool, cuda_graphs: bool = False):
    """The loss function loss(model, batch) (the objective's: the model's forward and the
    label-smoothed loss, which then fuse) under torch.compile. Length-sorted batches come in
    a new shape almost every time: one compilation for dynamic shapes. Bucketed or packed
    batches (static_shapes) come in a few fixed ones (said at start-up): static shapes, one
    compilation each, with Dynamo's limit on recompilations (8 by default) raised to cover
    them. cuda_graphs (static shapes on a GPU): each shape's forward and backward are recorded
    as CUDA graphs and replayed (torch.compile's reduce-overhead mode), so the host launches
    one graph instead of every kernel; a replay writes its outputs where the previous replay
    of that graph wrote them, so whatever outlives a call is copied (Trainer._backward)."""
    from mt.runtime.env import use_compile_cache

    use_compile_cache()
    if not static_shapes:
        return torch.compile(loss, dynamic=True)
    from torch._dynamo import config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, STATIC_SHAPES_LIMIT)
    if cuda_graphs:
        return torch.compile(loss, dynamic=False, mode="reduce-overhead")
    return torch.compile(loss, dynamic=False)


# the most batch shapes compiled statically (a WMT-like corpus at shape_buckets 16: 36)
STATIC_SHAPES_LIMIT = 128


def compiled_step(
    objective: Objective, cfg, compile: bool | None, device: torch.device, graphs: bool = True
):
    """(whether the step runs through CUDA graphs, the compiled loss or None): train.compile
    as resolved for this device and objective (mt.train.parts.compile_applies; None: the
    config's true alone). Static shapes (shape buckets, packed blocks) compile once per
    shape, and on a GPU each is replayed as a CUDA graph (`compiled`) where `graphs` allows:
    the plain update (mt/train/update/step.py) lets autograd add a micro-batch's gradients into the
    previous one's, which a replay would have written over, so it compiles without them."""
    compile = cfg.compile is True if compile is None else compile
    if not compile:
        return False, None
    static = bool(cfg.shape_buckets or cfg.pack_width)  # a few batch shapes, or one
    cuda_graphs = static and device.type == "cuda" and graphs
    return cuda_graphs, compiled(objective.loss, static, cuda_graphs)
