"""The walk through the training data (mt/data/walk.py) as a run takes it: BPE-dropout's new
segmentation each epoch, the bidirectional stage, word dropout, and the batches made ahead in
a background thread, each the same on every rank and after a resume."""

import time

import torch

from mt.artifacts import checkpoint
from mt.config import load_config
from mt.train.build import build_trainer
from tests.conftest import ROOT, trainer_for


def test_with_bpe_dropout_the_start_up_log_counts_the_segmentation_epoch_0_trains_on(tmp_path):
    """With train.bpe_dropout the plain segmentation is never encoded: the counts logged at
    start-up (pairs kept, pairs longer than data.max_len) are those of epoch 0's dropout
    segmentation, the data the first epoch walks."""
    first = trainer_for(tmp_path)  # the same run directory: the same BPE model
    plain = first.train_data
    first.close()
    fits = int(max(plain.src.lengths.max(), plain.tgt.lengths.max())) + 1
    assert plain.stats.too_long == 0  # every plain pair fits data.max_len=fits
    logged = []
    cfg = load_config(
        ROOT / "configs/tiny.yaml",
        [f"data.dir={tmp_path / 'd'}", "train.bpe_dropout=0.1", f"data.max_len={fits}"],
    )
    t = build_trainer(cfg, tmp_path / "run", log=lambda *a, **_: logged.extend(map(str, a)))
    epoch0 = t.epoch_data(0)
    t.close()
    assert epoch0.stats.too_long > 0  # dropout's longer segmentations do not fit
    assert epoch0.stats.describe("train") in logged


def test_bpe_dropout_segments_each_epoch_anew_and_the_same_on_every_rank_and_resume(tmp_path):
    """train.bpe_dropout (Provilkov et al. 2020): each epoch trains on a new segmentation of
    the same text (it decodes to the same sentences, in more pieces than the deterministic
    segmentation); an epoch's segmentation depends on (seed, epoch) alone, so another rank or
    a resumed run gets the same batches at the same (epoch, position)."""
    first = trainer_for(tmp_path)  # the same run directory: the same BPE model
    plain = first.train_data
    first.close()
    t = trainer_for(tmp_path, "train.bpe_dropout=0.1", "train.max_tokens=256")
    assert t.train_data is None  # no second copy of the split in the plain segmentation

    def seqs(arr):
        return [arr[i].tolist() for i in range(len(arr))]

    e0, e1 = t.epoch_data(0), t.epoch_data(1)  # e0: prepare_data's encoding; then re-encoded
    assert seqs(t.epoch_data(0).src) == seqs(e0.src) and seqs(t.epoch_data(0).tgt) == seqs(e0.tgt)
    assert seqs(e0.tgt) != seqs(e1.tgt) and seqs(e0.src) != seqs(plain.src)
    assert t.tokenizer.decode_tgt(seqs(e0.tgt)) == t.tokenizer.decode_tgt(seqs(plain.tgt))
    assert t.tokenizer.src.Decode(seqs(e1.src)) == t.tokenizer.src.Decode(seqs(plain.src))
    assert e0.tgt.lengths.sum() > plain.tgt.lengths.sum()

    asked, epoch_data = [], t.epoch_data
    t.epoch_data = lambda epoch: asked.append(epoch) or epoch_data(epoch)
    batches = t.batches()
    while (t.state.epoch, t.state.batch_in_epoch) != (1, 2):
        next(batches)
    first = [next(batches) for _ in range(3)]
    assert asked == [0, 1]  # the trainer walks each epoch's own data
    t.close()
    again = trainer_for(tmp_path, "train.bpe_dropout=0.1", "train.max_tokens=256")
    again.state.epoch, again.state.batch_in_epoch = 1, 2  # where a resume would start
    second = [b for b, _ in zip(again.batches(), range(3), strict=False)]
    again.close()
    assert all(
        torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
        for a, b in zip(first, second, strict=True)
    )


def _pairs(data) -> set[tuple[tuple[int, ...], tuple[int, ...]]]:
    """A ParallelData's (source, target) pairs as token ids."""
    return {
        (tuple(map(int, data.src[i])), tuple(map(int, data.tgt[i]))) for i in range(len(data.src))
    }


def _rows(batch) -> set[tuple[tuple[int, ...], tuple[int, ...]]]:
    """A batch's (source, target) pairs as token ids, without padding, EOS and BOS."""
    from mt.tokens import EOS, PAD

    def ids(row):
        return tuple(int(x) for x in row if x not in (PAD, EOS))

    return {(ids(s), ids(t)) for s, t in zip(batch.src, batch.tgt_out, strict=True)}


def test_bidirectional_share_trains_both_directions_early_then_one(tmp_path):
    """train.bidirectional_share (BiT, Ding et al. 2021): an epoch that begins while less than
    the share of the budget is spent trains on every pair in both directions (target ->
    source too); an epoch that begins later, on the configured direction alone. An epoch
    keeps the choice it began with, also in a run resumed inside it."""
    from mt.data.corpus import both_directions

    t = trainer_for(tmp_path, "train.bidirectional_share=0.5", "train.max_tokens=256")
    data = t.train_data
    forward = _pairs(data)
    backward = {(b, a) for a, b in forward}
    assert backward != forward
    both = both_directions(data)
    assert len(both.src) == 2 * len(data.src)
    assert _pairs(both) == forward | backward

    per_epoch, kept = {}, []  # epoch -> its pairs; epoch 1's batches from position 2
    batches = t.batches()
    while t.state.epoch < 3:
        batch = next(batches)  # (its epoch is state.epoch once it is handed out)
        per_epoch.setdefault(t.state.epoch, set()).update(_rows(batch))
        if (t.state.epoch, t.state.batch_in_epoch) == (1, 2):
            t.budget.progress = 0.6  # past the share inside epoch 1
        elif t.state.epoch == 1 and t.state.batch_in_epoch > 2 and len(kept) < 3:
            kept.append(batch)
    t.close()
    assert per_epoch[0] == per_epoch[1] == forward | backward
    assert per_epoch[2] <= forward and len(kept) == 3

    again = trainer_for(tmp_path, "train.bidirectional_share=0.5", "train.max_tokens=256")
    again.state.epoch, again.state.batch_in_epoch = 1, 2  # where a resume would start
    again.state.both_directions, again.budget.progress = True, 0.6  # as last.pt holds them
    resumed = [b for b, _ in zip(again.batches(), range(3), strict=False)]
    again.close()
    assert all(
        torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
        for a, b in zip(kept, resumed, strict=True)
    )


def test_bidirectional_stage_ends_by_the_budget_the_run_spends(tmp_path, capsys):
    """In a real run the share is of the budget actually spent (train.max_steps here): the
    stage ends at the first epoch that begins past it, the run says so, and last.pt records
    which way the epoch it stopped in trains."""
    from mt.data.batching import epoch_batches
    from mt.data.corpus import both_directions

    t = trainer_for(
        tmp_path,
        "train.bidirectional_share=0.3",
        "train.max_tokens=2000",
        "train.max_steps=100",
        "train.valid_every=1000",
        "train.save_every=100",
    )
    first_epoch = len(epoch_batches(both_directions(t.train_data), 2000, t.cfg.seed, 0))
    assert 30 < first_epoch < 100  # epoch 0 ends past 30% of the budget
    t.fit()
    t.close()
    err = capsys.readouterr().err
    assert "epoch 0: training on both directions until 30% of the budget" in err
    ended = [line for line in err.splitlines() if "the configured direction only" in line]
    assert len(ended) == 1 and ended[0].startswith(f"step {first_epoch}: ")
    assert checkpoint.load(tmp_path / "run/last.pt")["train_state"]["both_directions"] is False


def test_word_dropout_turns_source_pieces_into_unk_the_same_on_resume(tmp_path):
    """train.word_dropout (Sennrich et al. 2016): a training batch is the plain batch at the
    same (epoch, position) with about that share of its source pieces replaced by <unk>; EOS,
    padding and the target side are untouched; a resumed run puts the same noise on the same
    batch."""
    from mt.tokens import EOS, PAD, UNK

    def walk(trainer, n):
        return [b for b, _ in zip(trainer.batches(), range(n), strict=False)]

    plain = trainer_for(tmp_path, "train.max_tokens=256")
    clean = walk(plain, 40)
    plain.close()
    t = trainer_for(tmp_path, "train.word_dropout=0.25", "train.max_tokens=256")
    noisy = walk(t, 40)
    t.close()
    real = dropped = 0
    for a, b in zip(clean, noisy, strict=True):
        assert torch.equal(a.tgt_in, b.tgt_in) and torch.equal(a.tgt_out, b.tgt_out)
        changed = a.src != b.src
        assert bool((b.src[changed] == UNK).all())
        assert not bool((changed & ((a.src == PAD) | (a.src == EOS))).any())
        real += int(((a.src != PAD) & (a.src != EOS) & (a.src != UNK)).sum())
        dropped += int(changed.sum())
    assert real > 2000 and 0.22 < dropped / real < 0.28

    again = trainer_for(tmp_path, "train.word_dropout=0.25", "train.max_tokens=256")
    again.state.batch_in_epoch = 5  # where a resume inside epoch 0 would start
    resumed = walk(again, 3)
    assert again.state.epoch == 0  # (epoch 0 has more than 8 batches)
    again.close()
    assert all(torch.equal(a.src, b.src) for a, b in zip(noisy[5:8], resumed, strict=True))


def _walked(tmp_path, overrides, n: int, at=None) -> list:
    """[(batch, (epoch, batch_in_epoch) after it)] of the first n batches of configs/tiny.yaml's
    walk with `overrides`, from the position `at` (None: the start)."""
    t = trainer_for(tmp_path, *overrides)
    if at is not None:
        t.state.epoch, t.state.batch_in_epoch = at
    batches, out = t.batches(), []
    for _ in range(n):
        batch = next(batches)
        out.append((batch, (t.state.epoch, t.state.batch_in_epoch)))
    batches.close()
    t.close()
    return out


def test_batches_made_ahead_are_the_batches_made_when_asked_for(tmp_path):
    """train.prefetch_batches: a background thread collates ahead, yet every batch, with its
    word dropout, and the position the state holds after it (what last.pt saves) are those of
    the walk that collates each batch when it is asked for, across epochs; a walk resumed at
    a saved position continues with the same batches; the thread stops with the walk."""
    import threading

    def walk(*overrides, n=60, at=None):
        return _walked(tmp_path, ("train.max_tokens=4096", "train.word_dropout=0.2", *overrides),
                       n, at)  # fmt: skip

    here = walk("train.prefetch_batches=0")
    before = {th.name for th in threading.enumerate()}
    ahead = walk("train.prefetch_batches=3")
    assert here[-1][1][0] >= 2  # the walk crossed epochs
    for (a, pa), (b, pb) in zip(here, ahead, strict=True):
        assert pa == pb
        assert torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
    resumed = walk("train.prefetch_batches=3", n=10, at=here[29][1])
    assert [p for _, p in resumed] == [p for _, p in here[30:40]]
    pairs = zip(here[30:40], resumed, strict=True)
    assert all(torch.equal(a.src, b.src) for (a, _), (b, _) in pairs)
    assert not any(th.name.startswith("mt-batches") for th in threading.enumerate()) and before


def test_ahead_makes_batches_in_a_background_thread_at_most_depth_ahead():
    import threading

    from mt.data.walk import ahead

    made = []

    def make(i):
        made.append((i, threading.current_thread().name))
        return i * 10

    walk = ahead(make, range(8), depth=2)
    assert next(walk) == (0, 0)
    time.sleep(0.3)  # (time for the thread to run on, were it not held back)
    assert [i for i, _ in made] == [0, 1, 2]  # two ahead of the one handed out, no more
    assert all(name.startswith("mt-batches") for _, name in made)
    assert list(walk) == [(i, i * 10) for i in range(1, 8)]
    assert list(ahead(lambda i: -i, range(3), depth=0)) == [(0, 0), (1, -1), (2, -2)]


def test_resident_batches_are_the_batches_each_made_and_moved_alone(tmp_path, monkeypatch):
    """The graph update's walk (train.update graph: resident_batches, groups of 3 here) hands
    out slices of batches made and moved together: the same packed blocks, word dropout,
    token counts and positions as the walk that moves each batch alone, across epochs and
    groups, and from a saved position on."""
    from mt.data import walk as walk_mod

    monkeypatch.setattr(walk_mod, "RESIDENT_BATCHES", 3)

    def walk(kind, n=40, at=None):
        sets = (f"train.update={kind}", "train.pack_width=64", "train.max_tokens=4096",
                "train.word_dropout=0.2")  # fmt: skip
        return _walked(tmp_path, sets, n, at)

    alone, resident = walk("device", n=50), walk("graph", n=50)
    assert alone[-1][1][0] >= 2  # the walk crossed epochs
    assert all(b.src._base is not None for b, _ in resident)  # (slices of a group)
    for (a, pa), (b, pb) in zip(alone, resident, strict=True):
        assert pa == pb and a.n_tokens == b.n_tokens
        assert all(torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors(), strict=True))
    resumed = walk("graph", n=8, at=alone[16][1])
    assert [p for _, p in resumed] == [p for _, p in alone[17:25]]
    pairs = zip(alone[17:25], resumed, strict=True)
    assert all(torch.equal(a.src, b.src) for (a, _), (b, _) in pairs)
