"""The environment variables mt reads, each checked the same way: a value that is not what
the variable takes is a one-line error naming the variable and what it takes.

    MT_THREADS                      CPU threads (0 or unset: chosen from the free cores)
    WORLD_SIZE, RANK, LOCAL_RANK,   set by torchrun for each process of a multi-process run
    LOCAL_WORLD_SIZE
"""

from __future__ import annotations

import os

from mt.errors import MTError


def env_int(name: str, default: int, minimum: int = 0, means: str = "") -> int:
    """The whole number in environment variable `name` (unset or empty: `default`)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        what = f" ({means})" if means else ""
        raise MTError(
            f"environment variable {name}={text!r}: give a whole number >= {minimum}{what}, "
            f"or unset it"
        )
    return value


def check_environment() -> None:
    """Every variable above, checked before a command starts its work."""
    env_int("MT_THREADS", 0, means="CPU threads; 0: chosen for you")
    env_int("WORLD_SIZE", 1, minimum=1, means="processes, set by torchrun")
    for name in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env_int(name, 0, means="set by torchrun")
