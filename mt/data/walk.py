"""The order training reads the corpus in: a new shuffle every epoch, each rank its share, and
a position (epoch, batch in epoch) kept in the TrainState, so that a resumed run continues on
the very batch it stopped at. The trainer asks for batches; what they hold is decided here."""

from __future__ import annotations

import collections
import concurrent.futures
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import numpy as np
import torch

from mt.data.batching import (
    Batch,
    collate,
    collate_packed,
    describe_batches,
    drop_source_words,
    epoch_batches,
    epoch_seed,
)
from mt.data.corpus import ParallelData, both_directions
from mt.data.packing import describe_packing, pack_blocks
from mt.data.pairs import epoch_members

T = TypeVar("T")
Item = TypeVar("Item")


def training_batches(
    state,
    cfg,
    data_for_epoch: Callable[[int], ParallelData],
    device: torch.device,
    *,
    rank: int = 0,
    world: int = 1,
    progress: Callable[[], float] = lambda: 0.0,
    say: Callable[[str], None] = print,
    prepare: Callable[[Batch, list[int]], Batch] | None = None,
    resident: bool = False,
    pair_temperature: float = 1.0,
) -> Iterator[Batch]:
    """Batches from (state.epoch, state.batch_in_epoch) on, advancing them as it goes.

    state: the TrainState (epoch, batch_in_epoch, both_directions; step for messages);
    cfg: the train config (max_tokens, seed, word_dropout, bidirectional_share);
    data_for_epoch(epoch): the epoch's token ids (they change every epoch with BPE-dropout);
    progress(): the share of the budget spent, read when an epoch begins (BiT);
    prepare(batch, seed): the objective's own batch made from each one (masked-LM masking),
    seeded by the batch's epoch and position alone; resident: the batches made ahead
    RESIDENT_BATCHES at a time and moved to the device together, each a slice of them
    (resident_batches; for a reader that copies each batch into its own buffers);
    pair_temperature: with several language pairs, how each epoch draws them (data.pairs).
    With N ranks every rank walks the same global order and takes every N-th batch, so the
    position, and resuming, do not depend on the number of ranks."""
    pin = device.type == "cuda"
    described = False
    while True:
        data = data_for_epoch(state.epoch)
        if state.batch_in_epoch == 0:
            choose_directions(state, cfg.bidirectional_share, progress(), say)
        if state.both_directions:
            data = both_directions(data)
        order = epoch_order(data, cfg, state.epoch, pair_temperature)
        if not described:  # the first epoch this run walks: its shapes and padding
            say(describe_order(data, order, cfg))
            described = True
        usable = len(order) - len(order) % world  # every rank gets as many batches
        positions = range(state.batch_in_epoch + rank, usable, world)
        make = functools.partial(_make_batch, data, order, cfg, state.epoch, pin, prepare)
        for position, batch in _made(make, positions, device, resident, cfg.prefetch_batches):
            state.batch_in_epoch = position - rank + world  # counted once it is handed out
            yield batch
        state.epoch += 1
        state.batch_in_epoch = 0


def _made(make, positions: range, device: torch.device, resident: bool, depth: int):
    """(position, batch on the device) for every position: made `depth` ahead and moved one
    by one, or made and moved in groups (resident_batches)."""
    if resident:
        return resident_batches(make, positions, device)
    return ((p, b.to(device)) for p, b in ahead(make, positions, depth))


def _make_batch(
    data: ParallelData,
    order: list[np.ndarray],
    cfg,
    epoch: int,
    pin: bool,
    prepare: Callable[[Batch, list[int]], Batch] | None,
    position: int,
) -> Batch:
    """The batch at `position` of the epoch, on the CPU: a function of the position alone
    (every draw is seeded by the epoch and the position), so it can be made ahead."""
    batch = collate_one(data, order[position], cfg, pin)
    seed = epoch_seed(cfg.seed, epoch)
    if cfg.word_dropout > 0:  # on the CPU batch, before it moves (pinned stays pinned)
        drop_source_words(batch, cfg.word_dropout, [seed, position])
    if prepare is not None:  # another stream than word dropout's: a third word
        batch = prepare(batch, [seed, position, 1])
    return batch


# batches made ahead and moved to the device together by resident_batches (Multi30k's packed
# blocks: 1.8 MB each)
RESIDENT_BATCHES = 64


def resident_batches(
    make: Callable[[int], Batch], positions: range, device: torch.device
) -> Iterator[tuple[int, Batch]]:
    """(position, batch) for every position, the batches made RESIDENT_BATCHES at a time by the
    background thread (`ahead`), stacked, and moved to the device in one copy per tensor, each
    handed out as a slice of them: an update then takes a view, with no copy from the host and
    no allocation of its own. The batches of a group must have one shape (packed blocks)."""
    groups = [
        positions[i : i + RESIDENT_BATCHES] for i in range(0, len(positions), RESIDENT_BATCHES)
    ]

    def make_group(group: range) -> tuple[list[torch.Tensor], list[int]]:
        batches = [make(p) for p in group]
        stacked = [torch.stack(ts) for ts in zip(*(b.tensors() for b in batches), strict=True)]
        if device.type == "cuda":
            stacked = [t.pin_memory() for t in stacked]
        return stacked, [b.n_tokens for b in batches]

    for group, (stacked, tokens) in ahead(make_group, groups, 1):
        on = [t.to(device, non_blocking=True) for t in stacked]
        for i, position in enumerate(group):
            yield position, Batch.of_tensors([t[i] for t in on], tokens[i])


def ahead(make: Callable[[Item], T], items: Iterable[Item], depth: int) -> Iterator[tuple[Item, T]]:
    """(item, make(item)) for every item in order, with up to `depth` of them made ahead by
    one background thread (0: made here, when asked for). Which batch comes when depends on
    the order of `items` alone, never on the thread's timing; the thread stops when the
    caller stops asking (the generator closed) or when `items` end."""
    if depth <= 0:
        for item in items:
            yield item, make(item)
        return
    pending: collections.deque = collections.deque()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mt-batches") as pool:
        try:
            for item in items:
                pending.append((item, pool.submit(make, item)))
                if len(pending) > depth:
                    first, made = pending.popleft()
                    yield first, made.result()
            while pending:
                first, made = pending.popleft()
                yield first, made.result()
        finally:  # (stopped early: the batches made ahead are dropped)
            for _, made in pending:
                made.cancel()


def epoch_order(
    data: ParallelData, cfg, epoch: int, pair_temperature: float = 1.0
) -> list[np.ndarray]:
    """An epoch's batches, as arrays of example indices: packed blocks of several examples
    per row (train.pack_width; mt/data/packing.py; -1 ends a row), else batches of similar
    lengths. With several language pairs drawn by a temperature other than 1, over the
    examples the epoch draws (mt.data.pairs.epoch_members)."""
    members = None
    if data.pair_of is not None:
        seed = epoch_seed(cfg.seed, epoch)
        members = epoch_members(data.pair_of, pair_temperature, seed, data.weights)
    src_lens, tgt_lens = data.src.lengths, data.tgt.lengths
    if members is not None:
        src_lens, tgt_lens = src_lens[members], tgt_lens[members]
    if cfg.pack_width:
        seed = epoch_seed(cfg.seed, epoch)
        order = pack_blocks(src_lens, tgt_lens, cfg.pack_width, _rows(cfg), seed)
    else:
        order = epoch_batches(
            (src_lens, tgt_lens), cfg.max_tokens, cfg.seed, epoch, cfg.shape_buckets
        )
    if members is None:
        return order
    return [np.where(b >= 0, members[np.maximum(b, 0)], b) for b in order]


def describe_order(data: ParallelData, order: list[np.ndarray], cfg) -> str:
    if cfg.pack_width:
        return describe_packing(data, order, cfg.pack_width, _rows(cfg))
    return describe_batches(data, order, cfg.max_tokens, cfg.shape_buckets)


def collate_one(data: ParallelData, indices: np.ndarray, cfg, pin: bool) -> Batch:
    if cfg.pack_width:
        return collate_packed(data, indices, cfg.pack_width, _rows(cfg), pin=pin)
    return collate(data, indices, pin=pin, multiple=cfg.shape_buckets)


def _rows(cfg) -> int:
    """The rows of a packed block: train.max_tokens source and target positions in all."""
    return cfg.max_tokens // (2 * cfg.pack_width)


def choose_directions(state, share: float, progress: float, say: Callable[[str], None]) -> None:
    """At an epoch's start: both directions while the budget spent is under `share`
    (train.bidirectional_share, BiT: Ding et al., 2021), the configured one after. The
    choice is kept in the state, so a run resumed inside the epoch walks the same batches."""
    was = state.both_directions
    state.both_directions = progress < share
    if state.both_directions and not was:
        say(
            f"epoch {state.epoch}: training on both directions until {share:.0%} of the "
            f"budget (train.bidirectional_share)"
        )
    elif was and not state.both_directions:
        say(
            f"step {state.step}: {progress:.0%} of the budget spent; from epoch "
            f"{state.epoch} on, the configured direction only"
        )
