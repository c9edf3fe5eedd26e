"""One speed race of mt's training step: mt as it is (A) against contenders made by a patch, a
commit or a shape, every model taking turns batch by batch in one process.

    python scripts/bench/race.py                                   # A/A: the harness's noise
    python scripts/bench/race.py --patch mt.fast.nodes:FFN_CHUNK_ROWS=512
    python scripts/bench/race.py --size tiny --b-precision bf16    # B trains under bf16 autocast
    python scripts/bench/race.py --commit c2cdaa6 --commit c15d155 # other commits' mt
    python scripts/bench/race.py --size tiny --shape 6+2 --shape 4+4:heads=2

Contenders:
- B, the patched mt: every --patch TARGET=VALUE in place while its model is built and while it
  steps, undone around the others'. TARGET is MODULE:NAME, the attribute where mt looks the
  object up when it runs (a name a module imported with `from X import f` is looked up in that
  module, not in X); VALUE a Python literal (512, 0.1, None, "x"), MODULE:NAME, or
  FILE.py:NAME for an object of a file of your own. --b-precision bf16 trains B under bf16
  autocast instead (or as well), where mt's fused fp32 CPU nodes step aside, as in `mt train
  --set train.precision=bf16`. B starts from A's weights and draws its own dropout masks, so
  the largest difference between their weights afterwards says whether B computes what A does
  (0.0: bit for bit).
- each --commit: that commit's mt (and its contenders.py, or bench_train.py before it, and
  harness.py, whose `ours` builds
  the model and Trainer as that commit's `mt train` did), extracted with `git archive` under
  another package name so that every version imports side by side.
- each --shape: ENC+DEC layers, then :key=value pairs (heads, d_ff, d_model, vocab) changing
  the --size's shape; a shape's speed is its cost per update against A's on the same batches.
- A again: mt as it is built a second time, whose spread from A is the noise a ratio must
  clear.

On this VM the machine's speed drifts by tens of percent within minutes, so two separate runs
cannot resolve a change of a few percent; taking turns (the one that goes first rotating) lets
the drift hit all alike. A model built later also ran a few percent slower in A/A runs, so each
round builds fresh models, the order rotating, and a contender's speed against A is the
geometric mean of the rounds'. With --json the last line is a JSON object: tok_s and vs_a per
contender, round_ratios, max_param_diff (B against A).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import inspect
import json
import math
import pkgutil
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import contenders as bt  # the sizes, batches, `ours` and the turn-taking loop
import torch

from mt.artifacts.checkpoint import rng_state, set_rng_state

ROOT = Path(__file__).resolve().parents[2]


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


def patched_mt(patches: list, own_precision: str | None = None):
    """The maker of B: contenders.py's `ours` with `patches` in place (trained in
    `own_precision` when given), drawing its own dropout masks."""

    def make(size, device, precision="fp32"):
        rng: dict = {}
        with patched(patches), own_generator(rng):
            model, step = bt.ours(size, device, own_precision or precision)

        def patched_step(batch):
            with patched(patches), own_generator(rng):
                step(batch)

        return model, patched_step

    return make


def extract(rev: str, into: Path) -> tuple[object, str]:
    """(that commit's module of `ours`: its contenders.py, or bench_train.py before it; its
    package name), importable side by side."""
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
    library = "contenders" if (bench / "contenders.py").is_file() else "bench_train"
    (bench / f"{library}.py").rename(folder / f"bench_{name}.py")
    (bench / "harness.py").rename(folder / f"harness_{name}.py")
    for path in [*folder.glob(f"{name}/**/*.py"), *folder.glob("*.py")]:
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"\b(from|import) mt\b", rf"\1 {name}", text)
        text = re.sub(r"^from harness import", f"from harness_{name} import", text, flags=re.M)
        path.write_text(text, encoding="utf-8")
    sys.path.insert(0, str(folder))
    return importlib.import_module(f"bench_{name}"), name


def commit_mt(bench):
    """The maker of a commit's contender: its `ours`, fed the batches in the form it takes
    (commits before target tokens were counted on the host take (src, tgt_in, tgt_out))."""

    def make(size, device, precision="fp32"):
        model, step = bench.ours(size, device, precision)
        if "n_tokens = batch" in inspect.getsource(bench.ours):
            return model, step
        return model, lambda batch: step(batch[:3])

    return make


def parse_shape(text: str, base: dict) -> dict:
    """ENC+DEC[:key=value,...] as a size: `base` with those layers and keys changed."""
    layers, _, rest = text.partition(":")
    enc, dec = (int(x) for x in layers.split("+"))
    size = dict(base, enc_layers=enc, dec_layers=dec)
    for pair in filter(None, rest.split(",")):
        key, value = pair.split("=")
        size[key] = int(value)
    return size


def shaped_mt(shape: dict):
    """The maker of a shape's contender: mt as it is, built in `shape` (batches are A's)."""

    def make(size, device, precision="fp32"):
        return bt.ours(shape, device, precision)

    return make


def run_race(
    size: dict,
    makers: dict,
    steps: int,
    warmup: int,
    device=None,
    precision: str = "fp32",
    rounds: int = 2,
) -> dict:
    """`rounds` rounds of `steps` timed steps (after `warmup`) of every contender (name ->
    make(size, device, precision) -> (model, step)), A first among them; fresh models every
    round from the same seed, the order of building and of the turns rotating. Returns tok_s
    (the mean of the rounds), vs_a (the geometric mean of the rounds' speed against A),
    round_ratios, and max_param_diff between B's weights and A's (where there is a B)."""
    device = device or torch.device("cpu")
    names, per_round, diff = list(makers), [], None
    for r in range(rounds):
        k = r % len(names)
        models: dict = {}
        order = {n: _keeping(models, n, makers[n]) for n in names[k:] + names[:k]}
        secs, tokens = bt.interleaved_seconds(size, steps, warmup, device, precision, order)
        per_round.append({n: tokens / s for n, s in secs.items()})
        if "B" in models:
            pairs = zip(models["A"].parameters(), models["B"].parameters(), strict=True)
            gap = max((a - b).abs().max().item() for a, b in pairs)
            diff = gap if diff is None else max(diff, gap)
    ratios = {n: [x[n] / x["A"] for x in per_round] for n in names}
    return {
        "tok_s": {n: sum(x[n] for x in per_round) / rounds for n in names},
        "vs_a": {n: math.prod(v) ** (1 / rounds) for n, v in ratios.items()},
        "round_ratios": ratios,
        "max_param_diff": diff,
    }


def _keeping(models: dict, name: str, make):
    def made(size, device, precision="fp32"):
        model, step = make(size, device, precision)
        models[name] = model
        return model, step

    return made


def contenders(args, size: dict, tmp: Path) -> dict:
    """name -> maker, A first and A again last."""
    makers = {"A": patched_mt([])}
    if args.patch or args.b_precision:
        makers["B"] = patched_mt([resolve_patch(s) for s in args.patch], args.b_precision)
    for rev in args.commit:
        makers[rev] = commit_mt(extract(rev, tmp)[0])
    for text in args.shape:
        try:
            makers[text] = shaped_mt(parse_shape(text, size))
        except ValueError:
            raise PatchError(
                f"--shape {text!r}: write ENC+DEC[:key=value,...], e.g. 6+2:heads=2"
            ) from None
    makers["A again"] = patched_mt([])
    return makers


def report(args, r: dict) -> None:
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds of "
        f"{args.steps} steps of the {args.size} model each ({args.warmup} warm-up), taking "
        f"turns batch by batch, {args.device} {args.precision}"
    )
    what = {"A": "mt as it is", "B": ", ".join(args.patch) or "mt as it is"}
    if args.b_precision:
        what["B"] += f", trained in {args.b_precision}"
    for name, rate in r["tok_s"].items():
        rounds = " ".join(f"{x:.3f}" for x in r["round_ratios"][name])
        label = what.get(name, name)
        print(f"  {label:40} {rate:>8.0f} target tok/s  {r['vs_a'][name]:.3f}x A ({rounds})")
    if r["max_param_diff"] is not None:
        print(f"  B's largest weight difference from A: {r['max_param_diff']:.3g} (0: the same)")
    if args.json:
        rounded = {k: {n: round(x, 4) for n, x in r[k].items()} for k in ("tok_s", "vs_a")}
        print(json.dumps({**r, **rounded, "size": args.size, "steps": args.steps}))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    more = {"action": "append", "default": []}
    ap.add_argument("--patch", metavar="MODULE:NAME=VALUE", help="B replaces it", **more)
    ap.add_argument("--b-precision", choices=["fp32", "bf16"], help="B's training precision")
    ap.add_argument("--commit", metavar="REV", help="that commit's mt as a contender", **more)
    ap.add_argument("--shape", metavar="ENC+DEC[:k=v,...]", help="a shape as a contender", **more)
    ap.add_argument("--size", choices=list(bt.SIZES), default="small")
    ap.add_argument("--steps", type=int, default=20, help="timed steps a round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, the build order rotating")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=0, help="a batch's (default: the size's)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        ap.error("--steps and --rounds must be at least 1 and --warmup at least 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here; leave --device out to run on CPU")
    size = bt.size_of(args.size, args.max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            makers = contenders(args, size, Path(tmp))
        except PatchError as e:
            ap.error(str(e))
        vocab = min([size["vocab"], *(parse_shape(s, size)["vocab"] for s in args.shape)])
        device = torch.device(args.device)
        batches = dict(size, vocab=vocab)  # (ids every contender's vocabulary has)
        steps, warmup, precision = args.steps, args.warmup, args.precision
        r = run_race(batches, makers, steps, warmup, device, precision, args.rounds)
    report(args, r)


if __name__ == "__main__":
    main()
