"""Which cut pays, in one run: the base model's step and the shipped Multi30k config's, each
variant on and off, timed as gpu_figures.py's mfu and m30k parts time them.

    python scripts/bench/gpu_ablate.py OUTDIR [--data-dir DIR] [--dry-run] [--model base|m30k]

The variants (each compiled afresh, Dynamo's caches reset between them):
  base       packed rows 128 positions wide (as gpu_figures.py mfu), Inductor's defaults
  pack256    rows 256 wide (the model's max_positions): less padding at the rows' ends, and
             FlexAttention's 128-position blocks that fall between pairs skipped
  autotune   rows 128 wide, Inductor's max-autotune (its GEMM and kernel choices searched: a
             longer compile)
  block64    rows 128 wide, FlexAttention's blocks 64 positions a side (mt/fast/flex.py's
             BLOCK_SIZE): the blocks between pairs inside a row skipped
  chunk4096  rows 128 wide, the output projection and loss 4,096 positions at a time
             (train.compiled_loss_chunk): no (N, V) fp32 log-probabilities
  graph      rows 128 wide, the whole update one CUDA graph (train.update: graph)
and for the Multi30k config: rows 128 and 256 wide, and the whole update as one CUDA graph
(train.update: graph) on rows 128 wide, with its loss chunked too.

Writes OUTDIR/ablate_base.json and OUTDIR/ablate_m30k.json, one JSON line a variant as it ends
(a call cut short keeps those that finished; a variant that fails writes its error and the next
one runs): the base model's target tokens/s, MFU against the datasheet and a matmul timed in
the same run, padding, step and compile seconds; the Multi30k config's updates/s.
--model: one of the two alone. --dry-run: tiny sizes on the CPU with aot_eager (the tests run
it). scripts/gpu_check.sh OUT ablate runs the base model's on a GPU machine (about 7 minutes),
... ablatem30k the Multi30k config's (about 4).
"""

from __future__ import annotations

import torch
from gpu_figures import (
    BASE,
    BASE_PACK,
    TINY,
    TINY_PACK,
    append_line,
    attempt,
    command_line,
    m30k,
    mfu,
)
from harness import CompileEvents

BASE_VARIANTS = {
    "base": {"pack_width": 128},
    "pack256": {"pack_width": 256},
    "autotune": {"pack_width": 128, "max_autotune": True},
    "block64": {"pack_width": 128, "block_size": 64},
    "chunk4096": {"pack_width": 128, "train": {"compiled_loss_chunk": 4096}},
    "graph": {"pack_width": 128, "train": {"update": "graph"}},
}
M30K_VARIANTS = {
    "m30k": (128, ()),
    "m30k_pack256": (256, ()),
    "m30k_graph": (128, ("train.update=graph",)),
    "m30k_graph_chunk": (128, ("train.update=graph", "train.compiled_loss_chunk=2048")),
}
DRY_STEPS = {"warmup": 1, "steps": 2}


def main() -> None:
    args, device = command_line(__doc__, "ablate_MODEL.json", models=("base", "m30k"))
    if args.model in (None, "base"):
        base(args, device)
    if args.model in (None, "m30k"):
        multi30k(args, device)


def base(args, device: torch.device) -> None:
    path = args.out / "ablate_base.json"
    path.unlink(missing_ok=True)
    size, pack = (TINY, {**TINY_PACK, **DRY_STEPS}) if args.dry_run else (BASE, BASE_PACK)
    for name, variant in BASE_VARIANTS.items():
        width, train = variant["pack_width"], variant.get("train")
        with settings(variant) as events:
            figures = attempt(
                lambda w=width, t=train: mfu(device, size, {**pack, "pack_width": w}, t)
            )
        record = {"variant": name, "model": "base", **variant, **figures}
        append_line(path, {**record, **events.counts()})


def multi30k(args, device: torch.device) -> None:
    path = args.out / "ablate_m30k.json"
    path.unlink(missing_ok=True)
    for name, (width, sets) in M30K_VARIANTS.items():
        with settings({}) as events:
            figures = attempt(
                lambda w=width, s=sets: m30k(device, args.data_dir, args.out, args.dry_run, w, s)
            )
        record = {"variant": name, "model": "m30k", "pack_width": width, "sets": list(sets)}
        append_line(path, {**record, **figures, **events.counts()})


class settings:
    """A variant's settings for the compiles inside (Inductor's max-autotune, FlexAttention's
    block size), put back after; Dynamo's caches reset first so that it compiles afresh. As
    a context: the variant's CompileEvents (its recompiles and skipped CUDA graphs)."""

    def __init__(self, variant: dict) -> None:
        self.variant = variant

    def __enter__(self) -> CompileEvents:
        import torch._inductor.config as inductor

        from mt.fast import flex

        fresh()
        self.before = inductor.max_autotune, flex.BLOCK_SIZE
        inductor.max_autotune = self.variant.get("max_autotune", False)
        flex.BLOCK_SIZE = self.variant.get("block_size", flex.BLOCK_SIZE)
        return CompileEvents()

    def __exit__(self, *_) -> None:
        import torch._inductor.config as inductor

        from mt.fast import flex

        inductor.max_autotune, flex.BLOCK_SIZE = self.before


def fresh() -> None:
    """Dynamo's caches and counters reset: the next variant compiles (and counts) its own."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


if __name__ == "__main__":
    main()
