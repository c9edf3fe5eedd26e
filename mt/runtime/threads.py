"""CPU threads on a shared machine.

OpenMP threads that wait for each other by spinning (libgomp's default) turn a busy neighbour
into a many-fold slowdown on a 2-core machine: a thread that lost its core keeps the others
spinning at every barrier. So mt uses only the cores that other processes leave free when it
starts, and says so; `train.num_threads` or MT_THREADS choose. It keeps libgomp's spinning
wait: sleeping at once (OMP_WAIT_POLICY=PASSIVE) avoids the slowdown too, but slows small-op
training on an idle machine (scripts/bench/bench_threads.py; figures in docs/performance.md).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

PROC_STAT = "/proc/stat"
CGROUP = "/sys/fs/cgroup"


def _cpu_times(cores: set[int] | None = None) -> tuple[float, float] | None:
    """(busy, total) jiffies of the cores `cores` (all when None) from /proc/stat's per-core
    lines; None where there is none."""
    try:
        with open(PROC_STAT, encoding="ascii") as f:
            lines = [line.split() for line in f if line.startswith("cpu")]
    except OSError:
        return None
    per_core = [x for x in lines if x[0] != "cpu"]
    chosen = [x for x in per_core if cores is None or int(x[0][3:]) in cores]
    if not chosen:
        chosen = [x for x in lines if x[0] == "cpu"]
    busy = total = 0.0
    try:
        for x in chosen:
            fields = [float(v) for v in x[1:]]
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
            busy, total = busy + sum(fields) - idle, total + sum(fields)
    except (ValueError, IndexError):
        return None
    return busy, total


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return None


def busy_cores(interval: float = 0.3) -> float:
    """How many of this process's cores (its CPU set) other processes keep busy, measured
    over `interval` seconds (this process sleeps meanwhile); the 1-minute load average where
    /proc/stat is missing. Counting the whole machine would call a process pinned to one idle
    core busy because of a neighbour on another."""
    cores = _affinity()
    first = _cpu_times(cores)
    if first is None:
        try:
            return os.getloadavg()[0]
        except OSError:
            return 0.0
    time.sleep(interval)
    second = _cpu_times(cores)
    if second is None:  # /proc/stat went away meanwhile
        return 0.0
    busy, total = second[0] - first[0], second[1] - first[1]
    n = len(cores) if cores else (os.cpu_count() or 1)
    return (busy / total) * n if total > 0 else 0.0


def cgroup_cpu_limit() -> float | None:
    """The CPU quota of this process's container in cores (cgroup v2's cpu.max, or v1's
    cfs quota and period), or None where there is none."""
    root = Path(CGROUP)
    try:
        v2_quota, v2_period = (root / "cpu.max").read_text().split()[:2]
        return None if v2_quota == "max" else int(v2_quota) / int(v2_period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """The cores this process may run on: its CPU set, within its container's CPU quota."""
    cores = _affinity()
    n = len(cores) if cores else (os.cpu_count() or 1)
    limit = cgroup_cpu_limit()
    return max(1, min(n, math.ceil(limit))) if limit else n


def choose_threads(requested: int = 0, log=print) -> int:
    """Set torch's intra-op threads: `requested` (or MT_THREADS) if given, else the cores left
    free by other processes, at most torch's own default (the physical cores)."""
    import torch

    from mt.runtime.env import env_int

    requested = requested or env_int("MT_THREADS")
    if requested:
        most = 4 * usable_cores()  # (more are no use, and tens of thousands crash OpenMP)
        if requested > most:
            log(
                f"{requested} threads asked for (MT_THREADS or train.num_threads), on "
                f"{usable_cores()} usable cores: using {most}"
            )
            requested = most
        torch.set_num_threads(requested)
        return requested
    default = torch.get_num_threads()
    busy = busy_cores()
    free = max(1, min(default, int(usable_cores() - busy + 0.5)))
    if free < default:
        log(
            f"the machine is busy (other processes use {busy:.1f} of {usable_cores()} cores): "
            f"using {free} thread(s) instead of {default}; set MT_THREADS (or, for training, "
            f"train.num_threads) to choose"
        )
        torch.set_num_threads(free)
    return free
