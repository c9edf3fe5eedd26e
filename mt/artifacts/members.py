"""A run of several members (train.members): RUN_DIR/ensemble.json names the member runs
(RUN_DIR/member1, ...), their seeds, and the decoding tuned for them together; every command
that translates takes RUN_DIR as the ensemble of the members' checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mt.errors import MTError

ENSEMBLE_FILE = "ensemble.json"


def member_name(k: int) -> str:
    """The folder of member k (1-based) inside the run directory."""
    return f"member{k}"


def manifest(run_dir: str | Path) -> dict[str, Any] | None:
    """RUN_DIR/ensemble.json's contents, or None where RUN_DIR is not a run of members."""
    path = Path(run_dir) / ENSEMBLE_FILE
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        names = found["members"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TypeError("members")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MTError(
            f"{path} is damaged ({type(e).__name__}: {e}); it names the members of the run: "
            f"write it again with the same mt train command (the members' files are kept)"
        ) from None
    return dict(found)


def write_manifest(run_dir: Path, record: dict[str, Any]) -> None:
    from mt.outputs import write_text

    write_text(run_dir / ENSEMBLE_FILE, json.dumps(record, indent=1) + "\n")


def member_dirs(run_dir: str | Path) -> list[Path] | None:
    """The member runs of RUN_DIR, in order, or None where it is not a run of members."""
    found = manifest(run_dir)
    return None if found is None else [Path(run_dir) / n for n in found["members"]]


def tuned_decoding(checkpoints: list[Path]) -> dict[str, Any] | None:
    """The decoding tuned for an ensemble run, where `checkpoints` are exactly its members'
    (one each, in order, as the run directory resolves them); else None: the first model's
    own settings apply, as for any ensemble made by hand."""
    if len(checkpoints) < 2:
        return None
    run_dir = checkpoints[0].parent.parent
    found = manifest(run_dir) if run_dir != checkpoints[0].parent else None
    if found is None or not found.get("decoding"):
        return None
    dirs = [(run_dir / n).resolve() for n in found["members"]]
    if [p.parent.resolve() for p in checkpoints] != dirs:
        return None
    return dict(found["decoding"])
