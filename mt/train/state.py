"""The Trainer's state: the counters a checkpoint carries (TrainState), the valid split it
scores, and the window of updates between two log lines."""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import asdict, dataclass, field

import torch

from mt.config import DecodeConfig
from mt.data.corpus import ParallelData
from mt.data.textform import RAW, TextForm
from mt.train.progress import compiles_so_far


@dataclass
class TrainState:
    step: int = 0  # optimizer updates done
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of `epoch` already consumed (exact resume)
    best_bleu: float = -1.0
    bad_validations: int = 0  # validations since the best one (early stopping)
    train_seconds: float = 0.0
    nonfinite_in_a_row: int = 0
    oom_skipped: int = 0  # updates dropped after running out of memory (any rank)
    fp16_skipped: int = 0  # updates the fp16 GradScaler skipped (inf/NaN gradients)
    # what training last computed in ("fp32", "bf16", "fp16"): train.precision "auto"
    # resolved on the device it ran on, so that decoding can follow the run, not its config
    precision: str = ""
    # train.bidirectional_share: whether `epoch` trains on both directions (decided when it
    # began, so a run resumed inside the epoch walks the same batches)
    both_directions: bool = False
    # what is trained: "translation" (mt train) or "masked_lm" (mt pretrain's encoder)
    objective: str = "translation"
    # which run this is: drawn when it starts, kept when it resumes, so that its snapshots are
    # told from another run's of the same shape (mt average)
    run_id: str = field(default_factory=lambda: secrets.token_hex(8))
    # the end of the run (final validation, averaging, tuning) ran at `step`: a re-run of the
    # same budget has nothing to do
    finished: bool = False

    def state_dict(self) -> dict:
        return asdict(self)


@dataclass
class Validation:
    src: list[str]  # raw source lines
    refs: list[str]  # the references, as translations are written (TextForm.references)
    data: ParallelData  # the same pairs as token ids, for the loss
    beam: int
    decode: DecodeConfig  # how it is decoded, and the grid tuned on it at the end
    # several language pairs: ((pair, its lines), ...) in the order src and refs hold them
    pairs: tuple[tuple[str, int], ...] = ()
    best_by: str = "mean"  # train.best_by: the BLEU best.pt follows, "mean" or one pair's
    text: TextForm = RAW  # data.text: how sources are read and translations written


@dataclass
class LogWindow:
    """The updates since the last log line: each one's loss and NLL sums and target tokens
    over every rank, on the device (zero for an update skipped there); the seconds they took
    with the validations between them left out, and the graphs torch.compile made meanwhile."""

    sums: list = field(default_factory=list)  # (loss, nll, tokens) per update
    start: float = field(default_factory=time.perf_counter)
    paused: float = 0.0  # seconds of the window spent validating, not training
    compiles_at_start: int = field(default_factory=compiles_so_far)

    def add(self, row: torch.Tensor) -> None:
        """row: an update's (loss sum, NLL sum, tokens) over every rank (zeros if skipped on
        the device; mt/train/update/exchange.py)."""
        self.sums.append(row)

    def pause(self, seconds: float) -> None:
        """`seconds` of the window went to a validation: not training time."""
        self.paused += seconds

    def summary(self) -> dict:
        """Mean loss, NLL and perplexity per target token, tokens/s and the training seconds
        over every rank (the only host sync of the window); `compiles`: the graphs made in
        the window, where there were any (its seconds include their compiling)."""
        seconds = max(time.perf_counter() - self.start - self.paused, 1e-9)
        compiles = compiles_so_far() - self.compiles_at_start
        loss_sum, nll_sum, tokens = torch.stack(self.sums).sum(0).tolist()
        timing = {"seconds": round(seconds, 3), **({"compiles": compiles} if compiles else {})}
        if not tokens:  # every update of the window skipped
            return {"tokens": 0, "tok_s": 0.0, **timing}
        loss, nll = loss_sum / tokens, nll_sum / tokens
        return {
            "loss": round(loss, 4),
            "nll": round(nll, 4),
            "ppl": round(math.exp(min(nll, 50)), 2),
            "tok_s": round(tokens / seconds, 1),
            "tokens": int(tokens),
            **timing,
        }
