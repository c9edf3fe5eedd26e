"""How `mt train` behaves when the machine is shared: the same short training run (the tiny
config, 40 updates) on an idle machine and beside a busy neighbour process (a torch matmul
loop on one thread, what another user's job looks like), with:

  - mt as shipped (threads = the cores other processes leave free, libgomp's default waits),
  - torch's own behaviour: all cores, libgomp's default wait policy (spin, then sleep),
  - all cores with passive waits (mt's wait policy without its thread choice),
  - one thread.

Prints wall seconds per case and each case's ratio to the idle machine with mt as shipped.
A ratio, measured in one run, is the claim: never a timed unit test.

    python scripts/bench/bench_threads.py [--steps 40] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEIGHBOUR = (
    "import torch\ntorch.set_num_threads(1)\na = torch.randn(512, 512)\n"
    "while True:\n    a = (a @ a).tanh()\n"
)


def train_seconds(env: dict, steps: int, work: Path) -> float:
    run = work / f"run{time.perf_counter_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "mt",
        "train",
        "tiny",
        "--run-dir",
        str(run),
        "--set",
        f"data.dir={work / 'data'}",
        f"train.max_steps={steps}",
        "train.valid_every=100000",
        "train.save_every=100000",
        "decode.tune_beams=[]",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"training failed: {proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def cases() -> dict[str, dict]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MT_THREADS")
    }
    base["PYTHONPATH"] = str(ROOT)
    cores = str(os.cpu_count())
    return {
        "mt as shipped": dict(base),
        # an empty value keeps libgomp's default (mt only fills in an unset variable)
        "all cores, libgomp default waits": dict(base, OMP_WAIT_POLICY="", MT_THREADS=cores),
        "all cores, passive waits": dict(base, OMP_WAIT_POLICY="PASSIVE", MT_THREADS=cores),
        "1 thread": dict(base, MT_THREADS="1"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores; tiny config, {args.steps} updates, best of {args.repeats}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        train_seconds(cases()["1 thread"], 2, work)  # data, BPE and caches once
        for load in ("idle", "busy neighbour"):
            neighbour = (
                subprocess.Popen([sys.executable, "-c", NEIGHBOUR]) if load != "idle" else None
            )
            try:
                time.sleep(2 if neighbour else 0)
                for name, env in cases().items():
                    best = min(train_seconds(env, args.steps, work) for _ in range(args.repeats))
                    results[(load, name)] = best
            finally:
                if neighbour:
                    neighbour.kill()
                    neighbour.wait()
    ref = results[("idle", "mt as shipped")]
    print(f"{'machine':<16} {'threads':<36} {'seconds':>8} {'vs idle, as shipped':>20}")
    for (load, name), sec in results.items():
        print(f"{load:<16} {name:<36} {sec:8.1f} {sec / ref:19.2f}x")


if __name__ == "__main__":
    main()
