"""Training throughput of mt's model and train step against two references, same batches:
(a) a plain loop around torch.nn.Transformer, (b) Hugging Face MarianMTModel from scratch.

    python scripts/bench/bench_train.py [--size tiny|small|base|big|both] [--steps N] [--json]
    python scripts/bench/bench_train.py --device cuda --precision bf16 --size base \
        --max-tokens 32768 [--vocab 32000] [--shape-buckets 16 --compile] [--compile-reference]

Each contender runs in its own subprocess so that its peak memory is its own; then all three
run once more in one process, taking turns batch by batch, which gives ratios that a drift in
the machine's speed during the run cannot bias (`ratio_*_turns` in the JSON). Prints target
tokens/s, peak memory (RSS on CPU, allocated GPU memory on CUDA), the ratios ours/reference,
this machine's matmul FLOP/s (fp32 on CPU, bf16 on CUDA) and the FLOP utilization of the useful
(non-padding) training FLOPs. On an H100/H200 the model FLOP utilization (MFU) is also given
against the datasheet dense bf16 peak. With --json the last line is a JSON object (the small
size, or the one size asked for).

Every contender's process starts with the allocator setting `mt train` makes (transparent huge
pages for tensors of 2 MB and more; mt/runtime/memory.py): the ratios compare the training
steps, not allocator settings.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import contenders
import torch
from contenders import (
    CONTENDERS,
    SIZES,
    device_batches,
    ours,
    run_interleaved,
    size_of,
    target_tokens,
    useful_flops,
)
from harness import autocast, datasheet_peak, matmul_peak, sync

from mt.runtime.device import pick_device


def run_one(
    name: str,
    size: dict,
    steps: int,
    warmup: int,
    device: torch.device,
    precision: str,
    compile_ours: bool,
    matmul_n: int = 2048,
    compile_reference: bool = False,
) -> dict:
    """Runs in a fresh subprocess: (tokens/s, peak memory MB, useful FLOP/s). matmul_n: the
    size of the product that measures the machine's matmul speed (on CPU)."""
    torch.manual_seed(0)
    batches = device_batches(size, warmup + steps, device)
    compile = {"ours": compile_ours, "torch": compile_reference}.get(name, False)
    model, step = CONTENDERS[name](size, device, precision, compile)
    model.train()
    amp = autocast(device, precision)

    def run(bs):
        for b in bs:
            with amp:
                step(b)

    run(batches[:warmup])
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    tokens = target_tokens(batches[warmup:])
    flops = sum(useful_flops(b, size) for b in batches[warmup:])
    first_sight = None
    if device.type == "cuda":
        # On a GPU the first steps were far slower than later ones: on an H100 the shipped
        # Multi30k config trained about 4 updates/s for ~1.5 epochs (121 batches each, whose
        # shapes recur every epoch) and 21/s after, and this script's 20 fresh shapes gave
        # every contender about 1% MFU (docs/gpu.md). The likely cause is a one-time setup per
        # new shape, not yet measured apart. A training run meets its shapes again every
        # epoch, so the timed pass is a second pass over the same batches; the first pass is
        # reported beside it.
        t0 = time.perf_counter()
        run(batches[warmup:])
        sync(device)
        first_sight = tokens / (time.perf_counter() - t0)
    # The machine's matmul speed right before and after the timed steps: this VM's speed
    # drifts by tens of percent within minutes, so a peak measured apart from the run can put
    # the utilization anywhere (once above 100%).
    before = matmul_peak(device, matmul_n)
    t0 = time.perf_counter()
    run(batches[warmup:])
    sync(device)
    sec = time.perf_counter() - t0
    padded = sum(b[2].numel() for b in batches[warmup:])
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if device.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    matmul = (before + matmul_peak(device, matmul_n)) / 2  # after reading the peak memory
    return {
        "tok_s": tokens / sec,
        "tok_s_first_sight": first_sight,
        "peak_rss_mb": peak,
        "flop_s": flops / sec,
        "matmul_flop_s": matmul,
        "padding": 1 - tokens / padded,
        "params": sum(p.numel() for p in model.parameters()),
    }


def measure(size_name: str, args) -> dict:
    """Each contender `--repeats` times, interleaved (drift in the machine's speed then hits
    all three alike). Returns the median run of each contender by tokens/s (with the matmul
    speed measured around that run; peak memory is the largest seen)."""
    runs = {name: [] for name in CONTENDERS}
    for _ in range(args.repeats):
        for name in CONTENDERS:
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    name,
                    "--size",
                    size_name,
                    "--steps",
                    str(args.steps),
                    "--warmup",
                    str(args.warmup),
                    "--device",
                    args.device,
                    "--precision",
                    args.precision,
                    *(["--max-tokens", str(args.max_tokens)] if args.max_tokens else []),
                    *(["--vocab", str(args.vocab)] if args.vocab else []),
                    *(["--shape-buckets", str(args.shape_buckets)] if args.shape_buckets else []),
                    *(["--compile"] if args.compile else []),
                    *(["--compile-reference"] if args.compile_reference else []),
                    *{True: ["--fast-paths"], False: ["--no-fast-paths"]}.get(
                        contenders.FAST_PATHS, []
                    ),
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            # each run as it ends, to stderr: a call cut by a time limit keeps what it measured
            print(
                f"[{size_name}] {name}: "
                + json.dumps(
                    {
                        k: round(v, 1) if isinstance(v, float) else v
                        for k, v in runs[name][-1].items()
                    }
                ),
                file=sys.stderr,
                flush=True,
            )
    res = {}
    for name, rs in runs.items():
        rs = sorted(rs, key=lambda r: r["tok_s"])
        res[name] = dict(rs[len(rs) // 2], peak_rss_mb=max(r["peak_rss_mb"] for r in rs))
    turns = run_interleaved(
        size_of(size_name, args.max_tokens, args.vocab, args.shape_buckets),
        args.steps,
        args.warmup,
        torch.device(args.device),
        args.precision,
        compile_ours=args.compile,
    )
    for name in CONTENDERS:
        res[name]["tok_s_turns"] = turns[name]
    return res


def report(size_name: str, res: dict, args, mem: str, kind: str, sheet: float | None) -> None:
    o, r, h = res["ours"], res["torch"], res["hf"]
    peak = o["matmul_flop_s"]
    print(
        f"\n[{size_name}] {o['params'] / 1e6:.1f}M params, padding {o['padding']:.1%} of target "
        f"positions; median of {args.repeats} interleaved runs each"
    )
    print(f"{'':12}{'tgt tok/s':>12}{mem:>14}{'useful GFLOP/s':>16}")
    for name, label in (("ours", "mt"), ("torch", "nn.Transformer"), ("hf", "HF Marian")):
        x = res[name]
        print(f"{label:14}{x['tok_s']:>10.0f}{x['peak_rss_mb']:>14.0f}{x['flop_s'] / 1e9:>16.1f}")
    print(
        f"in one process, taking turns batch by batch: mt {o['tok_s_turns']:.0f}, "
        f"nn.Transformer {r['tok_s_turns']:.0f}, HF Marian {h['tok_s_turns']:.0f} tok/s: "
        f"{o['tok_s_turns'] / r['tok_s_turns']:.2f}x and "
        f"{o['tok_s_turns'] / h['tok_s_turns']:.2f}x"
    )
    print(
        f"ratio mt / nn.Transformer: {o['tok_s'] / r['tok_s']:.2f}x   "
        f"mt / HF Marian: {o['tok_s'] / h['tok_s']:.2f}x   "
        f"FLOP utilization: {o['flop_s'] / peak:.1%} of the measured {kind} matmul "
        f"({peak / 1e9:.1f} GFLOP/s, around that run)"
        + (f"   MFU: {o['flop_s'] / sheet:.1%} of the datasheet peak" if sheet else "")
    )
    if o.get("tok_s_first_sight"):
        print(
            "first pass over the batch shapes (untimed above): "
            + ", ".join(
                f"{label} {res[name]['tok_s_first_sight']:.0f}"
                for name, label in (
                    ("ours", "mt"),
                    ("torch", "nn.Transformer"),
                    ("hf", "HF Marian"),
                )
            )
            + " tok/s"
        )


def summarize(
    size_name: str, res: dict, args, where: str, preload: str, sheet: float | None
) -> dict:
    """The JSON summary of one size."""
    o, r, h = res["ours"], res["torch"], res["hf"]
    peak = o["matmul_flop_s"]
    return {
        "size": size_name,
        "ours_tok_s": round(o["tok_s"], 1),
        "ref_tok_s": round(r["tok_s"], 1),
        "hf_tok_s": round(h["tok_s"], 1),
        "ratio_ref": round(o["tok_s"] / r["tok_s"], 3),
        "ratio_hf": round(o["tok_s"] / h["tok_s"], 3),
        "ratio_ref_turns": round(o["tok_s_turns"] / r["tok_s_turns"], 3),
        "ratio_hf_turns": round(o["tok_s_turns"] / h["tok_s_turns"], 3),
        "flop_utilization": round(o["flop_s"] / peak, 3),
        "matmul_gflop_s": round(peak / 1e9, 1),
        "ours_peak_rss_mb": round(o["peak_rss_mb"]),
        "ref_peak_rss_mb": round(r["peak_rss_mb"]),
        "hf_peak_rss_mb": round(h["peak_rss_mb"]),
        "padding": round(o["padding"], 3),
        "device": where,
        "precision": args.precision,
        "ld_preload": preload,
        **({"mfu": round(o["flop_s"] / sheet, 3)} if sheet else {}),
    }


def compare_updates(args, device: torch.device) -> None:
    """mt's plain update against its device update (train.update), in one process taking
    turns batch by batch, `--repeats` times: the median tokens/s of each and their ratio."""
    import functools
    import statistics

    size_name = "small" if args.size == "both" else args.size
    size = size_of(size_name, args.max_tokens, args.vocab, args.shape_buckets)
    kinds = {k: functools.partial(ours, update=k) for k in ("plain", "device")}
    runs = [
        run_interleaved(size, args.steps, args.warmup, device, args.precision, kinds)
        for _ in range(args.repeats)
    ]
    ratios = [r["plain"] / r["device"] for r in runs]
    tok_s = {k: statistics.median(r[k] for r in runs) for k in kinds}
    print(f"{size_name}, {args.precision}, {torch.get_num_threads()} CPU threads"
          if device.type == "cpu" else f"{size_name}, {args.precision}, {device}")  # fmt: skip
    for k in kinds:
        print(f"  train.update {k:6s} {tok_s[k]:10.1f} target tokens/s")
    print(f"  plain / device: {statistics.median(ratios):.3f} (median of {len(ratios)} runs: "
          f"{', '.join(f'{r:.3f}' for r in ratios)})")  # fmt: skip
    if args.json:
        rates = {f"{k}_tok_s": round(v, 1) for k, v in tok_s.items()}
        ratio = statistics.median(ratios)
        print(json.dumps({"size": size_name, **rates, "ratio_plain_device": ratio}))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", choices=[*SIZES, "both"], default="both")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved runs of each contender; the median is reported",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16 = torch.autocast(bfloat16) around every contender's step",
    )
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=0,
        help="tokens per batch (source + target); default: the size's 8192",
    )
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary; default: the size's")
    ap.add_argument(
        "--shape-buckets",
        type=int,
        default=0,
        help="batches as train.shape_buckets makes them (widths rounded up to multiples of N, "
        "a few shapes), for every contender; mt trains with that setting",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile mt's model and loss as train.compile does (dynamic shapes; with "
        "--shape-buckets static ones, replayed as CUDA graphs on a GPU)",
    )
    ap.add_argument(
        "--compile-reference",
        action="store_true",
        help="torch.compile nn.Transformer's model too (HF Marian stays eager)",
    )
    paths = ap.add_mutually_exclusive_group()
    paths.add_argument(
        "--no-fast-paths",
        action="store_true",
        help="mt's contender without mt/fast: the reference model and loss",
    )
    paths.add_argument(
        "--fast-paths",
        action="store_true",
        help="mt's contender with mt/fast on any device (default: on a CPU only)",
    )
    ap.add_argument(
        "--update",
        choices=["auto", "plain", "device"],
        default="auto",
        help="mt's update (train.update; auto: plain in one CPU process, device on a GPU)",
    )
    ap.add_argument(
        "--compare-updates",
        action="store_true",
        help="time mt's two kinds of update (train.update plain and device) against each "
        "other, taking turns batch by batch, instead of the three contenders",
    )
    ap.add_argument("--worker", choices=list(CONTENDERS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    contenders.FAST_PATHS = False if args.no_fast_paths else True if args.fast_paths else "auto"
    contenders.UPDATE = args.update
    # the device set up as `mt train` sets it up (on a GPU: no cuDNN attention), for every
    # contender alike
    device = pick_device(args.device, "--device")
    if args.worker:
        print(
            json.dumps(
                run_one(
                    args.worker,
                    size_of(args.size, args.max_tokens, args.vocab, args.shape_buckets),
                    args.steps,
                    args.warmup,
                    device,
                    args.precision,
                    args.compile,
                    compile_reference=args.compile_reference,
                )
            )
        )
        return
    if args.compare_updates:
        compare_updates(args, device)
        return
    sheet = datasheet_peak(device)
    where = (
        torch.cuda.get_device_name(0)
        if device.type == "cuda"
        else f"{torch.get_num_threads()} CPU threads"
    )
    kind = "bf16" if device.type == "cuda" else "fp32"
    preload = os.environ.get("LD_PRELOAD", "")  # e.g. scripts/mkl_amd_shim.sh's library
    print(
        f"torch {torch.__version__}, {where}, {args.precision}"
        + {
            True: ", mt with its fast paths forced on",
            False: ", mt without its fast paths (reference model and loss)",
        }.get(contenders.FAST_PATHS, "")
        + (f", vocabulary {args.vocab}" if args.vocab else "")
        + (f", batch widths in multiples of {args.shape_buckets}" if args.shape_buckets else "")
        + (", mt compiled" if args.compile else "")
        + (", nn.Transformer compiled" if args.compile_reference else "")
        + (f", datasheet dense bf16 {sheet / 1e12:.0f} TFLOP/s" if sheet else "")
        + (f", LD_PRELOAD={preload} (every contender runs with it)" if preload else "")
    )
    mem = "peak GPU MB" if device.type == "cuda" else "peak RSS MB"
    summary = {}
    for size_name in ["small", "base"] if args.size == "both" else [args.size]:
        res = measure(size_name, args)
        report(size_name, res, args, mem, kind, sheet)
        if size_name == "small" or args.size != "both":
            summary = summarize(size_name, res, args, where, preload, sheet)
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
