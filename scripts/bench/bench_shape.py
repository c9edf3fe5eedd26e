"""Cost per update of model shapes against the shipped one, on the same batches, in one process
taking turns batch by batch (so a drift in the machine's speed cannot bias the ratios). For
recipe choices that trade depth or width at a fixed CPU budget (docs/multi30k_recipe.md).

    python scripts/bench/bench_shape.py --shape 6+2 --shape 7+2 --shape 4+4:heads=2 [--steps 60]

A shape is ENC+DEC layers, optionally followed by :key=value pairs (heads, d_ff, d_model,
vocab) changing the shipped Multi30k shape (bench_train.py's "tiny": 4+4 layers, d_model 128,
4 heads, FFN 256, 5k vocabulary, 8,192 tokens a batch). Prints milliseconds per update and each
shape's cost as a ratio of the shipped shape's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import SIZES, make_batches, ours
from harness import take_turns

SHIPPED = "4+4"


def parse_shape(text: str) -> dict:
    layers, _, rest = text.partition(":")
    enc, dec = (int(x) for x in layers.split("+"))
    size = dict(SIZES["tiny"], enc_layers=enc, dec_layers=dec)
    for pair in filter(None, rest.split(",")):
        key, value = pair.split("=")
        size[key] = int(value)
    return size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    names = [SHIPPED] + [s for s in args.shape if s != SHIPPED]
    sizes = {n: parse_shape(n) for n in names}
    vocabs = {s["vocab"] for s in sizes.values()}
    batches = make_batches(dict(SIZES["tiny"], vocab=min(vocabs)), args.warmup + args.steps)
    steps = {}
    for n, size in sizes.items():
        torch.manual_seed(0)
        model, step = ours(size, torch.device("cpu"), dropout=0.2)
        steps[n] = step
        print(
            f"{n}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters", flush=True
        )
    secs = take_turns(steps, batches, args.warmup, torch.device("cpu"))
    base = secs[SHIPPED]
    for n in names:
        print(
            f"{n}: {secs[n] / args.steps * 1000:.0f} ms per update, "
            f"{secs[n] / base:.3f}x the shipped {SHIPPED}'s cost"
        )


if __name__ == "__main__":
    main()
