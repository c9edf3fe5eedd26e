"""Dropout with a cheaper mask on CPU.

`F.dropout` draws one Bernoulli sample per element, which on CPU costs as much as a large
matmul (measured: 110 ms for 8M floats). Here each element gets a uniform random lane of 8
bits (16 where 8 cannot express p closely), eight (four) of them cut from one 64-bit draw, and
is kept where its lane is at or above a threshold: p is resolved to a multiple of 1/256
(1/65536), and the kept elements are scaled by exactly 1 / P(kept), so that dropout keeps the
expectation. torch's CPU generator is the cost here (4.4M elements: 7.5 ms for 16-bit lanes,
half that for 8-bit), so fewer bits per element is the lever.

The lanes, one byte per element, are what a backward pass keeps; the 0/1 mask is compared
from them straight into the float dtype it multiplies (`KeepMask.of`). A uint8 or bool mask
would be smaller to keep but far slower to apply: multiplying a float tensor by one converts it
in a separate pass or takes a slow path (measured on (4272, 256): 1.78 ms for f * uint8, 0.14
ms for f * float; compare-and-write into float is also faster than into uint8). On GPU,
F.dropout is used.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

# 8-bit lanes unless the resolved p would be off by more than this fraction of p
_MAX_RELATIVE_ERROR = 0.02


class KeepMask(NamedTuple):
    lanes: torch.Tensor      # uniform random int8 (int16) lanes, the masked tensor's shape
    threshold: int           # an element is kept where its lane >= threshold
    scale: float             # 1 / P(kept)

    def of(self, dtype: torch.dtype, rows: slice = slice(None),
           out: torch.Tensor | None = None) -> torch.Tensor:
        """The mask of `rows` (all by default) as 0/1 values of `dtype` (1 = kept), written
        into `out` (of that dtype) when given, a new tensor otherwise."""
        lanes = self.lanes[rows]
        if out is None:
            out = torch.empty(lanes.shape, dtype=dtype, device=lanes.device)
        return torch.ge(lanes, self.threshold, out=out)


def lane_bits(p: float) -> int:
    """8 when p is within 2% of a multiple of 1/256 (0.1, 0.2, 0.3 are), else 16."""
    dropped = round(p * 256)
    return 8 if 0 < dropped < 256 and abs(dropped / 256 - p) <= _MAX_RELATIVE_ERROR * p else 16


def keep_mask(shape, p: float, device) -> KeepMask:
    """Random lanes for a dropout mask over `shape`: elements kept with probability 1 - p,
    p resolved to 1/256 or 1/65536 (see lane_bits)."""
    bits = lane_bits(p)
    dtype, levels = (torch.int8, 256) if bits == 8 else (torch.int16, 65536)
    dropped = min(max(round(p * levels), 0), levels - 1)
    n = math.prod(shape)
    per_draw = 64 // bits
    draws = torch.empty((n + per_draw - 1) // per_draw, dtype=torch.int64, device=device)
    draws.random_(-2 ** 63, None)                   # all 64 bits uniform
    lanes = draws.view(dtype)[:n].view(shape)
    return KeepMask(lanes, dropped - levels // 2, levels / (levels - dropped))


class _MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lanes, threshold, scale):
        mask = KeepMask(lanes, threshold, scale)
        ctx.save_for_backward(lanes)
        ctx.threshold, ctx.scale = threshold, scale
        return x.mul(mask.of(x.dtype)).mul_(scale)

    @staticmethod
    def backward(ctx, grad):
        (lanes,) = ctx.saved_tensors
        mask = KeepMask(lanes, ctx.threshold, ctx.scale)
        return grad.mul(mask.of(grad.dtype)).mul_(ctx.scale), None, None, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if x.is_cuda:
        return F.dropout(x, p, True)
    return _MaskedScale.apply(x, *keep_mask(x.shape, p, x.device))


class Dropout(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
