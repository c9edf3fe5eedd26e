"""Where an update's time goes, measured before anything is cut: torch.profiler over 20 updates
of the base model (packed, compiled, bf16: gpu_figures.py's mfu part) and 200 of the shipped
Multi30k config (its m30k part), after their compile and warm-up.

    python scripts/bench/gpu_profile.py OUTDIR [--data-dir DIR] [--dry-run]

Writes, for each model (base, m30k):
  OUTDIR/profile.json        one JSON line a model: wall, device and host milliseconds per
                             update, and the operators and kernels taking the most time
                             (device time on a GPU, host time on a CPU), each with its calls
  OUTDIR/profile_MODEL.txt   the profiler's whole table, sorted the same way
  OUTDIR/trace_MODEL.json.gz the host/device timeline of 3 updates after them (Chrome's trace
                             format: chrome://tracing or ui.perfetto.dev)
--dry-run: tiny sizes on the CPU with aot_eager, a few updates (the tests run it).
scripts/gpu_check.sh OUT profile runs it on a GPU machine.
"""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path

import torch
from gpu_figures import (
    BASE,
    BASE_PACK,
    TINY,
    TINY_PACK,
    append_line,
    attempt,
    base_trainer,
    command_line,
    device_name,
    m30k_trainer,
)

# (warm-up updates, profiled updates) of each model; TRACED more are traced after them
UPDATES = {"base": (8, 20), "m30k": (10, 200)}
DRY_UPDATES = {"base": (2, 4), "m30k": (2, 4)}
TRACED, TOP = 3, 15
KEYS = ["part", "model", "device", "torch", "updates", "wall_ms", "device_ms", "host_ms",
        "sorted_by", "top"]  # fmt: skip


def main() -> None:
    args, device = command_line(__doc__, "profile.json, the tables and the timelines")
    counts = DRY_UPDATES if args.dry_run else UPDATES
    (args.out / "profile.json").unlink(missing_ok=True)
    for model in ("base", "m30k"):
        record = attempt(lambda m=model: profile_model(m, device, counts[m], args))
        append_line(args.out / "profile.json", {"part": "profile", "model": model, **record})


def profile_model(model: str, device: torch.device, counts: tuple[int, int], args) -> dict:
    """One model's trainer built, compiled and warmed up, then profiled (`profiled`)."""
    warm, n = counts
    if model == "base":
        size, pack = (TINY, TINY_PACK) if args.dry_run else (BASE, BASE_PACK)
        counted = {**pack, "warmup": warm, "steps": n + TRACED}
        trainer, batches = base_trainer(device, size, counted)
        step = iter(batches)
    else:
        trainer, _ = m30k_trainer(device, args.data_dir, args.dry_run)
        step = trainer.batches()
    for _ in range(warm):  # the compiles and the first shapes, outside the profile
        trainer.train_step([next(step)])
    record = profiled(trainer, step, n, device, args.out, model)
    trainer.close()
    return record


def profiled(trainer, batches, n: int, device: torch.device, out: Path, model: str) -> dict:
    """n updates under torch.profiler: their times and top operators and kernels, the table
    written to `out`; then TRACED more whose timeline is written there too."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    _sync(device)
    started = time.perf_counter()
    with profile(activities=activities) as window:
        for _ in range(n):
            trainer.train_step([next(batches)])
        _sync(device)
    wall = time.perf_counter() - started
    with profile(activities=activities) as timeline:  # (a few: a trace grows with each)
        for _ in range(TRACED):
            trainer.train_step([next(batches)])
        _sync(device)
    trace = out / f"trace_{model}.json"
    timeline.export_chrome_trace(str(trace))
    with trace.open("rb") as raw, gzip.open(f"{trace}.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    trace.unlink()
    events = window.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    table = events.table(sort_by=key, row_limit=60, max_name_column_width=90)
    (out / f"profile_{model}.txt").write_text(table + "\n", encoding="utf-8")
    ranked = sorted(events, key=lambda e: _device_us(e) if cuda else e.self_cpu_time_total)
    top = [{"name": e.key[:120], "calls": e.count, "device_ms": round(_device_us(e) / 1000 / n, 4),
            "host_ms": round(e.self_cpu_time_total / 1000 / n, 4)}
           for e in reversed(ranked[-TOP:])]  # fmt: skip
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "updates": n,
        "wall_ms": round(1000 * wall / n, 3),
        "device_ms": round(sum(_device_us(e) for e in events) / 1000 / n, 3),
        "host_ms": round(sum(e.self_cpu_time_total for e in events) / 1000 / n, 3),
        "sorted_by": "device time" if cuda else "host time",
        "top": top,
    }


def _device_us(event) -> float:
    """An operator's own device time in microseconds (its name changed across torch releases)."""
    return float(
        getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0))
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
