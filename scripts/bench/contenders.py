"""What the training benchmarks race, shared by them all (bench_train.py, race.py,
bench_ddp.py, bench_rdrop.py, gpu_figures.py, gpu_shape_probe.py): the model sizes,
Multi30k-like batches, the useful FLOPs of a batch, the contenders (mt's model and real
training step, a plain loop around torch.nn.Transformer, Hugging Face MarianMTModel) and the
loop that makes them take turns batch by batch in one process.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from harness import autocast, marian_config, take_turns

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


def run_interleaved(*args, **kwargs) -> dict:
    """interleaved_seconds as target tokens/s per contender."""
    secs, tokens = interleaved_seconds(*args, **kwargs)
    return {name: tokens / sec for name, sec in secs.items()}
