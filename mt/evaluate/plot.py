"""The training curve as a picture: training and validation loss, validation BLEU, by step."""

from __future__ import annotations

import json
from pathlib import Path

from mt.errors import MTError
from mt.outputs import atomic_file, picture_format


def read_log(run_dir: Path) -> list[dict]:
    path = run_dir / "train_log.jsonl"
    if not path.is_file():
        raise MTError(f"{path} not found: is {run_dir} a run directory made by mt train?")
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines):  # (a run killed mid-line: the training resumed rewrites it)
                break
            raise MTError(
                f"{path}:{i}: not a JSON line (the log is damaged): delete or mend that line"
            ) from None
    return records


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Draw training_figure into `out` (default RUN_DIR/training.png)."""
    fig = training_figure(run_dir)
    out = out or run_dir / "training.png"
    with atomic_file(out) as f:
        fig.savefig(f, format=picture_format(out), dpi=100)
    return out


def training_figure(run_dir: Path):
    """Training and validation loss, and validation BLEU (best.pt marked), by step. A
    Figure of its own, not pyplot's: pyplot's global state is not for threads, and a
    training draws this on one (mt/train/finish.py)."""
    from matplotlib.figure import Figure

    records = read_log(run_dir)
    train = [r for r in records if "loss" in r]
    valid = [r for r in records if "valid_loss" in r]
    scored = [r for r in records if "valid_bleu" in r]  # validations and averages
    # a single point is drawn as a marker: a line needs two
    line = "o-" if len(train) < 2 else "-"
    fig = Figure(figsize=(11, 4))
    ax_loss, ax_bleu = fig.subplots(1, 2)
    _losses(ax_loss, train, valid, line)
    _bleu(ax_bleu, valid, scored)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    return fig


def _losses(ax, train: list[dict], valid: list[dict], line: str) -> None:
    """The left panel: training loss and NLL, validation loss, by step."""
    ax.plot(
        [r["step"] for r in train], [r["loss"] for r in train], line, label="train loss (smoothed)"
    )
    ax.plot(
        [r["step"] for r in train], [r["nll"] for r in train], line, label="train NLL", alpha=0.6
    )
    ax.plot([r["step"] for r in valid], [r["valid_loss"] for r in valid], "o-", label="valid loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss per target token")
    if train or valid:
        ax.legend()
    ax.grid(alpha=0.3)


def _bleu(ax, valid: list[dict], scored: list[dict]) -> None:
    """The right panel: validation BLEU, the averages of snapshots, best.pt's point."""
    ax.plot(
        [r["step"] for r in valid],
        [r["valid_bleu"] for r in valid],
        "o-",
        color="C3",
        label="validation",
    )
    averaged = [r for r in scored if "averaged" in r]
    if averaged:
        ax.plot(
            [r["step"] for r in averaged],
            [r["valid_bleu"] for r in averaged],
            "s",
            color="C2",
            label="average of snapshots",
        )
    best = [r for r in scored if r.get("best")]
    if best:  # the last record marked best is what best.pt holds
        b = best[-1]
        ax.plot(
            [b["step"]],
            [b["valid_bleu"]],
            "*",
            color="gold",
            markersize=16,
            markeredgecolor="black",
            label=f"best.pt: {b['valid_bleu']:.2f}",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("validation BLEU")
    if scored:
        ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
