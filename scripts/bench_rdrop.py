"""The cost of an R-Drop training step (train.rdrop_alpha > 0) against the plain step, on the
shipped Multi30k shape (bench_train.py's "tiny" size: 4+4 layers, d_model 128, FFN 256, 5k
vocabulary) and its Multi30k-like 8,192-token batches:

    python scripts/bench_rdrop.py [--steps 30] [--alpha 2.5]

Three losses take turns batch by batch in one process (harness.take_turns, so a drift in the
machine's speed hits all alike): the plain fused loss (mt.fast.chunked_loss), R-Drop as the
paper writes it (two passes, full logits and their KL: mt.loss.rdrop_loss) and the fused
R-Drop (mt.fast.chunked_rdrop_loss, what `mt train` uses with the fast paths). Prints seconds
per step and each one's ratio to the plain step; R-Drop's floor is 2x (every batch twice)."""
from __future__ import annotations

import argparse
import functools

import torch

from bench_train import PAD, SIZES, make_batches
from harness import take_turns
from mt import fast
from mt.config import ModelConfig
from mt.data.batching import Batch
from mt.loss import rdrop_loss
from mt.model import build_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30, help="timed steps of each loss")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=2.5)
    args = ap.parse_args()
    size = SIZES["tiny"]
    torch.manual_seed(0)
    model = fast.install(build_model(
        ModelConfig(d_model=size["d_model"], n_heads=size["heads"], enc_layers=size["layers"],
                    dec_layers=size["layers"], d_ff=size["d_ff"], dropout=0.3,
                    attn_dropout=0.0, tie_embeddings="all", max_positions=256),
        size["vocab"], size["vocab"])).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    batches = [Batch(src, tgt_in, tgt_out, int((tgt_out != PAD).sum()))
               for src, tgt_in, tgt_out in make_batches(size, args.warmup + args.steps)]

    def stepper(loss_fn):
        def step(batch):
            opt.zero_grad(set_to_none=True)
            loss, _ = loss_fn(model, batch, 0.1)
            (loss / batch.n_tokens).backward()
            opt.step()
        return step
    runners = {"plain (fused)": stepper(fast.chunked_loss),
               "R-Drop, reference": stepper(functools.partial(rdrop_loss, alpha=args.alpha)),
               "R-Drop, fused": stepper(functools.partial(fast.chunked_rdrop_loss,
                                                          alpha=args.alpha))}
    secs = take_turns(runners, batches, args.warmup, torch.device("cpu"))
    plain = secs["plain (fused)"] / args.steps
    timed = batches[args.warmup:]
    print(f"{torch.get_num_threads()} threads, {args.steps} steps each, "
          f"{sum(b.n_tokens for b in timed) // len(timed)} target tokens per batch")
    for name, total in secs.items():
        print(f"{name:20s} {total / args.steps:.3f} s/step  "
              f"x{total / args.steps / plain:.2f} the plain step")


if __name__ == "__main__":
    main()
