"""Training throughput of mt's model and train step against two references, same batches:
(a) a plain loop around torch.nn.Transformer, (b) Hugging Face MarianMTModel from scratch.

    python scripts/bench/bench_train.py [--size tiny|small|base|big|both] [--steps N] [--json]
    python scripts/bench/bench_train.py --device cuda --precision bf16 --size base \
        --max-tokens 32768 [--vocab 32000] [--shape-buckets 16 --compile] [--compile-reference]

Each contender runs in its own subprocess so that its peak memory is its own; then all three
run once more in one process, taking turns batch by batch, which gives ratios that a drift in
the machine's speed during the run cannot bias (`ratio_*_turns` in the JSON). Prints target
tokens/s, peak memory (RSS on CPU, allocated GPU memory on CUDA), the ratios ours/reference,
this machine's matmul FLOP/s (fp32 on CPU, bf16 on CUDA) and the FLOP utilization of the useful
(non-padding) training FLOPs. On an H100/H200 the model FLOP utilization (MFU) is also given
against the datasheet dense bf16 peak. With --json the last line is a JSON object (the small
size, or the one size asked for).

Every contender's process starts with the allocator setting `mt train` makes (transparent huge
pages for tensors of 2 MB and more; mt/runtime/memory.py): the ratios compare the training
steps, not allocator settings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from harness import autocast, datasheet_peak, marian_config, matmul_peak, sync, take_turns

from mt.runtime.device import pick_device
from mt.runtime.memory import prefer_huge_pages

prefer_huge_pages()  # as mt train sets it, before the first large allocation, for every contender

SIZES = {
    # the shipped Multi30k CPU configs' shape (Wu et al. 2021's transformer_tiny, joint 5k BPE)
    "tiny": {
        "layers": 4,
        "d_model": 128,
        "heads": 4,
        "d_ff": 256,
        "vocab": 5000,
        "max_tokens": 8192,
    },
    "small": {
        "layers": 3,
        "d_model": 256,
        "heads": 4,
        "d_ff": 1024,
        "vocab": 8000,
        "max_tokens": 8192,
    },
    "base": {
        "layers": 6,
        "d_model": 512,
        "heads": 8,
        "d_ff": 2048,
        "vocab": 8000,
        "max_tokens": 8192,
    },
    # Transformer-big (Vaswani et al. 2017)
    "big": {
        "layers": 6,
        "d_model": 1024,
        "heads": 16,
        "d_ff": 4096,
        "vocab": 8000,
        "max_tokens": 8192,
    },
}
PAD, BOS, EOS = 0, 2, 3
# mt's contender trains as `mt train` would (train.fast_paths "auto": mt/fast on a CPU only);
# --no-fast-paths: the reference model and loss anywhere (false); --fast-paths: mt/fast on any
# device (true), e.g. to measure it again on a GPU (0.82x nn.Transformer on an H200 with it,
# 1.13x without it: docs/gpu.md).
FAST_PATHS = "auto"
# how mt's contender makes an update (train.update; auto: plain in one CPU process, device on
# a GPU); --compare-updates times the two kinds against each other
UPDATE = "auto"


def make_batches(size: dict, n_batches: int, seed: int = 0):
    """Multi30k-like sentence lengths (src ~ 14, tgt ~ 13 subwords), bucketed into batches of
    about max_tokens (source + target, padding included: about 4k target tokens). With
    size["shape_buckets"] N, as train.shape_buckets makes them: widths rounded up to multiples
    of N and a fixed row count per width pair, so the batches come in a few shapes. Each batch
    is (src, tgt_in, tgt_out, target tokens), the count known on the host."""
    from mt.data.batching import bucket_batches, round_up, token_batches

    rng = np.random.default_rng(seed)
    n = max(40_000, (n_batches + 1) * size["max_tokens"] // 24)  # pairs: ~31 tokens each
    src_len = np.clip(rng.normal(14, 5, n).round(), 3, 60).astype(int)
    tgt_len = np.clip((src_len * rng.normal(1.0, 0.15, n)).round(), 3, 60).astype(int)
    multiple = size.get("shape_buckets", 0)
    if multiple:
        order = bucket_batches(src_len + 1, tgt_len + 1, size["max_tokens"], multiple, seed)
    else:
        order = token_batches(src_len + 1, tgt_len + 1, size["max_tokens"], seed=seed)
    batches = []
    for idx in order[:n_batches]:
        rows = len(idx)
        idx = idx[idx >= 0]  # (bucket_batches fills a width pair's last batch with -1 rows)
        s, t = src_len[idx], tgt_len[idx]
        s_w, t_w = int(s.max()) + 1, int(t.max()) + 1
        if multiple:
            s_w, t_w = int(round_up(s_w, multiple)), int(round_up(t_w, multiple))
        src = torch.full((rows, s_w), PAD)
        tgt_in = torch.full((rows, t_w), PAD)
        tgt_out = torch.full((rows, t_w), PAD)
        for i in range(len(idx)):
            src[i, : s[i]] = torch.from_numpy(rng.integers(4, size["vocab"], s[i]))
            src[i, s[i]] = EOS
            words = torch.from_numpy(rng.integers(4, size["vocab"], t[i]))
            tgt_in[i, 0], tgt_in[i, 1 : t[i] + 1] = BOS, words
            tgt_out[i, : t[i]], tgt_out[i, t[i]] = words, EOS
        batches.append((src, tgt_in, tgt_out, int(t.sum() + len(t))))
    return batches


def useful_flops(batch, size: dict) -> float:
    """Training FLOPs (forward x 3) on real tokens only: matmuls 2*m*n*k, attention scores and
    weighted sums over real keys, output projection on real target positions."""
    src, _, tgt_out, _ = batch
    d, ff, L, V = size["d_model"], size["d_ff"], size["layers"], size["vocab"]
    s_len = (src != PAD).sum(1).double()
    t_len = (tgt_out != PAD).sum(1).double()
    enc = s_len * L * (2 * (4 * d * d + 2 * d * ff) + 4 * s_len * d)
    dec = t_len * L * (2 * (4 * d * d + 2 * d * d + 2 * d * ff) + 4 * t_len * d / 2 + 4 * s_len * d)
    dec += s_len * L * 2 * 2 * d * d  # cross-attention K,V of the memory
    out = t_len * 2 * d * V
    return float(3 * (enc + dec + out).sum())


# -- the three contenders: each returns a step(batch) closure --------------------------------
def ours(size, device, precision="fp32", compile=False, loss_fn=None, dropout=0.1, update=None):
    """mt's model and its real training step: Trainer.train_step with the fast paths and the
    loss that mt.train.parts.build_objective chooses (or `loss_fn`, e.g. an R-Drop loss:
    scripts/bench/bench_rdrop.py). Gradient clipping is off here, as the references do none."""
    from mt.config import ModelConfig, TrainConfig
    from mt.data.batching import Batch

    model_cfg = ModelConfig(
        d_model=size["d_model"],
        n_heads=size["heads"],
        enc_layers=size.get("enc_layers", size["layers"]),
        dec_layers=size.get("dec_layers", size["layers"]),
        d_ff=size["d_ff"],
        dropout=dropout,
        attn_dropout=0.0,
        norm="post",
        tie_embeddings="all",
        max_positions=256,
    )
    train_cfg = TrainConfig(
        label_smoothing=0.1,
        clip_norm=0.0,
        compile=compile,
        fast_paths=FAST_PATHS,
        # batches in a few shapes: compiled with static shapes, replayed as CUDA graphs on a GPU
        shape_buckets=size.get("shape_buckets", 0),
        update=update or UPDATE,
    )
    amp = torch.bfloat16 if precision == "bf16" else None
    trainer = mt_trainer(model_cfg, train_cfg, size["vocab"], device, amp, loss_fn)

    def step(batch):
        src, tgt_in, tgt_out, n_tokens = batch  # (counted on the host: no sync here)
        trainer.train_step([Batch(src, tgt_in, tgt_out, n_tokens)])

    return trainer.model, step


def mt_trainer(
    model_cfg, train_cfg, vocab: int, device, amp_dtype, loss_fn=None, data=None, dist=None
):
    """mt's model and Trainer for these configs as `mt train` chooses them (the fast paths
    where they apply, the reference model under train.compile; the objective
    mt.train.parts.build_objective makes, or `loss_fn` label-smoothed by 0.1), with no run
    directory or validation; data: the training pairs its batches() walks; dist: this rank's
    mt.runtime.distributed.Dist (scripts/bench/bench_ddp.py), or one process."""
    import functools

    from mt.config import Config
    from mt.model import REFERENCE, build_model
    from mt.objectives import Objective
    from mt.train.parts import build_objective, for_device, model_parts
    from mt.train.trainer import Trainer
    from mt.train.update.schedule import build_optimizer

    train_cfg = for_device(Config(model=model_cfg, train=train_cfg), device)[0].train
    compile = train_cfg.compile is True
    parts = model_parts(train_cfg, device, compile=compile)  # as mt train chooses
    model = build_model(model_cfg, vocab, vocab, parts).to(device)
    fused = parts is not REFERENCE and not compile
    objective = (
        build_objective(Config(model=model_cfg, train=train_cfg), fused=fused)
        if loss_fn is None
        else Objective(loss=functools.partial(loss_fn, eps=0.1))
    )
    optimizer, scheduler = build_optimizer(model.parameters(), train_cfg, model_cfg.d_model)
    return Trainer(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=torch.amp.GradScaler(device.type, enabled=False),
        train_data=data,
        validation=None,
        tokenizer=None,
        cfg=train_cfg,
        run_config={},
        run_dir=Path("."),
        device=device,
        objective=objective,
        amp_dtype=amp_dtype,
        dist=dist,
    )


class _TorchRef(torch.nn.Module):
    def __init__(self, size):
        super().__init__()
        d = size["d_model"]
        self.d = d
        self.embed = torch.nn.Embedding(size["vocab"], d, padding_idx=PAD)
        from mt.model.positions import sinusoidal_table

        self.register_buffer("pe", sinusoidal_table(256, d))
        self.core = torch.nn.Transformer(
            d,
            size["heads"],
            size["layers"],
            size["layers"],
            size["d_ff"],
            dropout=0.1,
            batch_first=True,
        )
        self.out = torch.nn.Linear(d, size["vocab"], bias=False)
        self.out.weight = self.embed.weight

    def forward(self, src, tgt_in):
        def e(x):
            return self.embed(x) * math.sqrt(self.d) + self.pe[: x.shape[1]]

        t = tgt_in.shape[1]  # bool, like the padding masks: True = may not attend
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt_in.device).triu(1)
        h = self.core(
            e(src),
            e(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src == PAD,
            tgt_key_padding_mask=tgt_in == PAD,
            memory_key_padding_mask=src == PAD,
        )
        return self.out(h)


def _reference_step(model, logits_of):
    """The plain loop of the references: full-vocabulary logits at every position (padding
    included), cross-entropy with label smoothing, Adam."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(batch):
        src, tgt_in, tgt_out, _ = batch
        logits = logits_of(src, tgt_in)
        loss = F.cross_entropy(
            logits.view(-1, logits.shape[-1]),
            tgt_out.view(-1),
            ignore_index=PAD,
            label_smoothing=0.1,
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return model, step


def torch_ref(size, device, precision="fp32", compile=False):
    """nn.Transformer in a plain loop; compile: its model compiled as mt's train.compile
    compiles (mt.train.update.compiled: dynamic shapes, or static ones with
    size["shape_buckets"] and
    the same raised recompilation limit), to compare compiled with compiled."""
    from mt.train.update.compiled import compiled

    model = _TorchRef(size).to(device)
    if not compile:
        return _reference_step(model, model)
    return _reference_step(model, compiled(model, bool(size.get("shape_buckets"))))


def hf_marian(size, device, precision="fp32", compile=False):
    from transformers import MarianMTModel

    cfg = marian_config(
        size["vocab"], size["d_model"], size["layers"], size["heads"], size["d_ff"],
        dropout=0.1, attention_dropout=0.0, scale_embedding=True,
    )  # fmt: skip
    model = MarianMTModel(cfg).to(device)
    return _reference_step(
        model,
        lambda src, tgt_in: (
            model(
                input_ids=src,
                attention_mask=src != PAD,
                decoder_input_ids=tgt_in,
                decoder_attention_mask=tgt_in != PAD,
            ).logits
        ),
    )


CONTENDERS = {"ours": ours, "torch": torch_ref, "hf": hf_marian}


def size_of(name: str, max_tokens: int, vocab: int = 0, shape_buckets: int = 0) -> dict:
    """The hyper-parameters of size `name`, with --max-tokens and --vocab when given (0: the
    size's own), and --shape-buckets."""
    given = {"max_tokens": max_tokens, "vocab": vocab, "shape_buckets": shape_buckets}
    return dict(SIZES[name], **{k: v for k, v in given.items() if v})


def device_batches(size: dict, n: int, device: torch.device) -> list[tuple]:
    return [(*(x.to(device) for x in b[:3]), b[3]) for b in make_batches(size, n)]


def target_tokens(batches) -> int:
    return sum(b[3] for b in batches)


def run_one(
    name: str,
    size: dict,
    steps: int,
    warmup: int,
    device: torch.device,
    precision: str,
    compile_ours: bool,
    matmul_n: int = 2048,
    compile_reference: bool = False,
) -> dict:
    """Runs in a fresh subprocess: (tokens/s, peak memory MB, useful FLOP/s). matmul_n: the
    size of the product that measures the machine's matmul speed (on CPU)."""
    torch.manual_seed(0)
    batches = device_batches(size, warmup + steps, device)
    compile = {"ours": compile_ours, "torch": compile_reference}.get(name, False)
    model, step = CONTENDERS[name](size, device, precision, compile)
    model.train()
    amp = autocast(device, precision)

    def run(bs):
        for b in bs:
            with amp:
                step(b)

    run(batches[:warmup])
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    tokens = target_tokens(batches[warmup:])
    flops = sum(useful_flops(b, size) for b in batches[warmup:])
    first_sight = None
    if device.type == "cuda":
        # On a GPU the first steps were far slower than later ones: on an H100 the shipped
        # Multi30k config trained about 4 updates/s for ~1.5 epochs (121 batches each, whose
        # shapes recur every epoch) and 21/s after, and this script's 20 fresh shapes gave
        # every contender about 1% MFU (docs/gpu.md). The likely cause is a one-time setup per
        # new shape, not yet measured apart. A training run meets its shapes again every
        # epoch, so the timed pass is a second pass over the same batches; the first pass is
        # reported beside it.
        t0 = time.perf_counter()
        run(batches[warmup:])
        sync(device)
        first_sight = tokens / (time.perf_counter() - t0)
    # The machine's matmul speed right before and after the timed steps: this VM's speed
    # drifts by tens of percent within minutes, so a peak measured apart from the run can put
    # the utilization anywhere (once above 100%).
    before = matmul_peak(device, matmul_n)
    t0 = time.perf_counter()
    run(batches[warmup:])
    sync(device)
    sec = time.perf_counter() - t0
    padded = sum(b[2].numel() for b in batches[warmup:])
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if device.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    matmul = (before + matmul_peak(device, matmul_n)) / 2  # after reading the peak memory
    return {
        "tok_s": tokens / sec,
        "tok_s_first_sight": first_sight,
        "peak_rss_mb": peak,
        "flop_s": flops / sec,
        "matmul_flop_s": matmul,
        "padding": 1 - tokens / padded,
        "params": sum(p.numel() for p in model.parameters()),
    }


def interleaved_seconds(
    size: dict,
    steps: int,
    warmup: int,
    device: torch.device,
    precision: str,
    contenders: dict | None = None,
    compile_ours: bool = False,
) -> tuple[dict, int]:
    """All three contenders (or `contenders`: name -> maker like `ours`) in this one process,
    taking turns batch by batch (which one goes first rotates): a drift in the machine's speed,
    which on this VM reaches tens of percent within a minute, then hits all alike, and the
    ratios hold. Returns (seconds of the timed steps per contender, target tokens in them);
    memory is left to the separate runs (here the contenders share one heap). compile_ours:
    mt's contender compiled (as --compile)."""
    contenders = contenders or CONTENDERS
    batches = device_batches(size, warmup + steps, device)
    steps_of = {}
    for name, make in contenders.items():
        torch.manual_seed(0)
        compiled = {"compile": True} if compile_ours and name == "ours" else {}
        model, steps_of[name] = make(size, device, precision, **compiled)
        model.train()
    if device.type == "cuda":  # every shape seen once before the timed turns (run_one)
        batches, warmup = batches + batches[warmup:], len(batches)
    secs = take_turns(steps_of, batches, warmup, device, lambda: autocast(device, precision))
    return secs, target_tokens(batches[warmup:])


def run_interleaved(
    size: dict,
    steps: int,
    warmup: int,
    device: torch.device,
    precision: str,
    contenders: dict | None = None,
    compile_ours: bool = False,
) -> dict:
    """interleaved_seconds as target tokens/s per contender."""
    secs, tokens = interleaved_seconds(
        size, steps, warmup, device, precision, contenders, compile_ours
    )
    return {name: tokens / sec for name, sec in secs.items()}


def measure(size_name: str, args) -> dict:
    """Each contender `--repeats` times, interleaved (drift in the machine's speed then hits
    all three alike). Returns the median run of each contender by tokens/s (with the matmul
    speed measured around that run; peak memory is the largest seen)."""
    runs = {name: [] for name in CONTENDERS}
    for _ in range(args.repeats):
        for name in CONTENDERS:
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    name,
                    "--size",
                    size_name,
                    "--steps",
                    str(args.steps),
                    "--warmup",
                    str(args.warmup),
                    "--device",
                    args.device,
                    "--precision",
                    args.precision,
                    *(["--max-tokens", str(args.max_tokens)] if args.max_tokens else []),
                    *(["--vocab", str(args.vocab)] if args.vocab else []),
                    *(["--shape-buckets", str(args.shape_buckets)] if args.shape_buckets else []),
                    *(["--compile"] if args.compile else []),
                    *(["--compile-reference"] if args.compile_reference else []),
                    *{True: ["--fast-paths"], False: ["--no-fast-paths"]}.get(FAST_PATHS, []),
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            # each run as it ends, to stderr: a call cut by a time limit keeps what it measured
            print(
                f"[{size_name}] {name}: "
                + json.dumps(
                    {
                        k: round(v, 1) if isinstance(v, float) else v
                        for k, v in runs[name][-1].items()
                    }
                ),
                file=sys.stderr,
                flush=True,
            )
    res = {}
    for name, rs in runs.items():
        rs = sorted(rs, key=lambda r: r["tok_s"])
        res[name] = dict(rs[len(rs) // 2], peak_rss_mb=max(r["peak_rss_mb"] for r in rs))
    turns = run_interleaved(
        size_of(size_name, args.max_tokens, args.vocab, args.shape_buckets),
        args.steps,
        args.warmup,
        torch.device(args.device),
        args.precision,
        compile_ours=args.compile,
    )
    for name in CONTENDERS:
        res[name]["tok_s_turns"] = turns[name]
    return res


def report(size_name: str, res: dict, args, mem: str, kind: str, sheet: float | None) -> None:
    o, r, h = res["ours"], res["torch"], res["hf"]
    peak = o["matmul_flop_s"]
    print(
        f"\n[{size_name}] {o['params'] / 1e6:.1f}M params, padding {o['padding']:.1%} of target "
        f"positions; median of {args.repeats} interleaved runs each"
    )
    print(f"{'':12}{'tgt tok/s':>12}{mem:>14}{'useful GFLOP/s':>16}")
    for name, label in (("ours", "mt"), ("torch", "nn.Transformer"), ("hf", "HF Marian")):
        x = res[name]
        print(f"{label:14}{x['tok_s']:>10.0f}{x['peak_rss_mb']:>14.0f}{x['flop_s'] / 1e9:>16.1f}")
    print(
        f"in one process, taking turns batch by batch: mt {o['tok_s_turns']:.0f}, "
        f"nn.Transformer {r['tok_s_turns']:.0f}, HF Marian {h['tok_s_turns']:.0f} tok/s: "
        f"{o['tok_s_turns'] / r['tok_s_turns']:.2f}x and "
        f"{o['tok_s_turns'] / h['tok_s_turns']:.2f}x"
    )
    print(
        f"ratio mt / nn.Transformer: {o['tok_s'] / r['tok_s']:.2f}x   "
        f"mt / HF Marian: {o['tok_s'] / h['tok_s']:.2f}x   "
        f"FLOP utilization: {o['flop_s'] / peak:.1%} of the measured {kind} matmul "
        f"({peak / 1e9:.1f} GFLOP/s, around that run)"
        + (f"   MFU: {o['flop_s'] / sheet:.1%} of the datasheet peak" if sheet else "")
    )
    if o.get("tok_s_first_sight"):
        print(
            "first pass over the batch shapes (untimed above): "
            + ", ".join(
                f"{label} {res[name]['tok_s_first_sight']:.0f}"
                for name, label in (
                    ("ours", "mt"),
                    ("torch", "nn.Transformer"),
                    ("hf", "HF Marian"),
                )
            )
            + " tok/s"
        )


def summarize(
    size_name: str, res: dict, args, where: str, preload: str, sheet: float | None
) -> dict:
    """The JSON summary of one size."""
    o, r, h = res["ours"], res["torch"], res["hf"]
    peak = o["matmul_flop_s"]
    return {
        "size": size_name,
        "ours_tok_s": round(o["tok_s"], 1),
        "ref_tok_s": round(r["tok_s"], 1),
        "hf_tok_s": round(h["tok_s"], 1),
        "ratio_ref": round(o["tok_s"] / r["tok_s"], 3),
        "ratio_hf": round(o["tok_s"] / h["tok_s"], 3),
        "ratio_ref_turns": round(o["tok_s_turns"] / r["tok_s_turns"], 3),
        "ratio_hf_turns": round(o["tok_s_turns"] / h["tok_s_turns"], 3),
        "flop_utilization": round(o["flop_s"] / peak, 3),
        "matmul_gflop_s": round(peak / 1e9, 1),
        "ours_peak_rss_mb": round(o["peak_rss_mb"]),
        "ref_peak_rss_mb": round(r["peak_rss_mb"]),
        "hf_peak_rss_mb": round(h["peak_rss_mb"]),
        "padding": round(o["padding"], 3),
        "device": where,
        "precision": args.precision,
        "ld_preload": preload,
        **({"mfu": round(o["flop_s"] / sheet, 3)} if sheet else {}),
    }


def compare_updates(args, device: torch.device) -> None:
    """mt's plain update against its device update (train.update), in one process taking
    turns batch by batch, `--repeats` times: the median tokens/s of each and their ratio."""
    import functools
    import statistics

    size_name = "small" if args.size == "both" else args.size
    size = size_of(size_name, args.max_tokens, args.vocab, args.shape_buckets)
    kinds = {k: functools.partial(ours, update=k) for k in ("plain", "device")}
    runs = [
        run_interleaved(size, args.steps, args.warmup, device, args.precision, kinds)
        for _ in range(args.repeats)
    ]
    ratios = [r["plain"] / r["device"] for r in runs]
    tok_s = {k: statistics.median(r[k] for r in runs) for k in kinds}
    print(f"{size_name}, {args.precision}, {torch.get_num_threads()} CPU threads"
          if device.type == "cpu" else f"{size_name}, {args.precision}, {device}")  # fmt: skip
    for k in kinds:
        print(f"  train.update {k:6s} {tok_s[k]:10.1f} target tokens/s")
    print(f"  plain / device: {statistics.median(ratios):.3f} (median of {len(ratios)} runs: "
          f"{', '.join(f'{r:.3f}' for r in ratios)})")  # fmt: skip
    if args.json:
        rates = {f"{k}_tok_s": round(v, 1) for k, v in tok_s.items()}
        ratio = statistics.median(ratios)
        print(json.dumps({"size": size_name, **rates, "ratio_plain_device": ratio}))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", choices=[*SIZES, "both"], default="both")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved runs of each contender; the median is reported",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16 = torch.autocast(bfloat16) around every contender's step",
    )
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=0,
        help="tokens per batch (source + target); default: the size's 8192",
    )
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary; default: the size's")
    ap.add_argument(
        "--shape-buckets",
        type=int,
        default=0,
        help="batches as train.shape_buckets makes them (widths rounded up to multiples of N, "
        "a few shapes), for every contender; mt trains with that setting",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile mt's model and loss as train.compile does (dynamic shapes; with "
        "--shape-buckets static ones, replayed as CUDA graphs on a GPU)",
    )
    ap.add_argument(
        "--compile-reference",
        action="store_true",
        help="torch.compile nn.Transformer's model too (HF Marian stays eager)",
    )
    paths = ap.add_mutually_exclusive_group()
    paths.add_argument(
        "--no-fast-paths",
        action="store_true",
        help="mt's contender without mt/fast: the reference model and loss",
    )
    paths.add_argument(
        "--fast-paths",
        action="store_true",
        help="mt's contender with mt/fast on any device (default: on a CPU only)",
    )
    ap.add_argument(
        "--update",
        choices=["auto", "plain", "device"],
        default="auto",
        help="mt's update (train.update; auto: plain in one CPU process, device on a GPU)",
    )
    ap.add_argument(
        "--compare-updates",
        action="store_true",
        help="time mt's two kinds of update (train.update plain and device) against each "
        "other, taking turns batch by batch, instead of the three contenders",
    )
    ap.add_argument("--worker", choices=list(CONTENDERS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    global FAST_PATHS, UPDATE
    FAST_PATHS = False if args.no_fast_paths else True if args.fast_paths else "auto"
    UPDATE = args.update
    # the device set up as `mt train` sets it up (on a GPU: no cuDNN attention), for every
    # contender alike
    device = pick_device(args.device, "--device")
    if args.worker:
        print(
            json.dumps(
                run_one(
                    args.worker,
                    size_of(args.size, args.max_tokens, args.vocab, args.shape_buckets),
                    args.steps,
                    args.warmup,
                    device,
                    args.precision,
                    args.compile,
                    compile_reference=args.compile_reference,
                )
            )
        )
        return
    if args.compare_updates:
        compare_updates(args, device)
        return
    sheet = datasheet_peak(device)
    where = (
        torch.cuda.get_device_name(0)
        if device.type == "cuda"
        else f"{torch.get_num_threads()} CPU threads"
    )
    kind = "bf16" if device.type == "cuda" else "fp32"
    preload = os.environ.get("LD_PRELOAD", "")  # e.g. scripts/mkl_amd_shim.sh's library
    print(
        f"torch {torch.__version__}, {where}, {args.precision}"
        + {
            True: ", mt with its fast paths forced on",
            False: ", mt without its fast paths (reference model and loss)",
        }.get(FAST_PATHS, "")
        + (f", vocabulary {args.vocab}" if args.vocab else "")
        + (f", batch widths in multiples of {args.shape_buckets}" if args.shape_buckets else "")
        + (", mt compiled" if args.compile else "")
        + (", nn.Transformer compiled" if args.compile_reference else "")
        + (f", datasheet dense bf16 {sheet / 1e12:.0f} TFLOP/s" if sheet else "")
        + (f", LD_PRELOAD={preload} (every contender runs with it)" if preload else "")
    )
    mem = "peak GPU MB" if device.type == "cuda" else "peak RSS MB"
    summary = {}
    for size_name in ["small", "base"] if args.size == "both" else [args.size]:
        res = measure(size_name, args)
        report(size_name, res, args, mem, kind, sheet)
        if size_name == "small" or args.size != "both":
            summary = summarize(size_name, res, args, where, preload, sheet)
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
