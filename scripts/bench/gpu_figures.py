"""The GPU figures that fit one short call, one part at a time:

  mfu    the base Transformer (6+6 layers, d_model 512, FFN 2048, vocabulary 32k) trained as
         `mt train` trains it with train.pack_width and train.compile: packed blocks of one
         shape, the step compiled once (and replayed as CUDA graphs), bf16. After a warm-up,
         timed updates on CUDA events: target tokens/s and the model FLOP utilisation of the
         useful FLOPs against the datasheet peak and against a matmul measured in the same run.
  m30k   the shipped Multi30k En->De config, packed (train.pack_width 128) and compiled, built
         by `mt train`'s own factory. Updates/s after the compile, each update taking its batch
         from the training walk as `mt train` does; validation and saving are left out of the
         timed window. The forecast of the whole run (train.max_steps) at that rate.

    python scripts/bench/gpu_figures.py OUTDIR PART [--data-dir DIR] [--dry-run]

Each part writes OUTDIR/PART.json, one JSON line, the moment it ends, so that a call cut short
still returns the parts that finished. Inductor compiles into a fresh cache folder (a first
compile is what a new machine pays) with as many compile threads as the machine has cores.
--dry-run: the same code on the CPU with tiny sizes, torch.compile's aot_eager backend (an
Inductor compile takes minutes on two cores) and, for m30k, a synthetic corpus written as
Multi30k's files: the keys of the JSON lines, for the tests. scripts/gpu_check.sh runs both
parts on a GPU machine (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from contenders import mt_trainer
from harness import CompileEvents, datasheet_peak, matmul_peak

BASE = {"layers": 6, "d_model": 512, "heads": 8, "d_ff": 2048, "vocab": 32000}
# packed blocks of 128 rows x 128 positions a side: 16k source and 16k target positions
BASE_PACK = {"pack_width": 128, "max_tokens": 32768, "warmup": 8, "steps": 60}
TINY = {"layers": 1, "d_model": 32, "heads": 2, "d_ff": 64, "vocab": 300}
TINY_PACK = {"pack_width": 128, "max_tokens": 1024, "warmup": 2, "steps": 3}
M30K = {"warmup": 10, "steps": 600}
M30K_DRY = {"warmup": 2, "steps": 3}
M30K_DRY_SET = [  # the shipped config at a size the CPU steps through in seconds
    "model.d_model=16", "model.n_heads=2", "model.enc_layers=1", "model.dec_layers=1",
    "model.d_ff=32", "tokenizer.vocab_size=120", "train.max_tokens=1024",
]  # fmt: skip
KEYS = {
    "mfu": [
        "part", "device", "torch", "params", "block", "updates", "compile_s", "step_ms",
        "target_tokens_s", "useful_tflop_s", "matmul_tflop_s", "datasheet_tflop_s",
        "mfu_datasheet", "mfu_matmul", "padding", "graphs", "peak_gpu_mb", "recompiles",
        "cudagraph_skips",
    ],
    "m30k": [
        "part", "device", "torch", "params", "block", "updates", "compile_s", "updates_s",
        "target_tokens_s", "max_steps", "forecast_minutes", "graphs", "recompiles",
        "cudagraph_skips",
    ],
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path, help="the folder each part's PART.json is written to")
    ap.add_argument("part", choices=sorted(KEYS))
    ap.add_argument("--data-dir", default="data/multi30k", help="m30k: the Multi30k splits")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, aot_eager")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = setup(args.dry_run)
    events = CompileEvents()  # (a recompile or a skipped CUDA graph slows what is timed)
    if args.part == "mfu":
        size, pack = (TINY, TINY_PACK) if args.dry_run else (BASE, BASE_PACK)
        figures = mfu(device, size, pack)
    else:
        figures = m30k(device, args.data_dir, args.out, args.dry_run)
    write_line(args.out / f"{args.part}.json", {"part": args.part, **figures, **events.counts()})


def setup(dry_run: bool) -> torch.device:
    """The device, set up as every command sets a GPU up (no cuDNN attention), and a cold
    compile (what a new machine pays) in a cache of its own on every core; dry_run: the CPU,
    with aot_eager (Inductor's compile costs minutes on two cores; the graph is the same)."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_")
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(os.cpu_count() or 1)
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = os.cpu_count() or 1
    if dry_run:
        torch.compile = functools.partial(torch.compile, backend="aot_eager")
        return torch.device("cpu")
    from mt.runtime.device import pick_device

    return pick_device("cuda")


def command_line(doc: str, output: str, models: tuple[str, ...] = ()):
    """(the arguments of a GPU part's script, its device set up): OUTDIR (made), --data-dir
    and --dry-run, as gpu_profile.py and gpu_ablate.py take them, and --model where `models`
    names the ones it measures (none given: all); output: what OUTDIR holds."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path, help=f"the folder {output} go to")
    ap.add_argument("--data-dir", default="data/multi30k", help="the Multi30k splits")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, aot_eager")
    if models:
        ap.add_argument("--model", choices=models, help="this one alone (default: every one)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return args, setup(args.dry_run)


def attempt(measure) -> dict:
    """measure()'s figures, or the error that stopped it: one variant or model a kernel
    refuses is a finding, and the others still run."""
    try:
        return measure()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def append_line(path: Path, record: dict) -> None:
    """One more JSON line in `path` (those already there kept: a call cut short keeps them),
    printed without its longest field, "top"."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "top"}), flush=True)


def write_line(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
    tmp.replace(path)
    print(json.dumps(record), flush=True)


# -- the base model's MFU ----------------------------------------------------------------------
def mfu(device: torch.device, size: dict, pack: dict, train: dict | None = None) -> dict:
    """The base model's figures; train: TrainConfig settings of a variant (gpu_ablate.py)."""
    trainer, batches = base_trainer(device, size, pack, train)
    warm, timed = batches[: pack["warmup"]], batches[pack["warmup"] :]
    compile_s = seconds(device, lambda: [trainer.train_step([b]) for b in warm])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before = matmul_peak(device, 8192 if device.type == "cuda" else 256)
    sec = seconds(device, lambda: [trainer.train_step([b]) for b in timed])
    matmul = (before + matmul_peak(device, 8192 if device.type == "cuda" else 256)) / 2
    tokens = sum(b.n_tokens for b in timed)
    flops = sum(packed_flops(b, size) for b in timed)
    sheet = datasheet_peak(device)
    positions = sum(b.tgt_out.numel() for b in timed)
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "block": list(timed[0].tgt_out.shape),
        "updates": len(timed),
        "compile_s": round(compile_s, 1),
        "step_ms": round(1000 * sec / len(timed), 2),
        "target_tokens_s": round(tokens / sec),
        "useful_tflop_s": round(flops / sec / 1e12, 3),
        "matmul_tflop_s": round(matmul / 1e12, 3),
        "datasheet_tflop_s": sheet and round(sheet / 1e12, 1),
        "mfu_datasheet": sheet and round(flops / sec / sheet, 4),
        "mfu_matmul": round(flops / sec / matmul, 4),
        "padding": round(1 - tokens / positions, 4),
        "graphs": graphs_compiled(),
        "peak_gpu_mb": (
            round(torch.cuda.max_memory_allocated() / 2**20) if device.type == "cuda" else None
        ),
    }


def base_trainer(device: torch.device, size: dict, pack: dict, train: dict | None = None):
    """(the base model's Trainer as `mt train` makes it on packed blocks, compiled, bf16, with
    `train`'s settings on top; the warm-up's and the timed updates' batches, in order)."""
    from mt.config import ModelConfig, TrainConfig
    from mt.runtime.device import amp_dtype

    model_cfg = ModelConfig(
        d_model=size["d_model"], n_heads=size["heads"], enc_layers=size["layers"],
        dec_layers=size["layers"], d_ff=size["d_ff"], dropout=0.1, attn_dropout=0.0,
        norm="post", tie_embeddings="all", max_positions=256,
    )  # fmt: skip
    train_cfg = TrainConfig(
        pack_width=pack["pack_width"], max_tokens=pack["max_tokens"], compile=True,
        label_smoothing=0.1, clip_norm=0.0, precision="bf16", warmup=4000,
        **{"update": "device", **(train or {})},
    )  # fmt: skip
    data = synthetic_pairs(size["vocab"], 40 * pack["max_tokens"] // 50, pack["pack_width"] - 1)
    torch.manual_seed(0)
    dtype = amp_dtype(train_cfg.precision, device)
    trainer = mt_trainer(model_cfg, train_cfg, size["vocab"], device, dtype, data=data)
    stream = trainer.batches()
    return trainer, [next(stream) for _ in range(pack["warmup"] + pack["steps"])]


def synthetic_pairs(vocab: int, n: int, longest: int, seed: int = 0):
    """n random pairs of WMT-like lengths (mean 27 subwords, at most `longest`), ids from the
    whole vocabulary."""
    from mt.data.corpus import ParallelData, Stats, TokenArray

    rng = np.random.default_rng(seed)
    s_len = np.clip(rng.normal(27, 12, n).round(), 3, longest).astype(np.int32)
    t_len = np.clip((s_len * rng.normal(1.0, 0.15, n)).round(), 3, longest).astype(np.int32)

    def side(lengths):
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = rng.integers(4, vocab, int(offsets[-1])).astype(np.int32)
        return TokenArray.from_arrays(ids, lengths, offsets)

    return ParallelData(side(s_len), side(t_len), Stats())


def packed_flops(batch, size: dict) -> float:
    """Training FLOPs (forward x 3) of a packed block on its real tokens: each pair's matmuls
    (2*m*n*k) and its attention over its own pair's keys only, the output projection on its
    target positions; the cross-attention's keys and values once per source token."""
    s, t = pair_lengths(batch.packing.src_segments), pair_lengths(batch.packing.tgt_segments)
    d, ff, L, V = size["d_model"], size["d_ff"], size["layers"], size["vocab"]
    enc = s * L * (2 * (4 * d * d + 2 * d * ff) + 4 * s * d)
    dec = t * L * (2 * (4 * d * d + 2 * d * d + 2 * d * ff) + 4 * t * d / 2 + 4 * s * d)
    dec += s * L * 2 * 2 * d * d
    out = t * 2 * d * V
    return float(3 * (enc + dec + out).sum())


def pair_lengths(segments: torch.Tensor) -> np.ndarray:
    """The length of every pair of a block, in the order (row, segment): (R, W) segment numbers
    (0 = padding) -> one length per pair; the source's and the target's line up."""
    seg = segments.cpu().numpy().astype(np.int64)
    rows, width = seg.shape
    key = np.arange(rows)[:, None] * (width + 1) + seg
    counts = np.bincount(key[seg > 0], minlength=rows * (width + 1))
    counts = counts.reshape(rows, width + 1)[:, 1:].ravel()  # every pair has a token (EOS)
    return counts[counts > 0].astype(np.float64)


# -- the shipped Multi30k config ---------------------------------------------------------------
def m30k(
    device: torch.device,
    data_dir: str,
    out: Path,
    dry_run: bool,
    pack_width: int = 128,
    sets: tuple[str, ...] = (),
) -> dict:
    """The shipped config's updates/s; sets: --set options of a variant (gpu_ablate.py)."""
    trainer, cfg = m30k_trainer(device, data_dir, dry_run, pack_width, sets)
    steps = M30K_DRY if dry_run else M30K
    stream = trainer.batches()

    def updates(n: int) -> int:
        tokens = 0
        for _ in range(n):
            batch = next(stream)
            tokens += batch.n_tokens
            trainer.train_step([batch])
        return tokens

    compile_s = seconds(device, lambda: updates(steps["warmup"]))
    tokens: list[int] = []
    sec = seconds(device, lambda: tokens.append(updates(steps["steps"])))
    trainer.close()
    rate = steps["steps"] / sec
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "block": [cfg.train.max_tokens // (2 * cfg.train.pack_width), cfg.train.pack_width],
        "updates": steps["steps"],
        "compile_s": round(compile_s, 1),
        "updates_s": round(rate, 2),
        "target_tokens_s": round(tokens[0] / sec),
        "max_steps": cfg.train.max_steps,
        # the updates alone: the run's 30 validations and its saves come on top
        "forecast_minutes": round(cfg.train.max_steps / rate / 60, 1),
        "graphs": graphs_compiled(),
    }


def m30k_trainer(
    device: torch.device,
    data_dir: str,
    dry_run: bool,
    pack_width: int = 128,
    sets: tuple[str, ...] = (),
):
    """(the shipped En->De config's Trainer, packed `pack_width` wide and compiled, built by
    `mt train`'s own factory in a new run folder; its config). dry_run: on a synthetic corpus,
    tiny."""
    from mt.config.load import load_config
    from mt.train.build import build_trainer

    root = Path(__file__).resolve().parents[2]
    run_dir = Path(tempfile.mkdtemp(prefix="gpu_m30k_"))
    if dry_run:
        data_dir = str(run_dir / "data")
        write_synthetic_multi30k(Path(data_dir))
    overrides = [
        f"data.dir={data_dir}",
        f"train.pack_width={pack_width}",
        "train.compile=true",
        "train.update=device",  # (a GPU's auto; the dry run on the CPU measures the same)
        f"train.device={device.type}",
        *(M30K_DRY_SET if dry_run else []),
        *sets,
    ]
    cfg = load_config(root / "configs/multi30k_en_de.yaml", overrides)
    trainer = build_trainer(cfg, run_dir / "run", log=lambda m: print(m, file=sys.stderr))
    return trainer, cfg


def write_synthetic_multi30k(folder: Path) -> None:
    from mt.data.synthetic import generate

    folder.mkdir(parents=True)
    for split, n, seed in (("train", 600, 0), ("valid", 40, 1), ("test", 40, 2)):
        src, tgt = generate(n, seed)
        (folder / f"{split}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        (folder / f"{split}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")


# -- measuring ---------------------------------------------------------------------------------
def seconds(device: torch.device, work) -> float:
    """Wall seconds of `work()` and the device work it queued: CUDA events on a GPU."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        work()
        return time.perf_counter() - t0
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def graphs_compiled() -> int:
    """The graphs Dynamo made in this process: one per batch shape of the step, and one for
    the update's bookkeeping after it (mt.train.update.exchange.settle)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


if __name__ == "__main__":
    main()
