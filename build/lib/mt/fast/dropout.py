"""Dropout with a cheaper mask on CPU.

`F.dropout` draws one Bernoulli sample per element from torch's CPU generator, which runs on
one core, one 32-bit draw at a time. Here each element gets a uniform random lane of 8 bits
(16 where 8 cannot express p closely), four (two) of them cut from one 32-bit word, and is
kept where its lane is at or above a threshold: p is resolved to a multiple of 1/256
(1/65536), and the kept elements are scaled by exactly 1 / P(kept), so that dropout keeps the
expectation. The bits are a hash of a counter (`random_bytes`), keyed by 2 draws from torch's
generator per mask and computed in vectorised integer passes on all cores.

The lanes, one byte per element, are what a backward pass keeps; the 0/1 mask is compared
from them straight into the float dtype it multiplies (`KeepMask.of`): multiplying a float
tensor by a uint8 or bool mask converts it in a separate pass or takes a slow path. On GPU,
F.dropout is used. The timings behind these choices: docs/performance.md.
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
    lanes: torch.Tensor  # uniform random int8 (int16) lanes, the masked tensor's shape
    threshold: int  # an element is kept where its lane >= threshold
    scale: float  # 1 / P(kept)

    def of(
        self, dtype: torch.dtype, rows: slice = slice(None), out: torch.Tensor | None = None
    ) -> torch.Tensor:
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
    lanes = random_bytes(n * (bits // 8), device).view(dtype).view(shape)
    return KeepMask(lanes, dropped - levels // 2, levels / (levels - dropped))


# lowbias32's multipliers (C. Wellons, "Prospecting for hash functions", 2018): a 32-bit
# integer hash whose output bits each flip with probability ~1/2 when any input bit does.
_M1, _M2 = 0x7FEB352D, 0x846CA68B - 2**32
_counters = torch.empty(0, dtype=torch.int32)
_scratch = torch.empty(0, dtype=torch.int32)


def random_bytes(n: int, device) -> torch.Tensor:
    """n uniform random bytes (int8): lowbias32(counter + k1) with a second key k2 mixed in
    between its rounds, four bytes from each 32-bit word. k1 and k2 come from torch's
    generator, so torch.manual_seed and the checkpointed RNG state decide every mask, and two
    masks whose counter ranges overlap (keys closer than their length) still differ."""
    global _counters, _scratch
    words = (n + 3) // 4
    k1, k2 = torch.randint(-(2**31), 2**31, (2,), dtype=torch.int64).tolist()
    if _counters.numel() < words or _counters.device != torch.device(device):
        _counters = torch.arange(words, dtype=torch.int32, device=device)
        _scratch = torch.empty_like(_counters)
    x = torch.add(_counters[:words], k1)  # int32 arithmetic wraps around
    tmp = _scratch[:words]

    def xorshift(s: int) -> None:  # x ^= x >>> s (logical shift)
        torch.bitwise_right_shift(x, s, out=tmp).bitwise_and_((1 << (32 - s)) - 1)
        x.bitwise_xor_(tmp)

    xorshift(16)
    x.mul_(_M1)
    xorshift(15)
    x.bitwise_xor_(k2)
    x.mul_(_M2)
    xorshift(16)
    return x.view(torch.int8)[:n]


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


class HashDropout(nn.Dropout):
    """nn.Dropout with the counter-hash mask on CPU (F.dropout on GPU): mt.fast.PARTS's
    dropout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
