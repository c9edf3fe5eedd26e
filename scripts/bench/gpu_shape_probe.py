"""Why a GPU's first training steps are slow: each step of mt's training (contenders.py's `ours`,
bf16) on batches of new shapes, then again on the same batches, under three choices of
attention kernels, each in a fresh process (kernel and plan caches live per process).

    python scripts/bench/gpu_shape_probe.py [--size tiny|base] [--batches 12]

On an H100 the shipped Multi30k config trained about 4 updates/s for its first ~1.5 epochs and
21/s after (docs/gpu.md). If the first sight of a shape is what costs, the first column is far
above the second; if one attention backend is the cause, its row alone shows it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
from contenders import device_batches, ours, size_of
from harness import sync

SETTINGS = {
    "default": {},
    "no cuDNN attention": {"cudnn": False},
    "math attention only": {"cudnn": False, "flash": False, "mem_efficient": False},
}


def worker(args) -> dict:
    for backend, on in SETTINGS[args.setting].items():
        getattr(torch.backends.cuda, f"enable_{backend}_sdp")(on)
    device = torch.device("cuda")
    size = size_of(args.size, args.max_tokens)
    batches = device_batches(size, args.batches, device)
    torch.manual_seed(0)
    _, step = ours(size, device, "bf16")
    seconds = {"first": [], "again": []}
    for sight in seconds:
        for b in batches:
            sync(device)
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                step(b)
            sync(device)
            seconds[sight].append(time.perf_counter() - t0)
    shapes = len({tuple(b[0].shape) + tuple(b[1].shape) for b in batches})
    return {"shapes": shapes, **{k: statistics.median(v[1:]) for k, v in seconds.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", choices=["tiny", "small", "base"], default="tiny")
    ap.add_argument("--max-tokens", type=int, default=0)
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--setting", choices=list(SETTINGS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.setting:
        print(json.dumps(worker(args)))
        return
    if not torch.cuda.is_available():
        raise SystemExit("gpu_shape_probe.py needs a CUDA GPU")
    print(
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, size {args.size}, "
        f"{args.batches} batches (medians over all but the first)"
    )
    print(
        f"{'attention kernels':22}{'shapes':>7}{'first sight ms':>16}{'again ms':>10}{'ratio':>7}"
    )
    for name in SETTINGS:
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--setting",
                name,
                "--size",
                args.size,
                "--batches",
                str(args.batches),
                *(["--max-tokens", str(args.max_tokens)] if args.max_tokens else []),
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            print(f"{name:22} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(
            f"{name:22}{r['shapes']:>7}{r['first'] * 1e3:>16.1f}{r['again'] * 1e3:>10.1f}"
            f"{r['first'] / r['again']:>7.1f}"
        )


if __name__ == "__main__":
    main()
