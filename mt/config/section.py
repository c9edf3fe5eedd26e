"""What every section of the run configuration shares: unknown keys and wrong types refused,
values frozen once read."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def no_number(v: Any) -> Any:
    """A Literal of True/False also takes 1 and 0 (1 == True), which strict mode refuses for
    every other boolean key."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        raise ValueError(f"expected 'auto', true or false, not the number {v!r}")
    return v
