"""The run's log: one JSON object per event in train_log.jsonl (what `mt plot` and resuming
read), and the same scalars as TensorBoard event files when train.tensorboard is on (through
torch.utils.tensorboard, the optional `tensorboard` extra); and run_info.json, what produced
the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from mt.errors import MTError
from mt.outputs import describe_write_error, write_text


class RunLog:
    def __init__(self, run_dir: Path, tensorboard: bool = False):
        self.path = run_dir / "train_log.jsonl"
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise MTError(
                    "train.tensorboard needs the tensorboard package: "
                    "pip install 'mt[tensorboard]' (or set train.tensorboard: false)"
                ) from None
            self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def write(self, record: dict) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:  # a full disk: one line naming the log, not a traceback
            raise MTError(describe_write_error(self.path, e)) from None
        if self.writer is not None:
            for tag, value in scalars(record):
                self.writer.add_scalar(tag, value, record.get("step", 0))
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def scalars(record: dict) -> list[tuple[str, float]]:
    """The record's numbers as TensorBoard tags: train/loss, valid/bleu, averaged/valid_bleu,
    tune/beam_5_length_penalty_1.0, skipped/out of memory, ..."""
    if "grid" in record:  # the decoding tuning grid: tune/beam_5_length_penalty_1.0, ...
        return [
            (
                "tune/" + "_".join(f"{k}_{v}" for k, v in g.items() if k != "valid_bleu"),
                g["valid_bleu"],
            )
            for g in record["grid"]
        ]
    if "skipped" in record:
        return [(f"skipped/{record['skipped']}", 1.0)]
    group = (
        "averaged"
        if "averaged" in record
        else "valid"
        if any(k.startswith("valid_") for k in record)
        else "train"
    )
    out = []
    for key, value in record.items():
        if (
            key in ("step", "best", "averaged")
            or isinstance(value, bool)
            or not isinstance(value, (int, float))
        ):
            continue
        name = key.removeprefix("valid_") if group == "valid" else key
        out.append((f"{group}/{name}", float(value)))
    return out


def say(is_main: bool, msg: str) -> None:
    """A line for the user, from rank 0 (beside the progress bar)."""
    if is_main:
        tqdm.write(msg, file=sys.stderr)


def discard(record: dict) -> None:
    """The log of a rank other than 0: rank 0 alone writes train_log.jsonl."""


def write_run_info(run_dir: Path, vocab: tuple[int, int] | None = None) -> None:
    """What produced this run: versions, git commit, device (for reproducing it); vocab: the
    BPE model's real (source, target) sizes, which tokenizer.vocab_size only bounds."""
    import platform
    import subprocess

    import torch

    import mt

    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).parent,
                timeout=10,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    info = {
        "mt_version": mt.__version__,
        "git_commit": commit,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "argv": sys.argv,
    }
    if vocab is not None:
        info["vocab_size"] = {"source": vocab[0], "target": vocab[1]}
    write_text(run_dir / "run_info.json", json.dumps(info, indent=1) + "\n")
