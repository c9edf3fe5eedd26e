"""CPU threads on a shared machine.

OpenMP threads that wait for each other by spinning (libgomp's default) turn a busy neighbour
into a many-fold slowdown on a 2-core machine: a thread that lost its core keeps the others
spinning at every barrier. So mt uses only the cores that other processes leave free when it
starts, and says so; `train.num_threads` or MT_THREADS choose. It keeps libgomp's spinning
wait: sleeping at once (OMP_WAIT_POLICY=PASSIVE) avoids the slowdown too, but made the idle
machine's small-op training 1.5x slower (scripts/bench/bench_threads.py, docs/performance.md).
"""

from __future__ import annotations

import os
import time


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of all cores from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_cores(interval: float = 0.3) -> float:
    """How many cores other processes keep busy, measured over `interval` seconds (this
    process sleeps meanwhile); the 1-minute load average where /proc/stat is missing."""
    first = _cpu_times()
    if first is None:
        try:
            return os.getloadavg()[0]
        except OSError:
            return 0.0
    time.sleep(interval)
    second = _cpu_times()
    if second is None:  # /proc/stat went away meanwhile
        return 0.0
    busy, total = second[0] - first[0], second[1] - first[1]
    return (busy / total) * (os.cpu_count() or 1) if total > 0 else 0.0


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def choose_threads(requested: int = 0, log=print) -> int:
    """Set torch's intra-op threads: `requested` (or MT_THREADS) if given, else the cores left
    free by other processes, at most torch's own default (the physical cores)."""
    import torch

    from mt.runtime.env import env_int

    requested = requested or env_int("MT_THREADS", 0, means="CPU threads; 0: chosen for you")
    if requested:
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
