"""Get a parallel corpus into `OUT/{train,valid,test}.{lang}` plain text.

Sources: the Hugging Face hub through `datasets.load_dataset`, a local folder (the official
Multi30k raw layout, plain text splits, or a `datasets` folder written by `save_to_disk`),
or the built-in synthetic task.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from mt.data import synthetic
from mt.data.corpus import SPLITS, read_lines
from mt.data.tables import carve_valid, read_tables, tables_in
from mt.errors import MTError, first_line, shorten
from mt.outputs import atomic_folder, check_folder_creatable, write_text

# Short names -> (hub id, dataset config). Any other name is passed to the hub as it is.
HUB_ALIASES = {
    "multi30k": ("bentrevett/multi30k", None),
    "wmt14": ("wmt/wmt14", "de-en"),
}
_SPLIT_NAMES = {
    "train": "train",
    "validation": "valid",
    "valid": "valid",
    "val": "valid",
    "dev": "valid",
    "test": "test",
    "test_2016_flickr": "test",
}
_FILE = re.compile(r"^(?P<split>[^.]+)\.(?P<lang>[A-Za-z_-]{2,8})(?:\.gz)?$")
# Written into a folder that a download created (or found empty): the folder is mt's, and
# `mt train` may fetch its corpus into it again; never into a folder of the user's files.
MARKER = ".mt-download"


def downloaded_into(folder: Path) -> str | None:
    """The dataset a download wrote into `folder` when the folder is mt's own, else None."""
    try:
        return (folder / MARKER).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def is_empty_folder(folder: Path) -> bool:
    return not folder.exists() or (folder.is_dir() and not any(folder.iterdir()))


def _one_line(text: Any) -> str:
    # A value with an embedded newline would shift every later line of the corpus.
    return " ".join(str(text).split())


def write_splits(
    splits: dict[str, dict[str, list[str]]], out: Path, force: bool, name: str = ""
) -> dict[str, int]:
    """splits: {split: {lang: lines}} -> OUT/split.lang files; returns lines per split. A
    folder that was absent or empty is marked as the download of `name` (MARKER)."""
    targets = [out / f"{split}.{lang}" for split, by_lang in splits.items() for lang in by_lang]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not force:
        raise MTError(
            f"{existing[0]} already exists; pass --force to overwrite or choose another --out"
        )
    for split, by_lang in splits.items():
        counts = {lang: len(lines) for lang, lines in by_lang.items()}
        if len(set(counts.values())) > 1:
            raise MTError(f"split {split} has different line counts per language: {counts}")
    own = downloaded_into(out) is not None or is_empty_folder(out)
    fresh = not out.exists() or is_empty_folder(out)
    try:
        (out.parent if fresh else out).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MTError(f"cannot create {out} ({e.strerror}); choose another --out") from None

    def write(folder: Path) -> None:
        if own and name:
            write_text(folder / MARKER, name + "\n")
        for split, by_lang in splits.items():
            for lang, lines in by_lang.items():
                text = "".join(_one_line(x) + "\n" for x in lines)
                write_text(folder / f"{split}.{lang}", text)

    if fresh:  # a new folder appears whole or not at all
        with atomic_folder(out) as folder:
            write(folder)
    else:  # the user's folder (--force): each file whole
        write(out)
    return {split: len(next(iter(by_lang.values()))) for split, by_lang in splits.items()}


def from_datasets(dd, langs: tuple[str, ...] | None = None) -> dict[str, dict[str, list[str]]]:
    """A `datasets.DatasetDict` with one column per language (multi30k) or a `translation`
    column of {lang: text} dicts (WMT) -> {split: {lang: lines}}."""
    out: dict[str, dict[str, list[str]]] = {}
    for name, ds in dd.items():
        split = _SPLIT_NAMES.get(name)
        if split is None:
            continue
        if "translation" in ds.column_names:
            pairs = ds["translation"]
            found = tuple(pairs[0]) if len(pairs) else ()
            use = langs or found
            missing = [lang for lang in use if lang not in found]
            if missing:
                raise MTError(f"split {name} has languages {list(found)}, not {missing}")
            out[split] = {lang: [p[lang] for p in pairs] for lang in use}
        else:
            cols = [c for c in ds.column_names if ds.features[c].dtype == "string"]
            use = langs or tuple(cols)
            missing = [lang for lang in use if lang not in cols]
            if missing:
                raise MTError(
                    f"split {name} has text columns {cols}, not {missing}; "
                    f"pass --src and --tgt with column names"
                )
            out[split] = {lang: list(ds[lang]) for lang in use}
    if "train" not in out:
        raise MTError(f"the dataset has splits {list(dd)}, but none is named train")
    return out


def from_dir(path: Path, langs: tuple[str, ...] | None = None) -> dict[str, dict[str, list[str]]]:
    tables = tables_in(path)
    if tables:  # (SPLIT.tsv or SPLIT.csv files, or one table of training pairs)
        return read_tables(tables, langs)
    if not path.is_dir():
        what = "not found" if not path.exists() else "not a folder, nor a .tsv or .csv table"
        raise MTError(
            f"--from-dir {path}: {what}; give a folder of SPLIT.LANG files or of tables "
            f"(train.tsv, ...), or one .tsv or .csv table of training pairs"
        )
    if (path / "dataset_dict.json").is_file():
        import datasets

        return from_datasets(datasets.load_from_disk(str(path)), langs)
    found: dict[str, dict[str, Path]] = {}
    for f in sorted(path.iterdir()):
        m = _FILE.match(f.name)
        split = _SPLIT_NAMES.get(m["split"]) if m else None
        if m and split and (not langs or m["lang"] in langs):
            # Prefer an exact name (test_2016_flickr) over a later duplicate of the same split.
            found.setdefault(split, {}).setdefault(m["lang"], f)
    if "train" not in found:
        raise MTError(
            f"--from-dir {path}: no training files found; expected train.LANG[.gz] "
            f"(and val/valid/dev, test or test_2016_flickr) for two languages, or tables "
            f"(train.tsv, train.csv, ...)"
        )
    return {
        split: {lang: read_lines(p) for lang, p in by_lang.items()}
        for split, by_lang in found.items()
    }


def from_hub(name: str, config: str | None, langs: tuple[str, ...] | None, out: Path):
    """A hub dataset's splits; a hub that cannot be reached is known within seconds (the
    library would retry for half a minute), and the local cache is read instead."""
    hub_id, default_config = HUB_ALIASES.get(name, (name, None))
    config = config or default_config
    unreachable = _unreachable_hub()
    if unreachable:
        _go_offline()
    try:
        import datasets

        dd = datasets.load_dataset(hub_id, config)
    except Exception as e:  # network, auth and missing-dataset errors all mean the same here
        reason = first_line(e)
        if unreachable:
            reason = f"the hub cannot be reached ({unreachable}), and it is not in the cache"
        raise MTError(
            f"could not load '{hub_id}' from the Hugging Face hub ({reason}); "
            f"without network access, import local files with "
            f"`mt download {name} --from-dir DIR --out {out}`"
        ) from None
    return from_datasets(dd, langs)


def _unreachable_hub(timeout: float = 5.0) -> str | None:
    """Why the hub (HF_ENDPOINT) cannot be reached, or None: any HTTP answer is reachable.
    None without asking where offline mode is already set (HF_HUB_OFFLINE)."""
    import urllib.error
    import urllib.request

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as e:  # (URLError, a timeout, a malformed HF_ENDPOINT)
        return shorten(str(getattr(e, "reason", e)), 80)
    return None


def _go_offline() -> None:
    """The hub libraries read only their local caches from here on (as HF_HUB_OFFLINE=1)."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    read_at_import = (
        ("huggingface_hub.constants", "HF_HUB_OFFLINE"),
        ("datasets.config", "HF_HUB_OFFLINE"),
        ("datasets.config", "HF_DATASETS_OFFLINE"),
    )
    for module, attr in read_at_import:
        if module in sys.modules and hasattr(sys.modules[module], attr):
            setattr(sys.modules[module], attr, True)


def download(
    name: str,
    out: Path,
    *,
    config: str | None = None,
    from_path: Path | None = None,
    langs: tuple[str, ...] | None = None,
    force: bool = False,
    valid_size: int = 0,
) -> dict[str, int]:
    check_folder_creatable(out, "--out")  # before anything is fetched
    if config is not None and (name == "synthetic" or from_path is not None):
        raise MTError(
            f"--config {shorten(config)} chooses a hub dataset's configuration; "
            f"{'synthetic' if name == 'synthetic' else '--from-dir'} has none: leave it out "
            f"(--src and --tgt choose the languages)"
        )
    if config is not None and name in HUB_ALIASES and HUB_ALIASES[name][1] is None:
        raise MTError(
            f"--config {shorten(config)}: {name} ({HUB_ALIASES[name][0]}) has one "
            f"configuration holding every language; choose the pair with --src and --tgt"
        )
    if name == "synthetic":
        splits = {s: {"src": a, "tgt": b} for s, (a, b) in synthetic.splits().items()}
    elif from_path is not None:
        splits = from_dir(from_path, langs)
    else:
        splits = from_hub(name, config, langs, out)
    for split in SPLITS:
        if split in splits and len(splits[split]) < 2:
            raise MTError(
                f"split {split} has only the language(s) {list(splits[split])}; "
                f"a parallel corpus needs two"
            )
    if valid_size:
        carve_valid(splits, valid_size, lambda said: print(said, file=sys.stderr))
    missing = [split for split in SPLITS if split not in splits]
    counts = write_splits(splits, out, force, name)
    if missing:  # (a corpus without them still trains: validation needs valid, mt eval a test)
        print(
            f"note: no {' or '.join(missing)} split found; {out} holds "
            f"{', '.join(counts)} alone (mt train needs valid: --valid-size N draws one from "
            f"train; give mt eval --src and --ref of your own test set)",
            file=sys.stderr,
        )
    return counts
