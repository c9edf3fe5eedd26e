"""What the benchmark scripts share: waiting for the device, the machine's matmul speed,
taking turns (contenders run one after another on each batch, who goes first rotating, so
that a drift in the machine's speed hits all alike), and the HF Marian model of mt's shape.

The scripts import it, and each other, as sibling modules: `python scripts/NAME.py` puts
scripts/ on the module path, and mt itself comes from the installed package
(`bash scripts/setup.sh` or `pip install -e .`)."""

from __future__ import annotations

import contextlib
import time

import torch

# Datasheet dense bf16 tensor-core peaks (FLOP/s), the denominator of MFU.
DATASHEET_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}


def marian_config(vocab: int, d_model: int, layers: int, heads: int, d_ff: int, **more):
    """transformers' MarianConfig of an mt Transformer's shape (ReLU, 256 positions, mt's
    PAD/EOS/BOS ids, shared embeddings); `more`: the contender's own settings."""
    from transformers import MarianConfig

    from mt.tokens import BOS, EOS, PAD

    return MarianConfig(
        vocab_size=vocab,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=d_ff,
        decoder_ffn_dim=d_ff,
        activation_function="relu",
        max_position_embeddings=256,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        share_encoder_decoder_embeddings=True,
        **more,
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device: torch.device, n: int = 2048, reps: int = 20) -> float:
    """Measured FLOP/s of one large matrix product: fp32 on CPU, bf16 on CUDA."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def datasheet_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(0)
    return next((v for k, v in DATASHEET_BF16.items() if k in name), None)


def autocast(device: torch.device, precision: str):
    """bf16 autocast around a step, or nothing for fp32."""
    return (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if precision == "bf16"
        else contextlib.nullcontext()
    )


def take_turns(
    runners: dict, items: list, warmup: int, device: torch.device, around=contextlib.nullcontext
) -> dict:
    """Each runner (name -> callable(item)) on every item in turn, the one that goes first
    rotating from item to item (the first timed item in the runners' order); the first
    `warmup` items are not timed. Returns the seconds each runner spent on the timed items."""
    names = list(runners)
    secs = dict.fromkeys(names, 0.0)
    for i, item in enumerate(items):
        turn = (i - warmup) % len(names)
        for name in names[turn:] + names[:turn]:
            sync(device)
            t0 = time.perf_counter()
            with around():
                runners[name](item)
            sync(device)
            if i >= warmup:
                secs[name] += time.perf_counter() - t0
    return secs


# What torch.compile did behind a measurement's back: a recompile (a guard failed, so a graph
# was made again) or a CUDA graph skipped (Inductor ran the graph without one) makes a step
# slower without an error. Counted from torch's own recompile log and Inductor's counter.
RECOMPILE_LINE = "Recompiling function"
CUDAGRAPH_SKIP_LINE = "skipping cudagraphs"
# what a subprocess (mt train) gets, so that its log holds both kinds of line
TORCH_LOGS = "recompiles,cudagraphs"


def compile_events_in(text: str) -> dict:
    """{"recompiles", "cudagraph_skips"} told by a log written with TORCH_LOGS."""
    return {
        "recompiles": text.count(RECOMPILE_LINE),
        "cudagraph_skips": text.count(CUDAGRAPH_SKIP_LINE),
    }


class CompileEvents:
    """The recompiles and CUDA-graph skips of this process from its making on: torch's
    recompile log (switched on, its records counted here and still printed) and Inductor's
    cudagraph_skips counter."""

    def __init__(self) -> None:
        import logging

        from torch._dynamo.utils import counters

        self.counters, self.recompiles = counters, 0
        self.skips_before = counters["inductor"]["cudagraph_skips"]
        torch._logging.set_logs(recompiles=True)
        events = self

        class Count(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                events.recompiles += RECOMPILE_LINE in record.getMessage()

        logging.getLogger("torch._dynamo.guards.__recompiles").addHandler(Count())

    def counts(self) -> dict:
        skips = self.counters["inductor"]["cudagraph_skips"] - self.skips_before
        return {"recompiles": self.recompiles, "cudagraph_skips": skips}
