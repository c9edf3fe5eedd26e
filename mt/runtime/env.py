"""The environment variables mt reads, each checked the same way: a value that is not what
the variable takes is a one-line error naming the variable and what it takes.

    MT_THREADS                      CPU threads (0 or unset: chosen from the free cores)
    WORLD_SIZE, RANK, LOCAL_RANK,   set by torchrun for each process of a multi-process run
    LOCAL_WORLD_SIZE, MASTER_PORT
    MT_API_KEY                      mt serve: the token requests must carry (text)
    MT_CACHE_DIR                    the token cache's folder (text; mt/data/token_cache.py),
                                    and Inductor's compiled kernels' (inductor/ in it)
"""

from __future__ import annotations

import os
from pathlib import Path

from mt.errors import MTError, shorten

# (a bound on counts of processes and threads: no machine or cluster has more, and a digit
# string of any length stays one line)
_MANY = 2**20
# name -> (default when unset, smallest value, largest value, what it means)
VARIABLES = {
    "MT_THREADS": (0, 0, _MANY, "CPU threads; 0: chosen for you"),
    "WORLD_SIZE": (1, 1, _MANY, "processes, set by torchrun"),
    "RANK": (0, 0, _MANY - 1, "this process's rank, set by torchrun"),
    "LOCAL_RANK": (0, 0, _MANY - 1, "this process's rank on its machine, set by torchrun"),
    "LOCAL_WORLD_SIZE": (0, 0, _MANY, "processes on this machine, set by torchrun"),
    "MASTER_PORT": (29500, 1, 65535, "the TCP port of rank 0's store, set by torchrun"),
}


# text variables: name -> what it is
TEXT_VARIABLES = {
    "MT_API_KEY": "mt serve: the token every /translate and /info request must carry "
    "(the same as --api-key)",
    "MT_CACHE_DIR": "where the token cache and compiled kernels live (data.token_cache, "
    "torch.compile); unset: $XDG_CACHE_HOME/mt, else ~/.cache/mt",
}


def env_int(name: str) -> int:
    """The whole number in environment variable `name` (one of VARIABLES; unset or empty: its
    default)."""
    default, minimum, maximum, means = VARIABLES[name]
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    value = int(text) if text.isascii() and text.lstrip("-").isdigit() and len(text) < 20 else None
    if value is None or not minimum <= value <= maximum:
        raise MTError(
            f"environment variable {name}={shorten(text)!r}: give a whole number from {minimum} to "
            f"{maximum} ({means}), or unset it"
        )
    return value


def check_environment() -> None:
    """Every variable mt reads, checked before a command starts its work."""
    for name in VARIABLES:
        if name != "MASTER_PORT" or env_int("WORLD_SIZE") > 1:  # (read only by a group)
            env_int(name)


def cache_root() -> Path:
    """mt's cache folder: MT_CACHE_DIR, else $XDG_CACHE_HOME/mt, else ~/.cache/mt."""
    explicit = os.environ.get("MT_CACHE_DIR", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mt"


def use_compile_cache() -> None:
    """torch.compile's kernels (Inductor's FX graph and autograd caches) kept in mt's cache
    folder, so that a later run compiles the same graphs from disk in seconds (Inductor's own
    default is a folder in /tmp, which a reboot empties); TORCHINDUCTOR_CACHE_DIR, where the
    user set it, is kept."""
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor")
