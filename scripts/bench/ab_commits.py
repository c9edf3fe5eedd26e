"""mt's training step at other commits against the working tree's, in one process, taking turns
batch by batch: where a change of speed came from, with the machine's drift hitting all alike.

    python scripts/bench/ab_commits.py c2cdaa6 c15d155 [--steps 16] [--size small] [--json]

Each commit's `mt` package (and its bench_train.py and harness.py, whose `ours` builds its
model and Trainer as that commit's `mt train` did) is extracted with `git archive` into a
temporary folder under another package name, its imports rewritten to it, so that every
version imports side by side. Every contender starts from the same seed and trains on the
same batches (the working tree's bench_train.make_batches); the working tree runs twice, and
the spread of those two (A/A) is the noise a difference must clear. Prints target tokens/s
and each contender's speed relative to the working tree's first run.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from harness import take_turns

ROOT = Path(__file__).resolve().parents[2]


def extract(rev: str, into: Path) -> tuple[object, str]:
    """(that commit's bench_train module, its package name), importable side by side."""
    name = "mt_" + re.sub(r"\W", "_", rev)
    folder = into / name
    folder.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", rev, "mt", "scripts"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    (folder / "mt").rename(folder / name)
    bench = folder / "scripts/bench"
    if not (bench / "bench_train.py").is_file():  # older layouts kept them in scripts/
        bench = folder / "scripts"
    (bench / "bench_train.py").rename(folder / f"bench_{name}.py")
    (bench / "harness.py").rename(folder / f"harness_{name}.py")
    for path in [*folder.glob(f"{name}/**/*.py"), *folder.glob("*.py")]:
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"\b(from|import) mt\b", rf"\1 {name}", text)
        text = re.sub(r"^from harness import", f"from harness_{name} import", text, flags=re.M)
        path.write_text(text, encoding="utf-8")
    sys.path.insert(0, str(folder))
    return importlib.import_module(f"bench_{name}"), name


def step_of(bench, size: dict, device: torch.device):
    """That commit's `ours` step, fed the batches in the form it takes (commits before
    target tokens were counted on the host take (src, tgt_in, tgt_out))."""
    model, step = bench.ours(size, device)
    model.train()
    if "n_tokens = batch" in inspect.getsource(bench.ours):
        return step
    return lambda batch: step(batch[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("revs", nargs="+", help="commits to compare with the working tree")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--size", default="small")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import bench_train as here

    device = torch.device("cpu")
    size = here.size_of(args.size, 0)
    batches = here.device_batches(size, args.warmup + args.steps, device)
    runners = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in ["working tree", *args.revs, "working tree (again)"]:
            torch.manual_seed(0)
            if label.startswith("working tree"):
                model, runners[label] = here.ours(size, device)
                model.train()
            else:
                bench, _ = extract(label, Path(tmp))
                runners[label] = step_of(bench, size, device)
        secs = take_turns(runners, batches, args.warmup, device)
    tokens = sum(b[3] for b in batches[args.warmup :])
    first = secs["working tree"]
    result = {k: {"tok_s": round(tokens / v), "vs_working_tree": round(first / v, 3)}
              for k, v in secs.items()}  # fmt: skip
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, size {args.size}, "
          f"{args.steps} timed batches each, taking turns")  # fmt: skip
    for label, r in result.items():
        print(f"{label:24}{r['tok_s']:>8} target tok/s   {r['vs_working_tree']:.3f}x")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
