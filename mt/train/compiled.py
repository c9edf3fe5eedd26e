"""torch.compile for training (train.compile): the objective's loss with the model inside it,
for dynamic shapes, or static ones when the batches come in a few shapes (train.shape_buckets)
or in one (train.pack_width)."""

from __future__ import annotations

import torch


def compiled(loss, static_shapes: bool):
    """The loss function loss(model, batch) (the objective's: the model's forward and the
    label-smoothed loss, which then fuse) under torch.compile. Length-sorted batches come in
    a new shape almost every time: one compilation for dynamic shapes. Bucketed or packed
    batches (static_shapes) come in a few fixed ones (said at start-up): static shapes, one
    compilation each, with Dynamo's limit on recompilations (8 by default) raised to cover
    them."""
    if not static_shapes:
        return torch.compile(loss, dynamic=True)
    from torch._dynamo import config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, STATIC_SHAPES_LIMIT)
    return torch.compile(loss, dynamic=False)


# the most batch shapes compiled statically (a WMT-like corpus at shape_buckets 16: 36)
STATIC_SHAPES_LIMIT = 128
