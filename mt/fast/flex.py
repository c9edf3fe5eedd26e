"""Packed attention without a dense mask, for a compiled step on a GPU.

A packed batch (train.pack_width; mt/data/packing.py) keeps its pairs apart through attention
masks. The reference builds them dense, (R, 1, W, W) booleans, which PyTorch's fused
attention kernels cannot take: the step then falls back to the kernel that reads a mask, at
every layer. Here the same masks are FlexAttention block masks (torch.nn.attention
.flex_attention), built once per batch from the pairs' segment numbers: blocks of keys that no
query of a block may see are skipped, and the kernel that torch.compile generates applies the
rest inside its tiles, never reading a mask from memory.

FlexAttention has no attention-weight dropout and no relative-position bias here, and no
backward on a CPU: mt.train.parts picks flex_layout and FlexMultiHeadAttention for a compiled
step on a GPU, with model.attn_dropout 0 and absolute positions (tests/test_packing.py
compares them with the dense masks on the CPU, tests/test_cuda.py their gradients and updates
on a GPU).
"""

from __future__ import annotations

from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from mt.model.attention import MultiHeadAttention
from mt.model.layout import Layout


def encoder_mask_mod(src_segments):
    """May-attend of the packed encoder: the same pair's source tokens (padding queries: all,
    as in mt/data/packing.py)."""

    def may_attend(b, h, q, k):
        return (src_segments[b, q] == src_segments[b, k]) | (src_segments[b, q] == 0)

    return may_attend


def decoder_mask_mod(tgt_segments):
    """The same pair's target tokens up to the query's own."""

    def may_attend(b, h, q, k):
        same = (tgt_segments[b, q] == tgt_segments[b, k]) & (k <= q)
        return same | (tgt_segments[b, q] == 0)

    return may_attend


def cross_mask_mod(tgt_segments, src_segments):
    """The same pair's source tokens."""

    def may_attend(b, h, q, k):
        return (tgt_segments[b, q] == src_segments[b, k]) | (tgt_segments[b, q] == 0)

    return may_attend


# the side of a block FlexAttention skips whole when no query of it may see a key of it: its
# default tile, 128. Smaller blocks skip more of a packed row's area between pairs, at more
# blocks to visit (scripts/bench/gpu_ablate.py measures which pays).
BLOCK_SIZE = 128


def _block_mask(mask_mod, queries, keys) -> BlockMask:
    rows, n_q = queries.shape
    return create_block_mask(
        mask_mod, rows, None, n_q, keys.shape[1], device=queries.device, BLOCK_SIZE=BLOCK_SIZE
    )


def flex_layout(packing) -> Layout:
    """A packed batch's Layout (mt.data.packing.Packing.layout's) with block masks for its
    attention, made from its pairs' segment numbers."""
    s, t = packing.src_segments, packing.tgt_segments
    return Layout(
        _block_mask(encoder_mask_mod(s), s, s),
        _block_mask(decoder_mask_mod(t), t, t),
        _block_mask(cross_mask_mod(t, s), t, s),
        packing.src_positions,
        packing.tgt_positions,
    )


class FlexMultiHeadAttention(MultiHeadAttention):
    """Attention that takes a BlockMask through flex_attention; any other mask goes to the
    reference."""

    def forward(self, x, memory=None, mask=None, cache=None, positions=None, need_weights=False):
        if not isinstance(mask, BlockMask):
            return super().forward(x, memory, mask, cache, positions, need_weights)
        if self.training and self.dropout > 0:
            raise ValueError("flex_attention has no attention dropout (model.attn_dropout)")
        b, t, d = x.shape
        q, k, v = self.project(x, memory, None)
        ctx = flex_attention(q, k, v, block_mask=mask)  # softmax(QK^T/sqrt(d_k)) V, eq. 1
        return self.out(ctx.transpose(1, 2).reshape(b, t, d))
