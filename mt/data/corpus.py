"""Parallel text on disk -> checked, cleaned line pairs -> compact token-id arrays."""
from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mt.errors import MTError

SPLITS = ("train", "valid", "test")
# C0/C1 control characters except tab; they are invisible and confuse tokenizers and scorers.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def open_text(path: Path, mode: str = "rb"):
    return gzip.open(path, mode) if str(path).endswith(".gz") else open(path, mode)


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 (optionally .gz) file, without line endings.

    Decodes line by line so an encoding error names the line the user must fix.
    """
    path = Path(path)
    if not path.is_file():
        raise MTError(f"{path}: file not found")
    lines = []
    try:
        with open_text(path) as f:
            for i, raw in enumerate(f, 1):
                try:
                    lines.append(raw.decode("utf-8").rstrip("\r\n"))
                except UnicodeDecodeError as e:
                    raise MTError(f"{path}:{i}: invalid UTF-8 at byte {e.start} "
                                  f"(re-encode the file as UTF-8, e.g. with iconv)") from None
    except (OSError, EOFError) as e:
        raise MTError(f"{path}: cannot read ({e})") from None
    return lines


def clean(line: str) -> str:
    return " ".join(_CONTROL.sub(" ", line).split())


def split_paths(data_dir: str | Path, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    d = Path(data_dir)
    return d / f"{split}.{src_lang}", d / f"{split}.{tgt_lang}"


def has_split(data_dir: str | Path, split: str, src_lang: str, tgt_lang: str) -> bool:
    return all(p.is_file() for p in split_paths(data_dir, split, src_lang, tgt_lang))


def read_parallel(src_path: Path, tgt_path: Path) -> tuple[list[str], list[str]]:
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise MTError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: "
                      f"a parallel corpus needs one target line per source line")
    return src, tgt


@dataclass
class Stats:
    total: int = 0
    empty: int = 0
    too_long: int = 0

    @property
    def kept(self) -> int:
        return self.total - self.empty - self.too_long

    def describe(self, name: str) -> str:
        return (f"{name}: {self.kept} of {self.total} pairs kept "
                f"({self.empty} empty, {self.too_long} longer than max_len dropped)")


def drop_empty(src: list[str], tgt: list[str], stats: Stats) -> tuple[list[str], list[str]]:
    stats.total = len(src)
    pairs = [(s, t) for s, t in ((clean(s), clean(t)) for s, t in zip(src, tgt)) if s and t]
    stats.empty = len(src) - len(pairs)
    return [s for s, _ in pairs], [t for _, t in pairs]


class TokenArray:
    """Variable-length int sequences in one flat int32 array plus offsets (no Python lists)."""

    def __init__(self, seqs: list[list[int]]):
        self.lengths = np.fromiter((len(s) for s in seqs), dtype=np.int32, count=len(seqs))
        self.offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        self.data = np.fromiter((t for s in seqs for t in s), dtype=np.int32,
                                count=int(self.offsets[-1]))

    @classmethod
    def concat(cls, parts: list["TokenArray"]) -> "TokenArray":
        out = cls([])
        if parts:
            out.lengths = np.concatenate([p.lengths for p in parts])
            out.data = np.concatenate([p.data for p in parts])
            out.offsets = np.zeros(len(out.lengths) + 1, dtype=np.int64)
            np.cumsum(out.lengths, out=out.offsets[1:])
        return out

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.data[self.offsets[i]:self.offsets[i + 1]]


@dataclass
class ParallelData:
    src: TokenArray
    tgt: TokenArray
    stats: Stats


def encode_pairs(src: list[str], tgt: list[str], tokenizer, max_len: int,
                 stats: Stats, chunk: int = 20_000) -> ParallelData:
    """Tokenize and drop pairs whose either side exceeds `max_len` subwords (+EOS/BOS).
    Works in chunks so that only one chunk ever exists as Python lists of ints (which cost
    ~36 bytes per token); the result is int32 arrays (4 bytes per token)."""
    src_parts, tgt_parts = [], []
    stats.too_long = 0
    for start in range(0, len(src), chunk):
        src_ids = tokenizer.encode_src(src[start:start + chunk])
        tgt_ids = tokenizer.encode_tgt(tgt[start:start + chunk])
        keep = [i for i in range(len(src_ids))
                if len(src_ids[i]) + 1 <= max_len and len(tgt_ids[i]) + 1 <= max_len]
        stats.too_long += len(src_ids) - len(keep)
        src_parts.append(TokenArray([src_ids[i] for i in keep]))
        tgt_parts.append(TokenArray([tgt_ids[i] for i in keep]))
    return ParallelData(TokenArray.concat(src_parts), TokenArray.concat(tgt_parts), stats)
