"""`mt distill TEACHER_RUN --data DIR --out DIR2`: sequence-level knowledge distillation (Kim &
Rush 2016). The teacher translates the training sources with beam search, and its
translations replace the training targets: a corpus in DIR2 that any config can train on (the
non-autoregressive model learns from such a corpus far better than from the references,
Gu et al. 2018). The valid and test splits are copied unchanged, so scores stay against the
real references. A teacher of several pairs (data.pairs) translates each pair's sources into
that pair's language, each pair written to files of its own (train.en-de.en, ...), which a
student with the same data.pairs reads."""

from __future__ import annotations

import shutil
from pathlib import Path

from mt.artifacts import checkpoint
from mt.data.corpus import SPLITS, has_split, pair_paths, read_lines, split_paths
from mt.data.pairs import Languages, Pair, tagged
from mt.errors import MTError
from mt.outputs import check_folder_creatable, write_text


def distill(
    teacher: Path,
    data: Path,
    out: Path,
    beam: int | None = None,
    device: str = "auto",
    force: bool = False,
    log=print,
) -> int:
    """Write DIR2's splits of every pair the teacher learned; returns the number of training
    pairs written (of every pair)."""
    from mt.decode.translator import Translator

    paths = checkpoint.resolve_all([teacher])  # (a run of several members: their ensemble)
    translator = Translator.load(paths, device)
    langs = translator.languages
    assert langs is not None  # (a translator loaded from checkpoints knows its pairs)
    _check(langs, data, out, force)
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for pair in langs.pairs:
        src_path, _ = split_paths(data, "train", pair.src, pair.tgt)
        sources = read_lines(src_path)
        of = f" of {pair}" if len(langs.pairs) > 1 else ""
        log(
            translator.describe(paths, translator.options(beam=beam))
            + f" ({len(sources):,} training sources{of})"
        )
        hyps = translator.translate(tagged(sources, langs.tag_of(pair)), beam=beam, progress=True)
        new_src, new_tgt = _written(out, "train", pair, langs)
        write_text(new_src, "".join(s + "\n" for s in sources))
        write_text(new_tgt, "".join(h + "\n" for h in hyps))
        for split in ("valid", "test"):
            if has_split(data, split, pair.src, pair.tgt):
                old = split_paths(data, split, pair.src, pair.tgt)
                for a, b in zip(old, _written(out, split, pair, langs), strict=True):
                    shutil.copyfile(a, b)
        written += len(sources)
    return written


def _check(langs: Languages, data: Path, out: Path, force: bool) -> None:
    """Every pair's training split is in --data, and --out is another folder that may be
    written (its files of an earlier distillation replaced only with --force)."""
    for pair in langs.pairs:
        if not has_split(data, "train", pair.src, pair.tgt):
            src, tgt = split_paths(data, "train", pair.src, pair.tgt)
            named = pair_paths(data, "train", pair.src, pair.tgt)
            plain = len(langs.pairs) > 1 and (src, tgt) != named
            own = f" or {named[0].name} and .{pair.tgt}" if plain else ""
            raise MTError(
                f"--data {data}: no {src.name} and {tgt.name}{own} (the teacher translates {pair})"
            )
    if Path(out).resolve() == Path(data).resolve():
        raise MTError("--out must be another folder than --data: the references are kept")
    targets = [p for pair in langs.pairs for s in SPLITS for p in _written(out, s, pair, langs)]
    existing = [p for p in targets if p.exists()]
    if existing and not force:
        raise MTError(
            f"{existing[0]} already exists; pass --force to overwrite it or choose another --out"
        )
    check_folder_creatable(out, "--out")


def _written(out: Path, split: str, pair: Pair, langs: Languages) -> tuple[Path, Path]:
    """Where a split of `pair` is written: {split}.{lang}, or for a teacher of several pairs
    the pair's own files (two pairs may share a language, as en-de and en-fr their source)."""
    if len(langs.pairs) == 1:
        return out / f"{split}.{pair.src}", out / f"{split}.{pair.tgt}"
    return pair_paths(out, split, pair.src, pair.tgt)
