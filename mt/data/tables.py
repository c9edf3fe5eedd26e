"""Parallel corpora as people often hold them: one table per split, a pair per row. A TSV
(`train.tsv`: source TAB target, no header, as OPUS and Tatoeba ship them) names no columns,
so --src and --tgt name its first and second; a CSV (`train.csv`) names them in its header
row, and --src and --tgt choose two of them. A folder of such tables (train, valid or dev,
test) or one table of training pairs is read; a valid split can be carved from the training
pairs where there is none (`mt download --valid-size N`)."""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

from mt.errors import MTError, shorten

ENDINGS = (".tsv", ".csv")
SPLIT_NAMES = {
    "train": "train",
    "valid": "valid",
    "val": "valid",
    "dev": "valid",
    "validation": "valid",
    "test": "test",
}


def tables_in(path: Path) -> dict[str, Path]:
    """The split -> table files of `path` (a folder of SPLIT.tsv or SPLIT.csv files, or one
    table of training pairs); empty where it holds none."""
    if path.is_file():
        return {"train": path} if path.suffix.lower() in ENDINGS else {}
    found: dict[str, Path] = {}
    for f in sorted(path.iterdir()) if path.is_dir() else []:
        split = SPLIT_NAMES.get(f.stem.lower())
        if split and f.suffix.lower() in ENDINGS:
            found.setdefault(split, f)
    return found


def read_tables(
    tables: dict[str, Path], langs: tuple[str, ...] | None
) -> dict[str, dict[str, list[str]]]:
    """{split: {lang: lines}} of the tables (see the module's docstring for the columns)."""
    return {split: _read_table(path, langs) for split, path in tables.items()}


def _read_table(path: Path, langs: tuple[str, ...] | None) -> dict[str, list[str]]:
    csv.field_size_limit(sys.maxsize)
    with open(path, encoding="utf-8", newline="") as f:
        if path.suffix.lower() == ".tsv":
            return _tsv(path, f, langs)
        rows = csv.reader(f)
        header = next(rows, None)
        if not header:
            raise MTError(f"{path}: empty; a CSV corpus starts with a header naming its columns")
        src, tgt = langs or ((header[0], header[1]) if len(header) == 2 else (None, None))
        if src is None or tgt is None or src not in header or tgt not in header:
            raise MTError(
                f"{path}: its columns are {shorten(', '.join(header), 100)}; name the source "
                f"and target columns with --src and --tgt"
            )
        i, j = header.index(src), header.index(tgt)
        pairs = [(n, row) for n, row in enumerate(rows, start=2) if row]
        _check_widths(path, pairs, len(header))
        return {src: [row[i] for _, row in pairs], tgt: [row[j] for _, row in pairs]}


def _tsv(path: Path, f, langs: tuple[str, ...] | None) -> dict[str, list[str]]:
    if not langs:
        raise MTError(
            f"{path}: a TSV's columns have no names; give --src LANG and --tgt LANG for its "
            f"first and second columns (e.g. --src en --tgt de)"
        )
    rows = [(n, line.rstrip("\r\n").split("\t")) for n, line in enumerate(f, start=1)]
    rows = [(n, row) for n, row in rows if row != [""]]
    _check_widths(path, rows, 2)
    return {langs[0]: [row[0] for _, row in rows], langs[1]: [row[1] for _, row in rows]}


def _check_widths(path: Path, rows: list[tuple[int, list[str]]], width: int) -> None:
    for n, row in rows:
        if len(row) != width:
            raise MTError(
                f"{path}, line {n}: {len(row)} column(s) where the table has {width} (a tab or "
                f"comma inside a sentence must be quoted in a CSV; a TSV allows none)"
            )


def carve_valid(splits: dict[str, dict[str, list[str]]], size: int, say) -> None:
    """A valid split of `size` training pairs drawn with a fixed seed (the same draw for the
    same corpus) and taken out of train, where the corpus has no valid split."""
    if "valid" in splits:
        raise MTError("--valid-size: the corpus has a valid split already; leave it out")
    train = splits["train"]
    n = len(next(iter(train.values())))
    if not 0 < size < n:
        raise MTError(f"--valid-size {size}: the training split has {n:,} pairs; take fewer")
    chosen = set(random.Random(0).sample(range(n), size))
    splits["valid"] = {
        lang: [x for i, x in enumerate(v) if i in chosen] for lang, v in train.items()
    }
    splits["train"] = {
        lang: [x for i, x in enumerate(v) if i not in chosen] for lang, v in train.items()
    }
    say(f"valid: {size:,} pairs drawn from train (seed 0), which keeps {n - size:,}")
