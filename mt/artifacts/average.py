"""`mt average`: the element-wise mean of a run's checkpoints, refused across runs or shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mt.artifacts import checkpoint
from mt.errors import MTError


def average(paths: list[Path]) -> dict[str, Any]:
    """Element-wise mean of the model weights of `paths` (Vaswani et al. 2017 average the last
    5 or 20 checkpoints); config, tokenizer and counters come from the last one."""
    if not paths:
        raise MTError("no checkpoints to average")
    ckpts = [checkpoint.load(p) for p in paths]
    last = ckpts[-1]
    for p, c in zip(paths, ckpts, strict=True):
        if (
            c["config"]["model"] != last["config"]["model"]
            or c["model"].keys() != last["model"].keys()
        ):
            raise MTError(
                f"{p} has a different model than {paths[-1]}: only checkpoints of one "
                f"run can be averaged"
            )
        other = _other_run(c, last)
        if other:
            raise MTError(
                f"{p} comes from another run than {paths[-1]} ({other}): the weights of two "
                f"runs do not average into a model; move it out of the folder, or average "
                f"fewer (--last)"
            )
    avg = {}
    for key, value in last["model"].items():
        if value.is_floating_point():
            total = sum(c["model"][key].double() for c in ckpts)
            avg[key] = (total / len(ckpts)).to(value.dtype)
        else:
            avg[key] = value
    return {
        "format_version": checkpoint.FORMAT_VERSION,
        "config": last["config"],
        "model": avg,
        "spm": last["spm"],
        "train_state": last.get("train_state", {}),
        "averaged_from": [Path(p).name for p in paths],
    }


def _other_run(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """How two checkpoints show they come from different runs (their run ids; for those saved
    before runs had one, their seeds, data or BPE models); None if they may be one run's."""
    ids = a.get("train_state", {}).get("run_id"), b.get("train_state", {}).get("run_id")
    if all(ids):
        return None if ids[0] == ids[1] else f"run {ids[0]} against {ids[1]}"
    for section, key in (("train", "seed"), ("data", "dir"), ("data", "src_lang")):
        x, y = a["config"][section].get(key), b["config"][section].get(key)
        if x != y:
            return f"{section}.{key} {x!r} against {y!r}"
    return None if checkpoint.same_tokenizer(a, b) else "another BPE model"
