"""What every section of the run configuration shares: unknown keys and wrong types refused,
values frozen once read."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict

# the bound on every count of updates (steps, warmup, intervals): far beyond any training, and
# a value past it (a long digit string) is a one-line error instead of an overflow
STEPS = 1 << 40


class Section(BaseModel):
    # (allow_inf_nan: a NaN or an infinity is never a setting, and would pass a key's bounds
    # where it has none)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def no_number(v: Any) -> Any:
    """A Literal of True/False also takes 1 and 0 (1 == True), which strict mode refuses for
    every other boolean key."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        raise ValueError(f"expected 'auto', true or false, not the number {v!r}")
    return v


def user_path(v: Any) -> Any:
    """A path as the user meant it: `~` expanded (the shell leaves it alone after `=`, as in
    --set data.dir=~/corpus); empty, or naming a folder literally called `~`, refused."""
    if not isinstance(v, str):
        return v
    if not v.strip():
        raise ValueError("an empty path (an unset shell variable?): give a file or folder")
    expanded = os.path.expanduser(v)
    if "~" in expanded.split(os.sep):
        raise ValueError(
            f"{v!r} has a folder named '~' that is not your home folder: write the path "
            f"out, or start it with ~/"
        )
    return expanded
