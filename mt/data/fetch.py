"""A run's corpus where its config says: data.dir's train and valid splits of every pair, or
data.dataset fetched into data.dir when that folder is absent, empty or an earlier download's
(never among a user's files); what is missing said in one line otherwise."""

from __future__ import annotations

from pathlib import Path

from mt.config import Config
from mt.data.corpus import has_split, pair_paths, split_paths
from mt.data.download import download, downloaded_into, is_empty_folder
from mt.data.pairs import Languages, Pair
from mt.errors import MTError, shorten


def ensure_data(cfg: Config, log) -> None:
    """data.dir's train and valid splits of every pair exist, or data.dataset is fetched into
    data.dir (_fetch; never among a user's files)."""
    d, langs = cfg.data, Languages.of(cfg.data)
    missing = [
        (split, pair)
        for pair in langs.pairs
        for split in ("train", "valid")
        if not has_split(d.dir, split, pair.src, pair.tgt)
    ]
    if not missing:
        return
    for split, pair in missing:  # (a download would write into it, or wait on a FIFO for ever)
        for path in split_paths(d.dir, split, pair.src, pair.tgt):
            if path.exists() and not path.is_file():
                kind = "a folder" if path.is_dir() else "not a regular file (a FIFO, socket...)"
                raise MTError(
                    f"{path} is {kind}: the {split} split is read from text files; put the "
                    f"{split}.{pair.src} and {split}.{pair.tgt} files in {d.dir}"
                )
    _fetch(cfg, missing, log)


def _fetch(cfg: Config, missing: list[tuple[str, Pair]], log) -> None:
    """data.dataset downloaded into data.dir, which lacks the `missing` splits, when that
    folder is absent, empty or an earlier download's; else what is missing is said."""
    d, langs = cfg.data, Languages.of(cfg.data)
    folder = Path(d.dir)
    own = downloaded_into(folder)
    if d.dataset is None or not (is_empty_folder(folder) or own == d.dataset):
        raise MTError(_no_split_message(cfg, *missing[0], own))
    split, pair = missing[0]
    strange = [lang for lang in langs.every if lang not in ("src", "tgt")]
    if d.dataset == "synthetic" and strange:
        raise MTError(
            f"the synthetic corpus (data.dataset) has the languages src and tgt, not "
            f"{shorten(repr(strange[0]))}: set data.src_lang=src and data.tgt_lang=tgt, or "
            f"data.dir and data.dataset to your corpus's folder and name"
        )
    names = ", ".join(Path(f).name for f in split_paths(d.dir, split, pair.src, pair.tgt))
    log(
        f"data.dir {folder.resolve()} has no {split} split ({names}): downloading the "
        f"{d.dataset} corpus (data.dataset) into it; to train on your own files, set data.dir "
        f"to their folder ..."
    )
    every = (pair.src, pair.tgt) if len(langs.pairs) == 1 else tuple(langs.every)
    try:
        download(
            d.dataset,
            folder,
            config=d.dataset_config,
            langs=every if d.dataset != "synthetic" else None,
            force=own is not None,
        )
    except MTError as e:
        if folder.is_absolute():
            raise
        raise MTError(
            f"{e} (data.dir {d.dir} is relative to the current folder, {Path.cwd()}: run from "
            f"the folder the config's paths start from, or make data.dir absolute)"
        ) from None
    for split, pair in missing:
        if not has_split(d.dir, split, pair.src, pair.tgt):
            raise MTError(_no_split_message(cfg, split, pair, d.dataset))


def _no_split_message(cfg: Config, split: str, pair: Pair, downloaded: str | None) -> str:
    """Which files a split needs, which the folder has, and what to change."""
    d = cfg.data
    src, tgt = split_paths(d.dir, split, pair.src, pair.tgt)
    folder = Path(d.dir)
    if not folder.is_dir():
        return (
            f"data.dir {d.dir} does not exist: fetch a corpus with `mt download` or set "
            f"data.dir to the folder of {split}.{pair.src} and {split}.{pair.tgt}"
        )
    there = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    found = ", ".join(there[:8]) + (", ..." if len(there) > 8 else "") if there else "no files"
    fix = "check data.pairs" if d.pairs else "check data.src_lang and data.tgt_lang"
    fix += ", or name the files so"
    own = pair_paths(d.dir, split, pair.src, pair.tgt)
    if d.pairs and (src, tgt) != own:
        fix += f" (a pair's own files: {own[0].name} and {own[1].name})"
    if d.dataset is not None and downloaded != d.dataset:
        fix += f" (mt downloads {d.dataset} only into an absent or empty folder)"
    return f"no {split} data: {src} and {tgt} must exist ({d.dir} has {found}); {fix}"
