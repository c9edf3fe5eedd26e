"""Parallel text on disk -> checked, cleaned line pairs -> compact token-id arrays."""

from __future__ import annotations

import codecs
import dataclasses
import gzip
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from mt.data import pairs as pairs_mod
from mt.errors import MTError
from mt.tokens import BT_TAG

SPLITS = ("train", "valid", "test")
# C0/C1 control characters except tab; they are invisible and confuse tokenizers and scorers.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def open_text(path: Path, mode: str = "rb"):
    return gzip.open(path, mode) if str(path).endswith(".gz") else open(path, mode)


def iter_lines(path: str | Path) -> Iterator[str]:
    """The lines of a UTF-8 (optionally .gz) file, without line endings, one at a time: the one
    reader of text for every command. A leading byte-order mark is dropped (it would be part
    of the first sentence, and shift its score); CRLF line endings and NUL bytes are said once
    per file (TextNotes). Decodes line by line so an encoding error names the line to fix."""
    path = Path(path)
    if path.is_dir():
        raise MTError(f"{path} is a folder: give a text file")
    if not path.is_file():
        raise MTError(f"{path}: file not found")
    notes = TextNotes(str(path))
    try:
        with open_text(path) as f:
            for i, raw in enumerate(f, 1):
                yield notes.decode(raw, i)
    except (OSError, EOFError) as e:
        raise MTError(f"{path}: cannot read ({e})") from None
    notes.say()


def decode_text(data: bytes, name: str) -> list[str]:
    """The lines of text that arrived whole (standard input), read as iter_lines reads files."""
    notes = TextNotes(name)
    lines = [notes.decode(raw, i) for i, raw in enumerate(data.splitlines(keepends=True), 1)]
    notes.say()
    return lines


class TextNotes:
    """What a reader of text noticed in one file, said once per file and process (a corpus is
    read several times: for BPE, for the ids, for each BPE-dropout epoch)."""

    said: ClassVar[set[tuple[str, str]]] = set()

    def __init__(self, name: str):
        self.name, self.crlf, self.nul_lines, self.first_nul = name, 0, 0, 0

    def decode(self, raw: bytes, i: int) -> str:
        if i == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        if raw.endswith(b"\r\n"):
            self.crlf += 1
        if b"\0" in raw:
            self.nul_lines += 1
            self.first_nul = self.first_nul or i
        try:
            return raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise MTError(
                f"{self.name}:{i}: invalid UTF-8 at byte {e.start} "
                f"(re-encode the file as UTF-8, e.g. with iconv)"
            ) from None

    def say(self) -> None:
        if self.crlf:
            self._once(
                "crlf",
                f"note: {self.name}: {self.crlf:,} line(s) end in CRLF (Windows); read without "
                f"the CR",
            )
        if self.nul_lines:
            self._once(
                "nul",
                f"warning: {self.name}: NUL bytes on {self.nul_lines:,} line(s) (first: line "
                f"{self.first_nul}); is it a text file? (in training they become spaces)",
            )

    def _once(self, kind: str, message: str) -> None:
        if (self.name, kind) not in TextNotes.said:
            TextNotes.said.add((self.name, kind))
            print(message, file=sys.stderr, flush=True)


def read_lines(path: str | Path) -> list[str]:
    return list(iter_lines(path))


def clean(line: str) -> str:
    return " ".join(_CONTROL.sub(" ", line).split())


def corpus_paths(
    data_dir: str | Path, name: str, src_lang: str, tgt_lang: str
) -> tuple[Path, Path]:
    """The files of a training corpus of data.corpora: train.NAME.{src} and train.NAME.{tgt}."""
    return Path(data_dir) / f"train.{name}.{src_lang}", Path(data_dir) / f"train.{name}.{tgt_lang}"


def split_paths(
    data_dir: str | Path, split: str, src_lang: str, tgt_lang: str
) -> tuple[Path, Path]:
    """A split's two files: the pair's own, `{split}.{src}-{tgt}.{lang}` (fairseq's naming: a
    folder of pairs from different corpora, as en-de and en-fr of different sizes), where
    either is there; else `{split}.{lang}` (one corpus parallel in every language, as
    Multi30k)."""
    own = pair_paths(data_dir, split, src_lang, tgt_lang)
    if any(p.exists() for p in own):
        return own
    d = Path(data_dir)
    return d / f"{split}.{src_lang}", d / f"{split}.{tgt_lang}"


def pair_paths(data_dir: str | Path, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """A pair's own files of a split, `{split}.{src}-{tgt}.{lang}`, there or not."""
    d, pair = Path(data_dir), f"{src_lang}-{tgt_lang}"
    return d / f"{split}.{pair}.{src_lang}", d / f"{split}.{pair}.{tgt_lang}"


def has_split(data_dir: str | Path, split: str, src_lang: str, tgt_lang: str) -> bool:
    return all(p.is_file() for p in split_paths(data_dir, split, src_lang, tgt_lang))


def iter_parallel(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """Line pairs, streamed; files of different lengths are an error naming both counts."""
    src_it, tgt_it = iter_lines(src_path), iter_lines(tgt_path)
    n = 0
    for s in src_it:
        t = next(tgt_it, None)
        if t is None:
            raise _mismatch(src_path, n + 1 + sum(1 for _ in src_it), tgt_path, n)
        n += 1
        yield s, t
    rest = sum(1 for _ in tgt_it)
    if rest:
        raise _mismatch(src_path, n, tgt_path, n + rest)


def _mismatch(src_path: Path, n_src: int, tgt_path: Path, n_tgt: int) -> MTError:
    return MTError(
        f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}: "
        f"a parallel corpus needs one target line per source line"
    )


def read_parallel(src_path: Path, tgt_path: Path) -> tuple[list[str], list[str]]:
    pairs = list(iter_parallel(src_path, tgt_path))
    return [s for s, _ in pairs], [t for _, t in pairs]


@dataclass
class Stats:
    """What a split's reading saw and dropped, by rule."""

    total: int = 0
    empty: int = 0
    too_long: int = 0
    duplicate: int = 0  # (data.drop_duplicates)
    ratio: int = 0  # past data.max_len_ratio

    @property
    def kept(self) -> int:
        return self.total - self.empty - self.too_long - self.duplicate - self.ratio

    def describe(self, name: str) -> str:
        more = (f", {self.duplicate} duplicates" if self.duplicate else "") + (
            f", {self.ratio} past the length ratio" if self.ratio else ""
        )
        return (
            f"{name}: {self.kept} of {self.total} pairs kept "
            f"({self.empty} empty, {self.too_long} longer than max_len{more} dropped)"
        )


def clean_pairs(pairs: Iterable[tuple[str, str]], stats: Stats) -> Iterator[tuple[str, str]]:
    """Cleaned pairs with both sides non-empty; counts what it sees and drops in `stats`."""
    for s, t in pairs:
        stats.total += 1
        s, t = clean(s), clean(t)
        if s and t:
            yield s, t
        else:
            stats.empty += 1


def drop_empty(src: list[str], tgt: list[str], stats: Stats) -> tuple[list[str], list[str]]:
    pairs = list(clean_pairs(zip(src, tgt, strict=True), stats))
    return [s for s, _ in pairs], [t for _, t in pairs]


class FlatParts:
    """Flat arrays read as one, none of them copied: what TokenArray.concat keeps of memory-
    mapped parts (the token cache's, mt/data/token_cache.py), so that the ids of several pairs
    stay in the files and the page cache that every rank shares, instead of being read into
    each process's memory whole. Indexed as the collators index a flat array: by an array of
    positions or by a slice."""

    def __init__(self, parts: list):
        self.parts: list[np.ndarray] = []
        for p in parts:  # (parts that are FlatParts themselves: their own parts)
            self.parts += p.parts if isinstance(p, FlatParts) else [p]
        self.starts = np.zeros(len(self.parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in self.parts], out=self.starts[1:])
        self.dtype = np.result_type(*self.parts)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index) -> np.ndarray:
        if isinstance(index, slice):
            return self[np.arange(*index.indices(len(self)))]
        index = np.asarray(index)
        if index.size and (index.min() < 0 or index.max() >= len(self)):
            raise IndexError(f"positions outside 0..{len(self) - 1}")
        part = np.searchsorted(self.starts, index, side="right") - 1
        out = np.empty(index.shape, dtype=self.dtype)
        for k in np.unique(part):
            chosen = part == k
            out[chosen] = self.parts[k][index[chosen] - self.starts[k]]
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The whole, copied into memory (np.asarray, np.save)."""
        whole = np.concatenate(self.parts)
        return whole if dtype is None else whole.astype(dtype)


class TokenArray:
    """Variable-length int sequences in one flat int32 array plus offsets (no Python lists)."""

    data: np.ndarray | FlatParts  # (the flat ids; several mapped parts: FlatParts)

    def __init__(self, seqs: list[list[int]], dtype=np.int32):
        self.lengths = np.fromiter((len(s) for s in seqs), dtype=np.int32, count=len(seqs))
        self.offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        self.data = np.fromiter(
            (t for s in seqs for t in s), dtype=dtype, count=int(self.offsets[-1])
        )

    @classmethod
    def from_arrays(cls, data: np.ndarray, lengths: np.ndarray, offsets: np.ndarray) -> TokenArray:
        """From its three arrays as they are (memory-mapped ones stay mapped, see
        mt.data.token_cache)."""
        out = cls([])
        out.data, out.lengths, out.offsets = data, lengths, offsets
        return out

    @classmethod
    def concat(cls, parts: list[TokenArray]) -> TokenArray:
        """The sequences of `parts` one after another; memory-mapped ids stay mapped (FlatParts),
        ids in memory are copied into one array."""
        out = cls([])
        if parts:
            out.lengths = np.concatenate([p.lengths for p in parts])
            flats = [p.data for p in parts]
            mapped = any(isinstance(f, np.memmap | FlatParts) for f in flats)
            out.data = FlatParts(flats) if mapped else np.concatenate(flats)
            out.offsets = np.zeros(len(out.lengths) + 1, dtype=np.int64)
            np.cumsum(out.lengths, out=out.offsets[1:])
        return out

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.data[self.offsets[i] : self.offsets[i + 1]]


@dataclass
class ParallelData:
    src: TokenArray
    tgt: TokenArray
    stats: Stats
    # with several language pairs (data.pairs) or corpora (data.corpora): each example's part,
    # numbered in their order, the parts one after another (mt/data/pairs.py); None: one part
    pair_of: np.ndarray | None = None
    # each part's weight in an epoch's draw (data.corpora's); None: all 1
    weights: tuple[float, ...] | None = None


def concat_pairs(
    parts: list[ParallelData], weights: tuple[float, ...] | None = None
) -> ParallelData:
    """The corpora of several language pairs (or of one pair's corpora, with their
    `weights`) as one, each example's part kept (pair_of); one part's corpus as it is."""
    if len(parts) == 1:
        return parts[0]
    stats = Stats(
        *(sum(getattr(p.stats, f.name) for p in parts) for f in dataclasses.fields(Stats))
    )
    sizes = [len(p.src) for p in parts]
    pair_of = np.repeat(np.arange(len(parts), dtype=np.int16), sizes)
    return ParallelData(
        TokenArray.concat([p.src for p in parts]),
        TokenArray.concat([p.tgt for p in parts]),
        stats,
        pair_of,
        weights,
    )


def both_directions(data: ParallelData) -> ParallelData:
    """The pairs in both directions, (src, tgt) then (tgt, src): one training set for a model
    that translates either way (same token ids on both sides: a joint vocabulary)."""
    return ParallelData(
        TokenArray.concat([data.src, data.tgt]), TokenArray.concat([data.tgt, data.src]), data.stats
    )


def encode_stream(
    pairs: Iterable[tuple[str, str]],
    tokenizer,
    max_len: int,
    stats: Stats,
    chunk: int = 20_000,
    dropout: float = 0.0,
    tag: str | None = None,
    max_ratio: float = 0.0,
    back_translated: bool = False,
) -> ParallelData:
    """Tokenize and drop pairs whose either side exceeds `max_len` subwords (+EOS/BOS), or
    whose longer side has over `max_ratio` times the subwords of the shorter (0: no limit);
    tag: the target language whose token leads every source (mt/data/pairs.py; <BT> after it
    where back_translated), counted in its length. Streams in chunks, so only one chunk ever
    exists as Python strings and lists of ints (~36 bytes per token); the result is uint16
    arrays (2 bytes per token) when the vocabulary fits, int32 otherwise. dropout > 0:
    BPE-dropout segmentations (seeded by Tokenizer.seed_dropout)."""
    big = max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size) > np.iinfo(np.uint16).max
    dtype = np.int32 if big else np.uint16
    src_parts, tgt_parts = [], []
    stats.too_long = 0
    buf: list[tuple[str, str]] = []

    lead = ("" if tag is None else f"{pairs_mod.tag(tag)} ") + f"{BT_TAG} " * back_translated

    def flush():
        src_ids = tokenizer.encode_src([lead + s for s, _ in buf], dropout)
        tgt_ids = tokenizer.encode_tgt([t for _, t in buf], dropout)
        fits = [
            i
            for i in range(len(buf))
            if len(src_ids[i]) + 1 <= max_len and len(tgt_ids[i]) + 1 <= max_len
        ]
        keep = [
            i for i in fits if not max_ratio or _within_ratio(src_ids[i], tgt_ids[i], max_ratio)
        ]
        stats.too_long += len(buf) - len(fits)
        stats.ratio += len(fits) - len(keep)
        src_parts.append(TokenArray([src_ids[i] for i in keep], dtype))
        tgt_parts.append(TokenArray([tgt_ids[i] for i in keep], dtype))
        buf.clear()

    for pair in pairs:
        buf.append(pair)
        if len(buf) == chunk:
            flush()
    if buf:
        flush()
    return ParallelData(TokenArray.concat(src_parts), TokenArray.concat(tgt_parts), stats)


def _within_ratio(src: list[int], tgt: list[int], ratio: float) -> bool:
    short, long = sorted((len(src), len(tgt)))
    return long <= ratio * max(short, 1)


def encode_pairs(
    src: list[str], tgt: list[str], tokenizer, max_len: int, stats: Stats
) -> ParallelData:
    """Lines already led by their target-language token, where they need one."""
    return encode_stream(zip(src, tgt, strict=True), tokenizer, max_len, stats)
