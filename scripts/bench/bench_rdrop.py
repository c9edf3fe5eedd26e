"""The cost of an R-Drop training step (train.rdrop_alpha > 0) against the plain step, on the
shipped Multi30k shape (contenders.py's "tiny" size: 4+4 layers, d_model 128, FFN 256, 5k
vocabulary, dropout 0.3 as in configs/multi30k_*.yaml) and its Multi30k-like 8,192-token batches:

    python scripts/bench/bench_rdrop.py [--steps 30] [--alpha 2.5]

Every contender is contenders.py's `ours`, the step `mt train` runs (Trainer.train_step), with one
of three losses: the plain fused loss (mt.fast.chunked_loss), R-Drop as the paper writes it (two
passes, full logits and their KL: mt.objectives.loss.rdrop_loss) and the fused R-Drop
(mt.fast.chunked_rdrop_loss, what `mt train` uses with the fast paths). They take turns batch by
batch in one process (contenders.interleaved_seconds), so a drift in the machine's speed hits all
alike. Prints seconds per step and each one's ratio to the plain step; R-Drop's floor is 2x
(every batch goes through the model twice)."""

from __future__ import annotations

import argparse
import functools

import torch
from contenders import SIZES, interleaved_seconds, ours

from mt import fast
from mt.objectives.loss import rdrop_loss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30, help="timed steps of each loss")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=2.5)
    args = ap.parse_args()
    size, cpu = SIZES["tiny"], torch.device("cpu")
    contenders = {
        "plain (fused)": functools.partial(ours, dropout=0.3),
        "R-Drop, reference": functools.partial(
            ours, dropout=0.3, loss_fn=functools.partial(rdrop_loss, alpha=args.alpha)
        ),
        "R-Drop, fused": functools.partial(
            ours, dropout=0.3, loss_fn=functools.partial(fast.chunked_rdrop_loss, alpha=args.alpha)
        ),
    }
    secs, tokens = interleaved_seconds(size, args.steps, args.warmup, cpu, "fp32", contenders)
    plain = secs["plain (fused)"]
    print(
        f"{torch.get_num_threads()} threads, {args.steps} steps each, "
        f"{tokens // args.steps} target tokens per batch"
    )
    for name, sec in secs.items():
        print(f"{name:20s} {sec / args.steps:.3f} s/step  x{sec / plain:.2f} the plain step")


if __name__ == "__main__":
    main()
