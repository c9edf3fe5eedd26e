"""A/B of one change to mt's training step: mt as it is (A) against mt with some module
attributes replaced (B), the two models taking turns batch by batch in one process.

    python scripts/bench/ab_train.py --patch mt.fast.nodes:FFN_CHUNK_ROWS=512
    python scripts/bench/ab_train.py --patch mt.fast.modules:feed_forward=my_ffn.py:feed_forward
    python scripts/bench/ab_train.py --b-precision bf16 --size tiny   # B trains under bf16 autocast
    python scripts/bench/ab_train.py                   # no patch: A/A, the harness's own noise

A patch is TARGET=VALUE. TARGET is MODULE:NAME, the attribute where mt looks the object up
when it runs (a name that a module imported with `from X import f` is looked up in that
module, not in X). VALUE is a Python literal (512, 0.1, None, "x"), MODULE:NAME, or
FILE.py:NAME for an object defined in a file of your own. B's patches are in place while its
model is built and while it takes its steps, and undone around A's. --b-precision bf16 makes
the change B's training precision instead (or as well): B's Trainer runs its forward and loss
under bf16 autocast, where mt's fused fp32 CPU nodes step aside for PyTorch's ops, as they do
in `mt train --set train.precision=bf16`.

On this VM the speed of the machine drifts by tens of percent within minutes, so two separate
runs cannot resolve a change of a few percent; taking turns in one process (which side goes
first alternates) lets the drift hit both alike. The model built second also ran a few percent
slower in A/A runs, so each round builds fresh models, the side built first alternating, and
B/A is the geometric mean of the rounds'. Run it with no patch first: the A/A ratio is the
noise a B/A ratio must clear. The models start from the same weights, see the same batches
and each draws its own dropout masks, so the largest difference between their parameters
after the steps says whether B computes what A does (0.0: bit for bit).
With --json the last line is a JSON object: a_tok_s, b_tok_s, ratio (B over A), round_ratios,
max_param_diff.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import json
import math
import pkgutil
from pathlib import Path

import bench_train as bt  # its batches, its `ours` and its turn-taking loop
import torch

from mt.artifacts.checkpoint import rng_state, set_rng_state


class PatchError(ValueError):
    """A --patch that names nothing, or something that is not there."""


def resolve_patch(spec: str) -> tuple[object, str, object]:
    """TARGET=VALUE -> (module, attribute name, value); PatchError with the fix otherwise."""
    target, sep, source = spec.partition("=")
    module_name, colon, name = target.partition(":")
    if not sep or not colon or not module_name or not name or not source:
        raise PatchError(
            f"--patch {spec!r}: write MODULE:NAME=VALUE, e.g. mt.fast.nodes:FFN_CHUNK_ROWS=512"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PatchError(f"--patch {spec!r}: cannot import {module_name} ({e})") from None
    if not hasattr(module, name):
        raise PatchError(
            f"--patch {spec!r}: {module_name} has no attribute {name!r}; "
            f"patch a name the module has"
        )
    return module, name, _value(spec, source)


def _value(spec: str, source: str) -> object:
    with contextlib.suppress(ValueError, SyntaxError):
        return ast.literal_eval(source)
    path, _, name = source.rpartition(":")
    file = Path(path)
    if file.suffix == ".py" and not file.is_file():
        raise PatchError(f"--patch {spec!r}: no file {path}")
    try:
        if file.suffix != ".py":
            return pkgutil.resolve_name(source)
        loader = importlib.util.spec_from_file_location(file.stem, file)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        return getattr(module, name)
    except (ImportError, AttributeError, ValueError) as e:
        raise PatchError(
            f"--patch {spec!r}: cannot load {source} ({e}); give a Python "
            f"literal, MODULE:NAME or FILE.py:NAME"
        ) from None


@contextlib.contextmanager
def patched(patches: list[tuple[object, str, object]]):
    """The attributes replaced inside the block, put back after it."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    try:
        for module, name, value in patches:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


@contextlib.contextmanager
def own_generator(state: dict):
    """The random generators (dropout's) as `state` left them, and their state kept there
    after the block: each side draws its own stream, as it would running alone."""
    outer = rng_state()
    if state:
        set_rng_state(state)
    try:
        yield
    finally:
        state.update(rng_state())
        set_rng_state(outer)


def contenders(
    patches: list[tuple[object, str, object]], models: dict, b_precision: str | None = None
) -> dict:
    """A: bench_train's `ours`; B: the same with `patches` in place (and trained in
    `b_precision` when given). `models` receives both models, to compare their weights
    afterwards. Both start from the same seed and each draws its own dropout masks, so with
    the same arithmetic they end with the same weights."""

    def maker(label, patches, own_precision=None):
        def make(size, device, precision="fp32", compile=False):
            rng: dict = {}
            torch.manual_seed(0)
            with patched(patches), own_generator(rng):
                model, step = bt.ours(size, device, own_precision or precision)
            models[label] = model

            def patched_step(batch):
                with patched(patches), own_generator(rng):
                    step(batch)

            return model, patched_step

        return make

    return {"A": maker("A", []), "B": maker("B", patches, b_precision)}


def run_ab(
    size: dict,
    steps: int,
    warmup: int,
    patches: list,
    device=None,
    precision: str = "fp32",
    rounds: int = 2,
    b_precision: str | None = None,
) -> dict:
    """`rounds` runs of `steps` timed steps each, fresh models every round, the side that is
    built first (and goes first on even batches) alternating from round to round: in A/A runs
    on this VM the model built second ran 2.5-5.6% slower in three of three runs, a bias that
    alternating cancels. ratio: the geometric mean of the rounds' B/A. device: the CPU unless
    given."""
    device = device or torch.device("cpu")
    per_round, diff = [], 0.0
    for r in range(rounds):
        models: dict = {}
        sides = contenders(patches, models, b_precision)
        if r % 2:
            sides = {"B": sides["B"], "A": sides["A"]}
        rates = bt.run_interleaved(size, steps, warmup, device, precision, sides)
        per_round.append(rates)
        diff = max(
            diff,
            max(
                (a - b).abs().max().item()
                for a, b in zip(models["A"].parameters(), models["B"].parameters(), strict=True)
            ),
        )
    ratios = [x["B"] / x["A"] for x in per_round]
    return {
        "a_tok_s": sum(x["A"] for x in per_round) / rounds,
        "b_tok_s": sum(x["B"] for x in per_round) / rounds,
        "ratio": math.prod(ratios) ** (1 / rounds),
        "round_ratios": ratios,
        "max_param_diff": diff,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--patch",
        action="append",
        default=[],
        metavar="MODULE:NAME=VALUE",
        help="an attribute B replaces (repeat for several)",
    )
    ap.add_argument("--size", choices=list(bt.SIZES), default="small")
    ap.add_argument("--steps", type=int, default=20, help="timed steps of each side per round")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds with fresh models, which one is built first alternating",
    )
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=0,
        help="tokens per batch (source + target); default: the size's 8192",
    )
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument(
        "--b-precision",
        choices=["fp32", "bf16"],
        help="B's own training precision (default: --precision, as A's)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        ap.error("--steps and --rounds must be at least 1 and --warmup at least 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here; leave --device out to run on CPU")
    try:
        patches = [resolve_patch(spec) for spec in args.patch]
    except PatchError as e:
        ap.error(str(e))
    r = run_ab(
        bt.size_of(args.size, args.max_tokens),
        args.steps,
        args.warmup,
        patches,
        torch.device(args.device),
        args.precision,
        args.rounds,
        args.b_precision,
    )
    changes = args.patch + (
        [f"trained in {args.b_precision}"]
        if args.b_precision and args.b_precision != args.precision
        else []
    )
    what = ", ".join(changes) or "no patch (A/A: the harness's noise)"
    print(
        f"{args.rounds} rounds of {args.steps} steps of the {args.size} model each "
        f"({args.warmup} warm-up), taking turns batch by batch, {args.device} {args.precision}"
    )
    print(f"  A  mt as it is{r['a_tok_s']:>12.0f} target tok/s")
    print(f"  B  {what}: {r['b_tok_s']:.0f} target tok/s")
    rounds = " ".join(f"{x:.3f}" for x in r["round_ratios"])
    print(
        f"  B/A {r['ratio']:.3f} (rounds: {rounds}); largest parameter difference after the steps "
        f"{r['max_param_diff']:.3g} (0 = the same arithmetic)"
    )
    if args.json:
        print(
            json.dumps(
                {
                    **{k: round(r[k], 4) for k in ("a_tok_s", "b_tok_s", "ratio")},
                    "round_ratios": [round(x, 4) for x in r["round_ratios"]],
                    "max_param_diff": r["max_param_diff"],
                    "patches": args.patch,
                    "steps": args.steps,
                    "size": args.size,
                }
            )
        )


if __name__ == "__main__":
    main()
