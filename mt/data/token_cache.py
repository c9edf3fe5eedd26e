"""The training split's token ids, written once into a cache folder of mt's and memory-mapped
by every run and every rank that trains on the same files with the same BPE model.

A corpus of WMT's size (4.5M pairs) takes minutes to tokenize and about 250 MB of ids; with the
cache a second run starts in seconds, and the ranks of one machine share one copy of the ids
through the page cache instead of holding one each. The key is the training files (their
sizes, modification times and a hash of their first and last MiB), the BPE model's bytes,
data.max_len and the cache format; a changed file, another BPE model or another max_len is
another key. The folder is `MT_CACHE_DIR`, else `$XDG_CACHE_HOME/mt`, else `~/.cache/mt`;
never the user's corpus folder. A folder appears whole or not at all (written to a temporary
name and renamed).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mt.data.corpus import ParallelData, Stats, TokenArray
from mt.runtime.env import cache_root

FORMAT = 1
# data.token_cache auto: the training files at least this large (WMT14 en-de: 1.4 GB)
AUTO_BYTES = 100 * 2**20
_ARRAYS = ("data", "lengths", "offsets")


def wanted(setting: str | bool, paths: Sequence[Path]) -> bool:
    """data.token_cache: true, false, or auto (training files of AUTO_BYTES or more)."""
    if setting != "auto":
        return setting is True
    return sum(Path(p).stat().st_size for p in paths) >= AUTO_BYTES


def cache_key(paths: Sequence[Path], tokenizer_bytes: list[bytes], max_len: int) -> str:
    h = hashlib.sha256(f"mt token cache {FORMAT} max_len {max_len}".encode())
    for path in paths:
        st = Path(path).stat()
        h.update(f"{Path(path).name} {st.st_size} {st.st_mtime_ns}".encode())
        with open(path, "rb") as f:
            h.update(f.read(2**20))
            if st.st_size > 2**20:
                f.seek(max(st.st_size - 2**20, 2**20))
                h.update(f.read())
    for model in tokenizer_bytes:
        h.update(hashlib.sha256(model).digest())
    return h.hexdigest()[:32]


def folder_for(key: str) -> Path:
    return cache_root() / "tokens" / key


def load(folder: Path) -> ParallelData | None:
    """The cached ids, memory-mapped read-only; None when the folder is absent or incomplete."""
    if not (folder / "stats.json").is_file():
        return None
    sides = []
    for side in ("src", "tgt"):
        arrays = [np.load(folder / f"{side}.{name}.npy", mmap_mode="r") for name in _ARRAYS]
        sides.append(TokenArray.from_arrays(*arrays))
    stats = Stats(**json.loads((folder / "stats.json").read_text(encoding="utf-8")))
    return ParallelData(sides[0], sides[1], stats)


def save(folder: Path, data: ParallelData) -> None:
    """Write the ids into `folder` whole: into a temporary folder beside it, then renamed (a
    concurrent writer of the same key loses the race harmlessly)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        for side, arr in (("src", data.src), ("tgt", data.tgt)):
            for name in _ARRAYS:
                np.save(tmp / f"{side}.{name}.npy", np.ascontiguousarray(getattr(arr, name)))
        stats = {k: v for k, v in vars(data.stats).items() if isinstance(v, int)}
        (tmp / "stats.json").write_text(json.dumps(stats) + "\n", encoding="utf-8")
        try:
            tmp.rename(folder)
        except OSError:  # another process wrote the same key meanwhile: keep theirs
            if not (folder / "stats.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
