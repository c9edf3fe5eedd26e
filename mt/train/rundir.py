"""A run directory belongs to one training process at a time, and holds one run: what may
change when a run is resumed, and what must be refused before anything is written."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from mt.artifacts import checkpoint
from mt.config import Config, config_from_dict, diff_configs, save_config
from mt.data.corpus import corpus_paths, split_paths
from mt.data.pairs import Pair
from mt.data.selection import train_parts
from mt.data.tokenizer import MODEL_FILES
from mt.errors import MTError
from mt.outputs import RUN_LOCK, RunLock, check_folder_writable, write_text

# Keys that may change between a run and its resumption without --allow-config-change: they
# change how long or where it trains, not what it learns. (data.dir is checked separately: a
# moved corpus is the same run, another corpus is not.)
RESUMABLE = (
    "train.max_steps",
    "train.max_minutes",
    "train.expected_steps",
    "train.log_every",
    "train.valid_every",
    "train.save_every",
    "train.patience",
    "train.device",
    "train.num_threads",
    "train.valid_beam",
    "train.compile",
    "train.compiled_loss_chunk",
    "train.fast_paths",
    "train.update",
    "train.tensorboard",
    "train.dist_timeout_minutes",
    "train.dist_wait_minutes",
    "decode",
    "data.dir",
)
# Keys no flag can change in a run that has a checkpoint: the weights, the optimizer's moments
# and the BPE model were made for them.
FIXED_SECTIONS = ("model", "tokenizer")
FIXED_KEYS = ("data.src_lang", "data.tgt_lang", "data.pairs", "data.text")
# ...except these, on which no shape depends
CHANGEABLE_IN_MODEL = (
    "model.dropout",
    "model.attn_dropout",
    "model.act_dropout",
    "model.init_encoder",
)

LOCK_NAME = RUN_LOCK
CORPUS_NAME = "corpus.json"


def has_checkpoint(run_dir: Path) -> bool:
    last = run_dir / "last.pt"
    return last.exists() or checkpoint.previous(last).exists()


def trained_files(run_dir: Path) -> list[str]:
    """The checkpoints other than last.pt that say a run trained in `run_dir` (a run killed
    before its first save leaves none: starting it over loses nothing but its log)."""
    found = [
        name for name in ("best.pt", "averaged.pt", "pretrained.pt") if (run_dir / name).exists()
    ]
    snapshots = checkpoint.snapshots(run_dir) if run_dir.is_dir() else []
    if snapshots:
        found.append(f"{len(snapshots)} step_N.pt snapshot(s)")
    return found


def check_resumable(run_dir: Path, restart: bool) -> None:
    """A run directory that holds a trained run's files but nothing to resume from (last.pt
    and last.pt.prev gone) is not trained into again from step 0 over its best.pt, unless
    `restart` (mt train --restart), which moves them aside first (set_aside)."""
    if restart or has_checkpoint(run_dir):
        return
    found = trained_files(run_dir)
    if found:
        raise MTError(
            f"{run_dir} holds a trained run ({', '.join(found)}) but no last.pt or "
            f"last.pt.prev to resume from: train into a new --run-dir, or add --restart to "
            f"start again from step 0 with the old files moved to {run_dir}/{ASIDE}-<time>/ "
            f"(best.pt and the snapshots hold no optimizer state to resume from exactly)"
        )


ASIDE = "replaced"  # the folder prefix of a restarted run's old files


def set_aside(run_dir: Path, log) -> Path | None:
    """mt train --restart: every file of the run directory (but the lock and earlier folders
    set aside) moved into RUN/replaced-<time>/; None when there was nothing to move."""
    entries = [e for e in run_dir.iterdir() if e.name != LOCK_NAME and not e.name.startswith(ASIDE)]
    if not entries:
        return None
    aside = run_dir / f"{ASIDE}-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    for entry in entries:
        os.replace(entry, aside / entry.name)
    log(f"--restart: the run's earlier files moved to {aside}")
    return aside


def corpus_fingerprint(cfg: Config) -> dict:
    """Sizes and a hash of the first MiB of the training files: enough to tell a moved corpus
    from another one without reading a WMT-size corpus twice."""
    from mt.data.pairs import Languages

    out = {}
    pairs = Languages.of(cfg.data).pairs  # (every pair's: a language's file is read once)
    paths = dict.fromkeys(
        p for pair in pairs for p in split_paths(cfg.data.dir, "train", pair.src, pair.tgt)
    )
    for pair, corpus in train_parts(cfg):  # (data.corpora's too)
        if corpus is not None:
            paths |= dict.fromkeys(corpus_paths(cfg.data.dir, corpus.name, pair.src, pair.tgt))
    for path in paths:
        path = Path(path)
        if not path.is_file():
            return {}
        with open(path, "rb") as f:
            head = hashlib.sha256(f.read(2**20)).hexdigest()
        out[path.name] = {"bytes": path.stat().st_size, "head_sha256": head}
    return out


def _saved_config(run_dir: Path) -> Config | None:
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return None
    from mt.config.load import read_yaml

    try:
        return config_from_dict(read_yaml(saved), str(saved))
    except MTError as e:
        raise MTError(
            f"{e}; mend it, or delete it: mt train writes it again from the config you give "
            f"(the checkpoints hold their own copy)"
        ) from None


def _corpus_moved(cfg: Config, run_dir: Path) -> bool:
    """data.dir differs from the saved run's, but the training files are the same."""
    path = run_dir / CORPUS_NAME
    if not path.is_file():
        return False
    found = corpus_fingerprint(cfg)
    return bool(found) and found == _read_corpus(path)


def _read_corpus(path: Path) -> dict:
    """corpus.json: the training files a run started with (record_corpus)."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        saved = None
    if not isinstance(saved, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("bytes"), int) for v in saved.values()
    ):
        raise MTError(
            f"{path} is damaged (it records the training files this run started with): "
            f"delete it to go on without that check; mt train records the files again"
        )
    return saved


def check_config_change(cfg: Config, run_dir: Path, allow_config_change: bool) -> list[str]:
    """Refuse a config this run cannot continue with; returns the changes that will apply."""
    old = _saved_config(run_dir)
    if old is None or not has_checkpoint(run_dir):
        return []  # nothing trained yet: a failed start must not lock its config
    changed = _followed(diff_configs(cfg, old), cfg, old)
    fixed = [
        c
        for c in changed
        if (c.split(".")[0] in FIXED_SECTIONS or _key(c) in FIXED_KEYS)
        and _key(c) not in CHANGEABLE_IN_MODEL
    ]
    if fixed:
        raise MTError(
            f"{run_dir} holds a trained run whose {_names(fixed)} cannot change "
            f"({'; '.join(fixed[:3])}): its weights and BPE model were made for the "
            f"old values; use another --run-dir for the new config"
        )
    needs_flag = [
        c
        for c in changed
        if not _key(c).startswith(RESUMABLE)
        or (_key(c) == "data.dir" and not _corpus_moved(cfg, run_dir))
    ]
    if needs_flag and not allow_config_change:
        raise MTError(
            f"{run_dir} holds a run with a different config "
            f"({'; '.join(needs_flag[:3])}{'; ...' if len(needs_flag) > 3 else ''}); "
            f"use another --run-dir, or "
            f"pass --allow-config-change to continue it with the new config"
        )
    return changed


def _decode_as_said(cfg: Config, run_dir: Path, changed: list[str], log) -> None:
    """A resumed run whose decode settings changed: best.pt, which `mt translate RUN_DIR`
    decodes with, takes them too (its own were the run's old ones, or tuned on valid), so that
    config.yaml never says one decoding and the run uses another. Later saves write the new
    ones into every checkpoint; the end's tuning (decode.tune_*) may still choose for best.pt."""
    keys = [_key(c).split(".", 1)[1] for c in changed if _key(c).startswith("decode.")]
    best = run_dir / "best.pt"
    if not keys or not best.is_file():
        return
    try:
        ckpt = checkpoint.load(best)
    except MTError:
        return  # (a damaged best.pt is said where it is read)
    new = cfg.decode.model_dump()
    checkpoint.set_decoding(ckpt, {k: new[k] for k in keys})
    checkpoint.atomic_save(ckpt, best)
    log(f"{best} decodes with the new {', '.join(f'decode.{k}' for k in keys)} too")


def _key(change: str) -> str:
    return change.split(":")[0]


def _followed(changes: list[str], cfg: Config, old: Config) -> list[str]:
    """The changes with data.src_lang and data.tgt_lang left out where they only followed
    data.pairs (each defaults to the first pair's): reordered pairs name data.pairs, not a
    language the user never set."""
    keys = [_key(c) for c in changes]
    if "data.pairs" not in keys or not (cfg.data.pairs and old.data.pairs):
        return changes
    new_first, old_first = (Pair.parse(d.pairs[0]) for d in (cfg.data, old.data))
    followed = {
        "data.src_lang": (cfg.data.src_lang, old.data.src_lang) == (new_first.src, old_first.src),
        "data.tgt_lang": (cfg.data.tgt_lang, old.data.tgt_lang) == (new_first.tgt, old_first.tgt),
    }
    return [c for c, k in zip(changes, keys, strict=True) if not followed.get(k, False)]


def _names(changes: list[str]) -> str:
    return ", ".join(_key(c) for c in changes)


def _drop_stale_tokenizer(cfg: Config, run_dir: Path, log) -> None:
    """A start that failed before its first checkpoint may have left a BPE model made for
    another corpus or vocabulary: it is retrained rather than reused."""
    old = _saved_config(run_dir)
    if old is None:
        return
    changed = diff_configs(cfg, old)
    if any(
        c.startswith(("tokenizer.", "data.")) and not c.startswith("data.max_len") for c in changed
    ):
        for name in MODEL_FILES:
            if (run_dir / name).exists():
                (run_dir / name).unlink()
                log(
                    f"{run_dir / name} was made for another corpus or tokenizer config: "
                    f"training BPE again"
                )


def prepare_run_dir(
    cfg: Config,
    run_dir: Path,
    allow_config_change: bool,
    is_main: bool = True,
    log=print,
    restart: bool = False,
) -> RunLock | None:
    """Check the run directory (every rank: all must fail together); rank 0 locks it and
    writes the config. Nothing is written before every check has passed. restart: the files
    of a run that cannot be resumed are moved aside (check_resumable)."""
    if not is_main:
        check_resumable(run_dir, restart)
        if not restart:
            check_config_change(cfg, run_dir, allow_config_change)
        return None
    if run_dir.exists() and not run_dir.is_dir():
        raise MTError(f"run directory {run_dir} is a file: give a folder with --run-dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MTError(
            f"run directory {run_dir} is not writable ({e.strerror}); choose another with --run-dir"
        ) from None
    check_folder_writable(run_dir, "run")
    _check_files_are_files(run_dir)
    if not restart:
        check_config_change(cfg, run_dir, allow_config_change)  # refused before the lock file
    lock = RunLock(run_dir)
    try:
        check_resumable(run_dir, restart)  # as the lock holder sees it
        if restart:
            set_aside(run_dir, log)
        changed = check_config_change(cfg, run_dir, allow_config_change)
        if not has_checkpoint(run_dir):
            _drop_stale_tokenizer(cfg, run_dir, log)
        save_config(cfg, run_dir / "config.yaml")
        _decode_as_said(cfg, run_dir, changed, log)
        for stale in run_dir.glob(".*.tmp"):  # left by a save that was killed half-way
            stale.unlink()
    except BaseException:
        lock.release()
        raise
    return lock


def _check_files_are_files(run_dir: Path) -> None:
    """A folder (or a link to one) where the run writes a file would fail its first save, after
    the training steps before it."""
    from mt.outputs import TRAINERS_FILES

    names = TRAINERS_FILES | set(MODEL_FILES)
    for name in sorted(names):
        if (run_dir / name).is_dir():
            raise MTError(
                f"{run_dir / name} is a folder where the run keeps a file: move it out of "
                f"{run_dir}, or train into another --run-dir"
            )


def check_corpus_unchanged(cfg: Config, run_dir: Path, allow_change: bool, log) -> bool:
    """A resumed run goes on with the training files it started with: its data position (epoch,
    batch) means nothing in other files. Files changed in place are named and refused, or with
    allow_change (--allow-config-change) said: True, record them as the run's corpus."""
    path = run_dir / CORPUS_NAME
    if not has_checkpoint(run_dir) or not path.is_file():
        return False
    saved, found = _read_corpus(path), corpus_fingerprint(cfg)
    if not found or found == saved:
        return False
    changes = [
        f"{name}: {saved[name]['bytes']:,} bytes then, {now['bytes']:,} now"
        if name in saved and saved[name]["bytes"] != now["bytes"]
        else f"{name}: other content"
        for name, now in found.items()
        if saved.get(name) != now
    ]
    what = (
        f"the training files in {cfg.data.dir} changed since this run started "
        f"({'; '.join(changes)})"
    )
    if not allow_change:
        raise MTError(
            f"{what}: last.pt's place in the data refers to the old files; restore them, use "
            f"another --run-dir, or pass --allow-config-change to go on with the new files"
        )
    log(f"note: {what}: going on with the new files (--allow-config-change)")
    return True


def record_corpus(cfg: Config, run_dir: Path, renew: bool = False) -> None:
    """Remember which training files this run learns from (once its data is in place; renew:
    a resumed run that was allowed to go on with other files)."""
    path = run_dir / CORPUS_NAME
    if renew or not path.exists() or not has_checkpoint(run_dir):
        write_text(path, json.dumps(corpus_fingerprint(cfg), indent=1) + "\n")
