"""Length-bucketed batches of about `max_tokens` (padding included) and their tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mt.data.corpus import ParallelData, TokenArray
from mt.data.packing import Packing, pack_tensors
from mt.tokens import BOS, EOS, PAD, UNK


def token_batches(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int | None
) -> list[np.ndarray]:
    """Group sentence indices into batches whose padded size stays under `max_tokens`.

    Sorting by length before cutting keeps padding low; with a seed, ties are broken randomly
    and the batch order is shuffled, so each epoch differs yet is reproducible from the seed.
    The order walks the (source, target) length plane shell by shell (see `length_order`),
    so both sides of a batch have similar lengths, not only the source.
    """
    n = len(src_lens)
    rng = np.random.default_rng(seed) if seed is not None else None
    tie = rng.permutation(n) if rng is not None else np.arange(n)
    order = length_order(np.asarray(src_lens), np.asarray(tgt_lens), tie)
    batches, start, max_s, max_t = [], 0, 0, 0
    for pos, idx in enumerate(order):
        s, t = max(max_s, src_lens[idx]), max(max_t, tgt_lens[idx])
        if pos > start and (pos - start + 1) * (s + t) > max_tokens:
            batches.append(order[start:pos])
            start, s, t = pos, src_lens[idx], tgt_lens[idx]
        max_s, max_t = s, t
    if start < n:
        batches.append(order[start:])
    if rng is not None:
        rng.shuffle(batches)
    return batches


def round_up(width, multiple: int):
    """`width` (an int or an array) rounded up to a multiple of `multiple` (0: as it is): the
    widths of bucketed batches."""
    return -(-width // multiple) * multiple if multiple else width


def bucket_batches(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, multiple: int, seed: int | None
) -> list[np.ndarray]:
    """Batches in a few fixed shapes, for a compiled or CUDA-graphed training step (a GPU
    meets a new shape almost every batch with token_batches: Multi30k's 121 batches had 98).

    Each side's length is rounded up to a multiple of `multiple`; the sentences of one
    (source, target) width pair form batches of the same row count, as many as `max_tokens`
    allows (at least one), the last one filled up with empty rows (index -1, which collate
    makes a row that the loss ignores). So an epoch has one shape per width pair in use.
    With a seed the sentences of a width pair and the batch order are shuffled, reproducibly."""
    n = len(src_lens)
    rng = np.random.default_rng(seed) if seed is not None else None
    s_w, t_w = round_up(np.asarray(src_lens), multiple), round_up(np.asarray(tgt_lens), multiple)
    tie = rng.permutation(n) if rng is not None else np.arange(n)
    order = np.lexsort((tie, t_w, s_w))  # by width pair, randomly within one
    batches: list[np.ndarray] = []
    bounds = np.flatnonzero(np.diff(s_w[order]) | np.diff(t_w[order])) + 1
    for group in np.split(order, bounds):
        if not len(group):
            continue
        rows = max(1, max_tokens // int(s_w[group[0]] + t_w[group[0]]))
        filled = np.full(-(-len(group) // rows) * rows, -1, dtype=np.int64)
        filled[: len(group)] = group
        batches.extend(filled.reshape(-1, rows))
    if rng is not None:
        rng.shuffle(batches)
    return batches


def batch_shapes(
    src_lens: np.ndarray, tgt_lens: np.ndarray, batches: list[np.ndarray], multiple: int = 0
) -> set[tuple[int, int, int]]:
    """The (rows, source width, target width) of each batch's tensors, as collate makes them."""
    out = set()
    for b in batches:
        real = b[b >= 0]
        s, t = int(src_lens[real].max()) + 1, int(tgt_lens[real].max()) + 1
        out.add((len(b), round_up(s, multiple), round_up(t, multiple)))
    return out


def length_order(src_lens: np.ndarray, tgt_lens: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """Sentence indices in an order whose runs have similar source AND target lengths.

    Sorting by source length, then target length, leaves the target side ragged wherever a
    batch spans two source lengths: it takes the longest targets of one and the shortest of
    the next (Multi30k, 8,192-token batches: 13.8% of target positions were padding). Here
    the primary key is the longer side, m = max(s, t): each shell of equal m is a corner of
    the length plane, walked along s - t, in alternating directions from shell to shell (a
    snake), so that a batch crossing from one shell into the next joins neighbouring points.
    (Measured padding: docs/performance.md.) `tie` orders equal lengths."""
    longer = np.maximum(src_lens, tgt_lens)
    skew = src_lens.astype(np.int64) - tgt_lens
    return np.lexsort((tie, np.where(longer % 2 == 0, skew, -skew), longer))


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) source ids + EOS, right-padded
    tgt_in: torch.Tensor  # (B, T) BOS + target
    tgt_out: torch.Tensor  # (B, T) target + EOS
    n_tokens: int  # target tokens that count in the loss (EOS included)
    packing: Packing | None = None  # several pairs per row (mt/data/packing.py)

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(
            self.src.to(device, non_blocking=nb),
            self.tgt_in.to(device, non_blocking=nb),
            self.tgt_out.to(device, non_blocking=nb),
            self.n_tokens,
            None if self.packing is None else self.packing.to(device),
        )

    @property
    def src_pad_mask(self) -> torch.Tensor:
        return self.src == PAD

    def tensors(self) -> list[torch.Tensor]:
        """The batch's tensors, its packing's included, in one order (of_tensors')."""
        packing = [] if self.packing is None else list(vars(self.packing).values())
        return [self.src, self.tgt_in, self.tgt_out, *packing]

    @staticmethod
    def of_tensors(tensors: list[torch.Tensor], n_tokens: int) -> Batch:
        """The Batch whose tensors() are `tensors`."""
        src, tgt_in, tgt_out, *packing = tensors
        return Batch(src, tgt_in, tgt_out, n_tokens, Packing(*packing) if packing else None)


def pad_sources(seqs: list[np.ndarray], width: int = 0) -> torch.Tensor:
    """(B, S) int64 tensor: each sequence + EOS, right-padded with PAD to the longest (or to
    `width`, when larger)."""
    out = np.full((len(seqs), max(width, max(len(s) for s in seqs) + 1)), PAD, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
        out[i, len(s)] = EOS
    return torch.from_numpy(out)


def _rows(arr: TokenArray, indices: np.ndarray, width: int, shift: int) -> np.ndarray:
    """(B, width) int64, PAD everywhere but row b's tokens (sentence indices[b]; none for -1)
    at columns shift .. shift + length - 1: one gather over the flat array, no Python loop."""
    real = indices >= 0
    rows = np.where(real, indices, 0)
    lengths = np.where(real, arr.lengths[rows], 0)
    cols = np.arange(width - shift)
    inside = cols[None, :] < lengths[:, None]  # (B, width - shift)
    out = np.full((len(indices), width), PAD, dtype=np.int64)
    flat = arr.offsets[rows][:, None] + cols[None, :]
    out[:, shift:][inside] = arr.data[flat[inside]]
    return out


def collate(data: ParallelData, indices: np.ndarray, pin: bool = False, multiple: int = 0) -> Batch:
    """The batch of sentences `indices`; multiple > 0 rounds both widths up to a multiple of
    it, and an index of -1 is an empty row (source: EOS alone; target: BOS, then nothing the
    loss counts), which bucket_batches uses to fill a batch to its fixed row count. Built by
    gathers over the token arrays, not per sentence."""
    indices = np.asarray(indices, dtype=np.int64)
    real = indices >= 0
    rows = np.where(real, indices, 0)
    s_len = np.where(real, data.src.lengths[rows], 0)
    t_len = np.where(real, data.tgt.lengths[rows], -1)  # -1: no EOS for an empty row
    s_width = round_up(int(s_len.max()) + 1, multiple)
    t_width = round_up(int(t_len.max()) + 1, multiple)
    b = np.arange(len(indices))
    src = _rows(data.src, indices, s_width, 0)
    src[b, s_len] = EOS
    tgt_out = _rows(data.tgt, indices, t_width, 0)
    tgt_out[b[real], t_len[real]] = EOS
    tgt_in = _rows(data.tgt, indices, t_width, 1)
    tgt_in[:, 0] = BOS
    tensors = [torch.from_numpy(x) for x in (src, tgt_in, tgt_out)]
    if pin:
        tensors = [t.pin_memory() for t in tensors]
    src_t, tgt_in_t, tgt_out_t = tensors
    return Batch(src_t, tgt_in_t, tgt_out_t, int((t_len[real] + 1).sum()))


def drop_source_words(batch: Batch, p: float, seed: list[int]) -> None:
    """Word dropout, in place: each source token but EOS and padding becomes UNK with
    probability p. The draw depends on `seed` alone (the batch's epoch seed and position),
    so every rank and a resumed run put the same noise on the same batch."""
    hit = torch.from_numpy(np.random.default_rng(seed).random(tuple(batch.src.shape)) < p)
    batch.src[hit & (batch.src != PAD) & (batch.src != EOS)] = UNK


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch's random draws (its shuffle, its BPE-dropout segmentation): a
    function of (train.seed, epoch) alone, so every rank and a resumed run draw the same."""
    return seed * 100_003 + epoch


def epoch_batches(
    data: ParallelData | tuple[np.ndarray, np.ndarray],
    max_tokens: int,
    seed: int,
    epoch: int,
    buckets: int = 0,
) -> list[np.ndarray]:
    """One epoch's batches of `data` (or of examples of these source and target lengths):
    token_batches, or with buckets > 0 bucket_batches of that width multiple."""
    src_lens, tgt_lens = (
        (data.src.lengths, data.tgt.lengths) if isinstance(data, ParallelData) else data
    )
    # +1 on each side for EOS / BOS, the lengths the tensors will actually have.
    lens = (src_lens + 1, tgt_lens + 1)
    if buckets:
        return bucket_batches(*lens, max_tokens, buckets, seed=epoch_seed(seed, epoch))
    return token_batches(*lens, max_tokens, seed=epoch_seed(seed, epoch))


def padding_fraction(arr: TokenArray, batches: list[np.ndarray], multiple: int = 0) -> float:
    """The share of padding among the positions of one side's batch tensors (each sentence
    takes its length + 1: EOS on the source and target-out side, BOS on target-in; with
    multiple > 0 the widths are rounded up to it, and empty rows are all padding)."""
    real = sum(int(arr.lengths[b[b >= 0]].sum()) + int((b >= 0).sum()) for b in batches)
    padded = 0
    for b in batches:
        width = int(arr.lengths[b[b >= 0]].max()) + 1
        padded += len(b) * round_up(width, multiple)
    return 1.0 - real / max(padded, 1)


def describe_batches(
    data: ParallelData, batches: list[np.ndarray], max_tokens: int, multiple: int = 0
) -> str:
    """One line on an epoch's batches: how many, in how many shapes, and how much of them is
    padding."""
    shapes = batch_shapes(data.src.lengths, data.tgt.lengths, batches, multiple)
    src_pad, tgt_pad = (padding_fraction(side, batches, multiple) for side in (data.src, data.tgt))
    return (
        f"batches: {len(batches)} per epoch of at most {max_tokens} tokens, in {len(shapes)} "
        f"shape{'s' * (len(shapes) != 1)}; padding {src_pad:.1%} of source, {tgt_pad:.1%} of "
        f"target positions"
    )


def collate_packed(
    data: ParallelData, block: np.ndarray, width: int, rows: int, pin: bool = False
) -> Batch:
    """The Batch of a packed block (train.pack_width; mt/data/packing.py)."""
    return Batch(*pack_tensors(data, block, width, rows, pin))
