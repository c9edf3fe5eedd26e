"""The environment variables mt reads, each checked the same way: a value that is not what
the variable takes is a one-line error naming the variable and what it takes.

    MT_THREADS                      CPU threads (0 or unset: chosen from the free cores)
    WORLD_SIZE, RANK, LOCAL_RANK,   set by torchrun for each process of a multi-process run
    LOCAL_WORLD_SIZE
    MT_API_KEY                      mt serve: the token requests must carry (text)
    MT_CACHE_DIR                    the token cache's folder (text; mt/data/token_cache.py)
"""

from __future__ import annotations

import os

from mt.errors import MTError

# name -> (default when unset, smallest value, what it means)
VARIABLES = {
    "MT_THREADS": (0, 0, "CPU threads; 0: chosen for you"),
    "WORLD_SIZE": (1, 1, "processes, set by torchrun"),
    "RANK": (0, 0, "this process's rank, set by torchrun"),
    "LOCAL_RANK": (0, 0, "set by torchrun"),
    "LOCAL_WORLD_SIZE": (0, 0, "set by torchrun"),
}


# text variables: name -> what it is
TEXT_VARIABLES = {
    "MT_API_KEY": "mt serve: the token every /translate and /info request must carry "
    "(the same as --api-key)",
    "MT_CACHE_DIR": "where the token cache lives (data.token_cache); unset: "
    "$XDG_CACHE_HOME/mt, else ~/.cache/mt",
}


def env_int(name: str) -> int:
    """The whole number in environment variable `name` (one of VARIABLES; unset or empty: its
    default)."""
    default, minimum, means = VARIABLES[name]
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise MTError(
            f"environment variable {name}={text!r}: give a whole number >= {minimum} ({means}), "
            f"or unset it"
        )
    return value


def check_environment() -> None:
    """Every variable mt reads, checked before a command starts its work."""
    for name in VARIABLES:
        env_int(name)
