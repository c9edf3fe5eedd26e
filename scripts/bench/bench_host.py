"""The host's work in one training update, before and after: the update of the Multi30k
config's shape (4+4 layers, packed blocks of one shape) with the widths shrunk until the
arithmetic is negligible (d_model 16, FFN 32, a 300-subword vocabulary), so that what is left is
the Python and the kernels around the model:

    python scripts/bench/bench_host.py [--base COMMIT] [--accum 1,2] [--compile aot_eager]
        [--rounds 3] [--device cuda]

For the working tree and for COMMIT (checked out into a temporary git worktree), each in a
process of its own, for each accumulation and for the eager and the compiled step, it prints:

  update       median wall time of an update (train_step), ms
  ops outside  aten operators run per update outside the compiled graphs (torch.profiler: the
               operators under no "Compiled" region and under no other operator; all of them
               for the eager step; the batches taken before)
  kernels outside  of those, the ones that compute or copy (not views, not a .to() that
               returns its input): on a GPU, each is at least one kernel launch
  .train()     how many times an update calls Module.train (each walks every module)
  adam         median time of the optimizer's step, ms
  batch        median time to take the next batch (collation on the main thread), ms
  save         time to write last.pt once, ms

On a GPU (`--device cuda`) the compiled step is replayed as CUDA graphs and the operators
outside them are the launches the host still makes per update.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the code before the cuts to the host's work (flat gradient buffers, Adam's lists kept, the
# training mode set only when it changes)
BASE = "e9a2c31"


def _child(args) -> None:
    import torch

    from mt.config import load_config
    from mt.data.download import download
    from mt.train.build import build_trainer

    tmp = Path(args.tmp)
    if not (tmp / "data").is_dir():
        download("synthetic", tmp / "data")
    if args.compile != "inductor":
        real = torch.compile
        torch.compile = lambda fn, **kw: real(fn, **{**kw, "backend": args.compile})
    results = []
    for accum in map(int, args.accum.split(",")):
        for compiled in (False, True):
            sets = [
                f"data.dir={tmp / 'data'}", f"train.device={args.device}",
                "model.enc_layers=4", "model.dec_layers=4", "model.d_model=16",
                "model.n_heads=2", "model.d_ff=32", "train.pack_width=64",
                "train.max_tokens=8192", f"train.accum_steps={accum}",
                f"train.compile={str(compiled).lower()}", "train.fast_paths=false",
                "train.valid_every=100000", "train.log_every=100000",
            ]  # fmt: skip
            run = tmp / f"run_{args.name}_{accum}_{compiled}"
            cfg = load_config(ROOT / "configs/tiny.yaml", sets)
            t = build_trainer(cfg, run, log=lambda *_: None)
            results.append({"accum": accum, "compiled": compiled, **_measure(t, accum, args)})
            t.close()
    Path(args.out).write_text(json.dumps(results))


def _measure(t, accum: int, args) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    batches = t.batches()
    cuda = t.device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def take():
        return [next(batches) for _ in range(accum)]

    for _ in range(args.warmup):  # (compiles, records the graphs, makes Adam's state)
        t.train_step(take())
    calls, walk = [], torch.nn.Module.train
    torch.nn.Module.train = lambda self, mode=True: calls.append(1) or walk(self, mode)
    t.train_step(take())
    torch.nn.Module.train = walk
    adam, step = [], t.optimizer.step

    def timed_step(*a, **k):
        start = time.perf_counter()
        out = step(*a, **k)
        adam.append(time.perf_counter() - start)
        return out

    t.optimizer.step = timed_step
    update, batch = [], []
    for _ in range(args.updates):
        sync()
        start = time.perf_counter()
        work = take()
        batch.append(time.perf_counter() - start)
        start = time.perf_counter()
        t.train_step(work)
        sync()
        update.append(time.perf_counter() - start)
    t.optimizer.step = step
    works = [take() for _ in range(args.profiled)]  # (taken before: the update alone)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for work in works:
            t.train_step(work)
        sync()
    ops = [e for e in prof.events() if e.name.startswith("aten::") and _outside(e)]
    kernels = [e for e in ops if _computes(e)]
    start = time.perf_counter()
    t.checkpoints.save("last.pt", t.state, t.checkpoints.rng_states())
    save = time.perf_counter() - start
    return {
        "update_ms": 1000 * statistics.median(update),
        "ops_outside": len(ops) / args.profiled,
        "kernels_outside": len(kernels) / args.profiled,
        "train_calls": len(calls),
        "adam_ms": 1000 * statistics.median(adam),
        "batch_ms": 1000 * statistics.median(batch),
        "save_ms": 1000 * save,
    }


def _outside(event) -> bool:
    """An operator called by no compiled region, and not by another operator (only the
    outermost ones are launches of their own)."""
    parent = event.cpu_parent
    while parent is not None:
        if "Compiled" in parent.name or parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return True


# operators that make a view or return their input, never a kernel; aten::to and aten::copy_
# count where they copy (then they call another operator)
VIEWS = {"aten::detach", "aten::select", "aten::unbind", "aten::view", "aten::alias",
         "aten::as_strided", "aten::slice", "aten::expand", "aten::lift_fresh"}  # fmt: skip


def _computes(event) -> bool:
    if event.name in VIEWS:
        return False
    if event.name == "aten::to":
        return bool(event.cpu_children)
    return True


def _run_tree(tree: Path, name: str, args, tmp: str) -> list[dict]:
    out = f"{tmp}/{name}.json"
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, __file__, "--child", "--name", name, "--out", out, "--tmp", tmp,
           "--accum", args.accum, "--compile", args.compile, "--device", args.device,
           "--updates", str(args.updates), "--warmup", str(args.warmup),
           "--profiled", str(args.profiled)]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, cwd=tree)
    return json.loads(Path(out).read_text())


def _medians(runs: list[list[dict]]) -> list[dict]:
    """Each figure's median over the rounds, row by row."""
    return [
        {
            k: statistics.median(run[i][k] for run in runs) if isinstance(v, float) else v
            for k, v in row.items()
        }
        for i, row in enumerate(runs[0])
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default=BASE, help="the commit to compare with (none: no comparison)")
    ap.add_argument("--accum", default="1,2", help="train.accum_steps values")
    ap.add_argument("--compile", default="aot_eager", help="torch.compile backend")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--updates", type=int, default=30, help="timed updates")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--profiled", type=int, default=3, help="updates profiled")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="turns of the two trees")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--name", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    if args.base == "none":  # (a copy of the tree without its history: the tree alone)
        with tempfile.TemporaryDirectory() as tmp:
            runs = [_run_tree(ROOT, "after", args, tmp) for _ in range(args.rounds)]
        _print(args, _medians(runs), None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base),
                        args.base], check=True)  # fmt: skip
        try:  # (the trees take turns, so that a drift in the machine hits both alike)
            rounds = [
                (_run_tree(base, "before", args, tmp), _run_tree(ROOT, "after", args, tmp))
                for _ in range(args.rounds)
            ]
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)])
    before, after = (_medians([r[i] for r in rounds]) for i in (0, 1))
    _print(args, after, before)


def _print(args, after: list[dict], before: list[dict] | None) -> None:
    what = f"before = {args.base}, after = the working tree" if before else "the working tree"
    print(
        f"{args.device}, {args.threads} thread(s), {args.compile} for the compiled step, "
        f"medians of {args.rounds} rounds; {what}"
    )
    cols = ("update_ms", "ops_outside", "kernels_outside", "train_calls", "adam_ms", "batch_ms",
            "save_ms")  # fmt: skip
    print(f"{'accum':>5} {'step':>8}  " + "  ".join(f"{c:>22}" for c in cols))
    for i, a in enumerate(after):
        step = "compiled" if a["compiled"] else "eager"
        if before:
            cells = [f"{before[i][c]:9.2f} -> {a[c]:8.2f}" for c in cols]
        else:
            cells = [f"{a[c]:.2f}" for c in cols]
        print(f"{a['accum']:>5} {step:>8}  " + "  ".join(f"{x:>22}" for x in cells))


if __name__ == "__main__":
    main()
