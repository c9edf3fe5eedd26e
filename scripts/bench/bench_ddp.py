"""The cost of an update under each gradient exchange (train.data_parallel) on several ranks:

    python scripts/bench/bench_ddp.py [--size small] [--ranks 2] [--steps 12] [--rounds 2]
    python scripts/bench/bench_ddp.py --device cuda --ranks 8 --size base   # NCCL, one GPU each

Contenders, each the step `mt train` runs (Trainer.train_step) on every rank with its own
Multi30k-like batches (contenders.py's shapes, fast paths as `mt train` chooses them):

  flat     the default: gradients as views into flat buffers, one all-reduce after the
           backward pass with the out-of-memory flag and the sums riding in it
  ddp      torch's DistributedDataParallel, bucketed all-reduces overlapping the backward pass
  copy     the exchange mt used before the flat buffers, kept here as the reference: a
           torch.cat of every gradient into a new tensor, one all-reduce, a copy back per
           parameter

Each contender runs in a fresh group of processes (gloo ranks on the CPU, NCCL ones on GPUs),
the contenders taking turns round after round, so that a drift in the machine hits all alike.
Prints the median seconds per update and the peak memory of rank 0 (the resident set on a CPU,
the allocator's peak on a GPU), with each one's ratio to `flat`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time

import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from contenders import SIZES, make_batches, mt_trainer

CONTENDERS = ("flat", "ddp", "copy")


class _Copy:
    """The exchange before the flat buffers (the reference contender), over mt's Flat: the
    gradients and sums gathered into a new tensor, all-reduced, copied back one by one, and
    the global token count read by the host."""

    def __init__(self, flat):
        self.flat = flat

    def __getattr__(self, name):
        return getattr(self.flat, name)

    def reduce(self, out_of_memory):
        parts = [p.grad for p in self.flat.params] + [self.flat.extras]
        flat = torch.cat([g.reshape(-1) for g in parts])  # the transient copy
        tdist.all_reduce(flat)
        offset = 0
        for g in parts:  # one small kernel per parameter
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        int(self.flat.extras[-1])  # (the host read of the global tokens)


def _rank(rank: int, world: int, port: int, args, mode: str, out: str) -> None:
    from mt.config import ModelConfig, TrainConfig
    from mt.data.batching import Batch
    from mt.runtime.distributed import setup, teardown

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    if args.device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist, device_name = setup(args.device)
    device = torch.device(device_name)
    size = dict(SIZES[args.size], max_tokens=args.max_tokens or SIZES[args.size]["max_tokens"])
    model_cfg = ModelConfig(
        d_model=size["d_model"], n_heads=size["heads"], enc_layers=size["layers"],
        dec_layers=size["layers"], d_ff=size["d_ff"], dropout=0.1, attn_dropout=0.0,
        tie_embeddings="all", max_positions=256,
    )  # fmt: skip
    train_cfg = TrainConfig(
        clip_norm=0.0, max_tokens=size["max_tokens"],
        data_parallel="ddp" if mode == "ddp" else "flat",
    )  # fmt: skip
    torch.manual_seed(0)
    trainer = mt_trainer(model_cfg, train_cfg, size["vocab"], device, None, dist=dist)
    if mode == "copy":
        trainer.update.exchange = _Copy(trainer.update.exchange)
    batches = [
        Batch(*(x.to(device) for x in b[:3]), b[3])
        for b in make_batches(size, args.warmup + args.steps, seed=1 + rank)
    ]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for i, batch in enumerate(batches):
        dist.barrier()
        start = time.perf_counter()
        trainer.train_step([batch])
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()  # (the slowest rank's update)
        if i >= args.warmup:
            seconds.append(time.perf_counter() - start)
    trainer.settle_skips()
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (KiB on Linux)
    if rank == 0:
        torch.save({"seconds": statistics.median(seconds), "peak_mb": peak}, out)
    teardown(dist)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=SIZES, default="small")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--steps", type=int, default=12, help="timed updates per contender and round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=0, help="0: the size's own")
    ap.add_argument("--only", default=",".join(CONTENDERS), help="contenders, comma-separated")
    args = ap.parse_args()
    modes = args.only.split(",")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in modes:
                out = f"{tmp}/{mode}{r}.pt"
                mp.spawn(_rank, args=(args.ranks, _free_port(), args, mode, out),
                         nprocs=args.ranks, join=True)  # fmt: skip
                runs[mode].append(torch.load(out))
    base = modes[0]
    sec = {m: statistics.median(x["seconds"] for x in runs[m]) for m in modes}
    mem = {m: max(x["peak_mb"] for x in runs[m]) for m in modes}
    backend = "nccl" if args.device == "cuda" else "gloo"
    print(f"{args.ranks} {backend} ranks, size {args.size}, {args.steps} updates x "
          f"{args.rounds} rounds each")  # fmt: skip
    for m in modes:
        print(f"{m:5s} {sec[m] * 1000:8.1f} ms/update  x{sec[m] / sec[base]:.2f}   "
              f"peak {mem[m]:8.0f} MB  x{mem[m] / mem[base]:.2f}  (rank 0)")  # fmt: skip


if __name__ == "__main__":
    main()
