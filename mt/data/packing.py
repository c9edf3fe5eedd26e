"""Packed batches (train.pack_width): several sentence pairs back to back in each row of a
fixed block of (rows x width) source and (rows x width) target positions, so that a whole run
has one batch shape and little padding (a compiled or CUDA-graphed step meets one shape).

Each token carries its pair's segment number within the row (1, 2, ...; 0 = padding) and its
position within its pair (restarting at 0), and attention keeps pairs apart: a source token
attends to its own pair's source, a target token to its own pair's earlier target tokens and
its own pair's source. Padding queries attend to everything (their outputs are never used and
a query with no key at all would make NaNs). So a packed batch gives each pair exactly the
losses it gets alone (tests/test_packing.py).

A block is one array of pair indices, each row ended by -1; the rows are filled in a shuffled
order of the pairs, next-fit (a pair that does not fit in the open row starts the next one),
so an epoch's blocks depend on (train.seed, epoch) alone, like the other batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mt.data.corpus import ParallelData
from mt.model.layout import Layout
from mt.tokens import BOS, EOS, PAD


@dataclass
class Packing:
    """Where each token of a packed batch belongs: segment numbers (0 = padding) and positions
    within the pair, (R, W) each side."""

    src_segments: torch.Tensor
    tgt_segments: torch.Tensor
    src_positions: torch.Tensor
    tgt_positions: torch.Tensor

    def to(self, device: torch.device) -> Packing:
        nb = device.type == "cuda"
        return Packing(*(t.to(device, non_blocking=nb) for t in vars(self).values()))

    def layout(self) -> Layout:
        """The masks and positions the model reads of this batch (Transformer.laid_out)."""
        return Layout(
            self.encoder_mask(),
            self.decoder_mask(),
            self.cross_mask(),
            self.src_positions,
            self.tgt_positions,
        )

    def encoder_mask(self) -> torch.Tensor:
        """(R, 1, W, W) may-attend: the same pair's source tokens."""
        s = self.src_segments
        return _mask(s[:, :, None] == s[:, None, :], s)

    def decoder_mask(self) -> torch.Tensor:
        """(R, 1, T, T) may-attend: the same pair's target tokens up to this one."""
        t = self.tgt_segments
        n = t.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=t.device).tril()
        return _mask((t[:, :, None] == t[:, None, :]) & causal, t)

    def cross_mask(self) -> torch.Tensor:
        """(R, 1, T, S) may-attend: the same pair's source tokens."""
        t, s = self.tgt_segments, self.src_segments
        return _mask(t[:, :, None] == s[:, None, :], t)


def _mask(same: torch.Tensor, query_segments: torch.Tensor) -> torch.Tensor:
    """Padding queries (segment 0) may attend to every key: never used, and never all -inf."""
    return (same | (query_segments == 0)[:, :, None])[:, None]


def pack_blocks(
    src_lens: np.ndarray, tgt_lens: np.ndarray, width: int, rows: int, seed: int
) -> list[np.ndarray]:
    """An epoch's blocks: the pairs shuffled by `seed`, rows filled next-fit (each side's
    lengths + 1 for EOS / BOS must fit `width`), `rows` rows a block, each row ended by -1;
    the last block may have fewer rows (pack_tensors fills it with empty ones)."""
    order = np.random.default_rng(seed).permutation(len(src_lens))
    s_need, t_need = src_lens[order] + 1, tgt_lens[order] + 1
    breaks = _next_fit(s_need.tolist(), t_need.tolist(), width)
    row_list = np.split(order, breaks)
    blocks = []
    for start in range(0, len(row_list), rows):
        parts = []
        for row in row_list[start : start + rows]:
            parts += [row, np.array([-1])]
        blocks.append(np.concatenate(parts).astype(np.int64))
    return blocks


def _next_fit(s_need: list[int], t_need: list[int], width: int) -> list[int]:
    """Where each new row starts (indices into the order, the first excluded)."""
    breaks, s_room, t_room = [], width, width
    for i, (s, t) in enumerate(zip(s_need, t_need, strict=True)):
        if s > s_room or t > t_room:
            breaks.append(i)
            s_room, t_room = width, width
        s_room -= s
        t_room -= t
    return breaks


def rows_of(block: np.ndarray) -> list[np.ndarray]:
    ends = np.flatnonzero(block < 0)
    return np.split(block, ends + 1)[:-1]


def pack_tensors(
    data: ParallelData, block: np.ndarray, width: int, rows: int, pin: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, Packing]:
    """A block's (rows, width) source, target-in and target-out ids, its target tokens and
    its Packing, built by gathers over the token arrays (no loop over tokens): the fields of
    its Batch (mt.data.batching.collate_packed)."""
    pair_rows = [r[:-1] for r in rows_of(block)]
    pairs = np.concatenate(pair_rows).astype(np.int64)
    row_of = np.repeat(np.arange(len(pair_rows)), [len(r) for r in pair_rows])
    seg_of = np.concatenate([np.arange(1, len(r) + 1) for r in pair_rows]).astype(np.int64)
    s_len, t_len = (
        data.src.lengths[pairs].astype(np.int64),
        data.tgt.lengths[pairs].astype(np.int64),
    )
    (src,), src_seg, src_pos = _side(data.src, pairs, row_of, seg_of, s_len, width, rows, ["out"])
    (tgt_out, tgt_in), tgt_seg, tgt_pos = _side(
        data.tgt, pairs, row_of, seg_of, t_len, width, rows, ["out", "in"]
    )
    tensors = [
        torch.from_numpy(x) for x in (src, tgt_in, tgt_out, src_seg, tgt_seg, src_pos, tgt_pos)
    ]
    if pin:
        tensors = [t.pin_memory() for t in tensors]
    packing = Packing(tensors[3], tensors[4], tensors[5], tensors[6])
    return tensors[0], tensors[1], tensors[2], int((t_len + 1).sum()), packing


def _side(arr, pairs, row_of, seg_of, lengths, width: int, rows: int, kinds: list[str]):
    """One side's (rows, width) ids for each of `kinds` ("out": the tokens, then EOS; "in":
    BOS, then the tokens; the source is an "out"), and its segments and positions, which every
    kind shares."""
    need = lengths + 1
    before = np.r_[0, np.cumsum(need)[:-1]]  # positions taken before each pair, all rows
    first = np.flatnonzero(np.r_[True, row_of[1:] != row_of[:-1]])  # each row's first pair
    start = before - before[first][row_of]  # each pair's first column in its row
    token_pair = np.repeat(np.arange(len(pairs)), need)
    pos = np.arange(int(need.sum())) - np.repeat(before, need)
    row, col = row_of[token_pair], start[token_pair] + pos
    base = arr.offsets[pairs[token_pair]]
    out = []
    for kind in kinds:
        if kind == "in":
            inside, source_pos, edge = pos >= 1, pos - 1, BOS
        else:
            inside, source_pos, edge = pos < lengths[token_pair], pos, EOS
        flat = base + np.where(inside, source_pos, 0)
        ids = np.full((rows, width), PAD, dtype=np.int64)
        ids[row, col] = np.where(inside, arr.data[flat].astype(np.int64), edge)
        out.append(ids)
    seg = np.zeros((rows, width), dtype=np.int64)
    posn = np.zeros((rows, width), dtype=np.int64)
    seg[row, col] = seg_of[token_pair]
    posn[row, col] = pos
    return out, seg, posn


def describe_packing(data: ParallelData, blocks: list[np.ndarray], width: int, rows: int) -> str:
    positions = len(blocks) * rows * width
    src = int(data.src.lengths.sum()) + len(data.src)
    tgt = int(data.tgt.lengths.sum()) + len(data.tgt)
    return (
        f"batches: {len(blocks)} packed blocks per epoch of {rows} rows x {width} positions a "
        f"side, in 1 shape; padding {1 - src / positions:.1%} of source, "
        f"{1 - tgt / positions:.1%} of target positions"
    )
