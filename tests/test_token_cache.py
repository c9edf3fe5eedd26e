"""The memory-mapped token cache (mt/data/token_cache.py): the same ids as encoding the
corpus, memory-mapped; a new key for a changed file, BPE model or max_len; a second run reads it
and trains exactly as the first; never written into the corpus folder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mt.data import token_cache
from mt.data.corpus import ParallelData, Stats, TokenArray
from tests.conftest import train_tiny


def _data(seqs_src, seqs_tgt) -> ParallelData:
    return ParallelData(TokenArray(seqs_src, np.uint16), TokenArray(seqs_tgt, np.uint16),
                        Stats(total=5, empty=1, too_long=1))  # fmt: skip


def test_saved_ids_come_back_memory_mapped_and_equal(tmp_path):
    data = _data([[5, 6, 7], [8], [9, 10]], [[11], [12, 13, 14, 15], [16, 17]])
    folder = tmp_path / "k"
    token_cache.save(folder, data)
    back = token_cache.load(folder)
    for a, b in ((data.src, back.src), (data.tgt, back.tgt)):
        assert isinstance(b.data, np.memmap) and isinstance(b.offsets, np.memmap)
        assert [list(b[i]) for i in range(len(b))] == [list(a[i]) for i in range(len(a))]
        assert b.data.dtype == np.uint16
    assert (back.stats.total, back.stats.empty, back.stats.too_long) == (5, 1, 1)
    assert not back.src.data.flags.writeable  # read-only: nothing can change the shared ids
    token_cache.save(folder, _data([[1]], [[2]]))  # a second writer of the key keeps the first
    assert len(token_cache.load(folder).src) == 3
    assert token_cache.load(tmp_path / "absent") is None
    assert [p.name for p in tmp_path.iterdir()] == ["k"]  # no temporary folder left


def test_the_key_follows_the_files_the_bpe_model_and_max_len(tmp_path):
    a, b = tmp_path / "train.de", tmp_path / "train.en"
    a.write_text("ein hund\n" * 1000)
    b.write_text("a dog\n" * 1000)
    key = token_cache.cache_key([a, b], [b"spm"], 128)
    assert token_cache.cache_key([a, b], [b"spm"], 128) == key
    assert token_cache.cache_key([a, b], [b"other"], 128) != key
    assert token_cache.cache_key([a, b], [b"spm"], 64) != key
    b.write_text("a cat\n" * 1000)  # same size, other content
    assert token_cache.cache_key([a, b], [b"spm"], 128) != key


def test_the_cache_folder_is_mts_never_the_corpus_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("MT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert token_cache.cache_root() == tmp_path / "xdg" / "mt"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert token_cache.cache_root() == tmp_path / "home" / ".cache" / "mt"
    monkeypatch.setenv("MT_CACHE_DIR", str(tmp_path / "mine"))
    assert token_cache.folder_for("abc") == tmp_path / "mine" / "tokens" / "abc"


def test_a_second_run_reads_the_cache_and_trains_exactly_as_the_first(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MT_CACHE_DIR", str(cache))
    data = tmp_path / "data"
    sets = ("train.max_steps=12", "train.log_every=1", "train.valid_every=12",
            "train.save_every=12")  # fmt: skip
    _plain_log, plain = train_tiny(tmp_path / "plain", data, *sets, "data.token_cache=false")
    assert not cache.exists()  # false: no cache
    first_log, first = train_tiny(tmp_path / "first", data, *sets, "data.token_cache=true")
    assert "writing the training split's token ids" in first_log
    (folder,) = (cache / "tokens").iterdir()
    assert not any(p.name.startswith(".") for p in (cache / "tokens").iterdir())
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    # the run directory's BPE model is the first run's: the same key
    second_log, second = train_tiny(tmp_path / "first", data, "train.max_steps=24",
                                    *sets[1:], "data.token_cache=true")  # fmt: skip
    assert "memory-mapped from the cache" in second_log and "writing" not in second_log
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert first == plain  # the cached ids train exactly as the encoded ones
    assert [s for s, _ in second] == list(range(1, 25)) and second[:12] == first  # resumed
    assert not list(data.rglob("*.npy")) and not (data / "tokens").exists()  # not in the corpus


@pytest.mark.parametrize("setting, used", [("auto", False), (True, True), (False, False)])
def test_auto_caches_large_corpora_only(tmp_path, setting, used):
    small = tmp_path / "train.de"
    small.write_text("x\n")
    assert token_cache.wanted(setting, [small]) is used
    big = tmp_path / "big.de"
    with open(big, "wb") as f:
        f.truncate(token_cache.AUTO_BYTES)
    assert token_cache.wanted("auto", [big])


def test_a_cache_that_cannot_be_written_is_a_warning_and_training_goes_on(tmp_path, monkeypatch):
    """The token cache on a full disk: one warning line, the run trains on the ids in memory
    exactly as without a cache."""
    import errno

    from tests.conftest import mt_here

    monkeypatch.setenv("MT_CACHE_DIR", str(tmp_path / "cache"))

    def full(path, arr, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full)
    sets = ["--set", f"data.dir={tmp_path / 'd'}", "train.max_steps=4", "train.valid_every=4",
            "train.log_every=1", "data.token_cache=true"]  # fmt: skip
    code, _, err = mt_here("train", "tiny", "--run-dir", tmp_path / "run", *sets)
    assert code == 0, err
    warning = [line for line in err.splitlines() if "could not write the token cache" in line]
    assert len(warning) == 1 and "No space left on device" in warning[0]
    assert not list((tmp_path / "cache").rglob("*.npy"))


def test_several_cached_corpora_stay_mapped_and_batch_as_one_copy_would(tmp_path):
    """Several pairs' cached ids (or a pair in both directions) joined stay memory-mapped, not
    read into memory, and every batch, padded or packed, holds the ids a copy of them would."""
    from mt.data.batching import collate, collate_packed
    from mt.data.corpus import FlatParts, both_directions, concat_pairs
    from mt.data.packing import pack_blocks

    rng = np.random.default_rng(0)

    def corpus(n: int) -> ParallelData:
        def seqs() -> list[list[int]]:
            return [list(rng.integers(4, 900, rng.integers(1, 9))) for _ in range(n)]

        return _data(seqs(), seqs())

    parts = []
    for k, n in enumerate((7, 1, 12)):
        token_cache.save(tmp_path / str(k), corpus(n))
        parts.append(token_cache.load(tmp_path / str(k)))
    joined = both_directions(concat_pairs(parts))
    copied = ParallelData(*(TokenArray.from_arrays(np.array(a.data), a.lengths, a.offsets)
                            for a in (joined.src, joined.tgt)), joined.stats)  # fmt: skip
    assert isinstance(joined.src.data, FlatParts) and len(joined.src.data.parts) == 6
    assert all(isinstance(p, np.memmap) for p in joined.src.data.parts)
    assert np.array_equal(
        copied.src.data,
        np.concatenate(
            [np.asarray(p.src.data) for p in parts] + [np.asarray(p.tgt.data) for p in parts]
        ),
    )
    for i in range(len(joined.src)):
        assert np.array_equal(joined.tgt[i], copied.tgt[i])
    for indices in (np.arange(40), rng.permutation(40)[:9], np.array([3, -1, 39, 19, 20])):
        a, b = collate(joined, indices), collate(copied, indices)
        assert all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("src", "tgt_in", "tgt_out"))
    for block in pack_blocks(joined.src.lengths, joined.tgt.lengths, 24, 3, seed=1):
        a, b = collate_packed(joined, block, 24, 3), collate_packed(copied, block, 24, 3)
        assert all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("src", "tgt_in", "tgt_out"))
    with pytest.raises(IndexError):
        joined.src.data[np.array([len(joined.src.data)])]


def test_a_corpus_of_data_corpora_is_cached_and_read_back_as_encoded(tmp_path, monkeypatch):
    """data.corpora's corpora go into the token cache beside the main split, each under its
    own key: a second run memory-maps both, and its ids equal those encoded in memory, the
    tagged corpus's sources led by <BT>."""
    import shutil

    from mt.data.download import download
    from tests.conftest import trainer_for

    cache = tmp_path / "cache"
    monkeypatch.setenv("MT_CACHE_DIR", str(cache))
    data = tmp_path / "d"
    download("synthetic", data)
    for side in ("src", "tgt"):
        lines = (data / f"train.{side}").read_text().splitlines()[:300]
        (data / f"train.bt.{side}").write_text("\n".join(lines) + "\n")
    corpora = "data.corpora=[{name: bt, weight: 2, tagged: true}]"
    runs = {}
    for name, cached in (("memory", "false"), ("first", "true"), ("second", "true")):
        if name != "memory":  # (the same BPE model: the same ids)
            (tmp_path / name / "run").mkdir(parents=True)
            shutil.copy(tmp_path / "memory/run/spm.model", tmp_path / name / "run/spm.model")
        t = trainer_for(tmp_path / name, f"data.dir={data}", f"data.token_cache={cached}", corpora)
        runs[name] = t.train_data, t.tokenizer.never_written()
        t.lock.release()
    (memory, bt), (second, _) = runs["memory"], runs["second"]
    assert len(list((cache / "tokens").iterdir())) == 2  # the main split and the corpus
    assert [type(p) for p in second.src.data.parts] == [np.memmap, np.memmap]
    assert second.weights == memory.weights == (1.0, 2.0)
    assert np.array_equal(second.pair_of, memory.pair_of)
    for i in range(len(memory.src)):
        assert np.array_equal(second.src[i], memory.src[i])
        assert np.array_equal(second.tgt[i], memory.tgt[i])
    assert all(second.src[i][0] == bt for i in np.flatnonzero(second.pair_of == 1))
    # the same files untagged, with the same BPE model: a key of their own, no <BT>
    (tmp_path / "untagged/run").mkdir(parents=True)
    shutil.copy(tmp_path / "memory/run/spm.model", tmp_path / "untagged/run/spm.model")
    plain = "data.corpora=[{name: bt, weight: 2}]"
    t = trainer_for(tmp_path / "untagged", f"data.dir={data}", "data.token_cache=true", plain)
    untagged = t.train_data
    t.lock.release()
    assert len(list((cache / "tokens").iterdir())) == 3
    assert not any(bt in untagged.src[i] for i in range(len(untagged.src)))
