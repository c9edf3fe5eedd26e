"""The cost of an R-Drop training step (train.rdrop_alpha > 0) against the plain step, on the
shipped Multi30k shape (4+4 layers, d_model 128, FFN 256, 5k vocabulary) and 8,192-token
batches of caption-length sentences:

    python scripts/bench_rdrop.py [--steps 10] [--rounds 3]

Three losses take turns step by step in one process (so a drift in the machine's speed hits
all alike): the plain fused loss (mt.fast.chunked_loss), R-Drop as the paper writes it (two
passes, full logits and their KL: mt.loss.rdrop_loss) and the fused R-Drop
(mt.fast.chunked_rdrop_loss, what `mt train` uses with the fast paths). Prints seconds per
step and each one's ratio to the plain step; R-Drop's floor is 2x (every batch twice)."""
from __future__ import annotations

import argparse
import functools
import time

import torch

from mt import fast
from mt.config import ModelConfig
from mt.data.batching import Batch
from mt.loss import rdrop_loss
from mt.model import build_model
from mt.tokens import BOS, EOS, PAD


def make_batch(g: torch.Generator, max_tokens: int, vocab: int) -> Batch:
    """Sentences of 10-18 tokens, source and target, padded to the longest: about max_tokens
    source + target tokens, as mt's batches of Multi30k captions hold."""
    n = max_tokens // 28
    lens = torch.randint(10, 19, (n, 2), generator=g)
    src = torch.full((n, int(lens[:, 0].max()) + 1), PAD)
    tgt = torch.full((n, int(lens[:, 1].max()) + 2), PAD)
    for i, (ls, lt) in enumerate(lens.tolist()):
        src[i, :ls] = torch.randint(4, vocab, (ls,), generator=g)
        src[i, ls] = EOS
        tgt[i, 0] = BOS
        tgt[i, 1:lt + 1] = torch.randint(4, vocab, (lt,), generator=g)
        tgt[i, lt + 1] = EOS
    return Batch(src, tgt[:, :-1], tgt[:, 1:], int((tgt[:, 1:] != PAD).sum()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=2.5)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = fast.install(build_model(ModelConfig(d_model=128, n_heads=4, enc_layers=4,
                                                 dec_layers=4, d_ff=256, dropout=0.3,
                                                 attn_dropout=0.0, tie_embeddings="all"),
                                     5000, 5000)).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    losses = {"plain (fused)": fast.chunked_loss,
              "R-Drop, reference": functools.partial(rdrop_loss, alpha=args.alpha),
              "R-Drop, fused": functools.partial(fast.chunked_rdrop_loss, alpha=args.alpha)}
    g = torch.Generator().manual_seed(0)
    batches = [make_batch(g, 8192, 5000) for _ in range(args.steps)]
    times = {name: 0.0 for name in losses}

    def step(fn, batch):
        opt.zero_grad(set_to_none=True)
        loss, _ = fn(model, batch, 0.1)
        (loss / batch.n_tokens).backward()
        opt.step()
    for fn in losses.values():                       # warm-up: allocator, thread pools
        step(fn, batches[0])
    for r in range(args.rounds):
        order = list(losses.items())
        for batch in batches:
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                step(fn, batch)
                times[name] += time.perf_counter() - t0
    n = args.rounds * args.steps
    plain = times["plain (fused)"] / n
    print(f"{torch.get_num_threads()} threads, {n} steps each, "
          f"{sum(b.n_tokens for b in batches) // len(batches)} target tokens per batch")
    for name, total in times.items():
        print(f"{name:20s} {total / n:.3f} s/step  x{total / n / plain:.2f} the plain step")


if __name__ == "__main__":
    main()
