"""One decoder step of the search: the next token's log-probabilities after the tokens so far,
over the search's cache (mt/decode/cache.py), or without one (the whole prefix again: the
reference). With a static cache every call of a search sees the same shapes and addresses, so
the step can run compiled, with CUDA graphs on a GPU (`CompiledStep`)."""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.fx.experimental._config as shape_config

from mt.decode.cache import BufferPool, DecodeCache, Static
from mt.errors import first_line
from mt.tokens import BOS, EOS, PAD, UNK

# Never emitted: padding, BOS or <unk> (fairseq bans pad and bos too): an <unk> detokenizes to
# " ⁇ " in the user's output, and the others end a sentence in nonsense. They are the ids before
# EOS, so a slice bans them (an index of a Python list is a copy from the host every step).
assert tuple(range(EOS)) == (PAD, UNK, BOS)
ROOM = 32  # a static cache's positions: the longest output rounded up to a multiple of this


def decoder_step(model, tokens, memory, pad_mask, cache, step):
    """log-probabilities (N, V) of the token after `tokens`: (N, 1) at position `step` (a
    (1,) tensor with a static cache) with a cache; the whole prefix (N, step + 1) without."""
    if cache is None:
        h = model.decode(tokens, memory, pad_mask)[:, -1:]
    else:
        h = model.decode(tokens, memory, pad_mask, cache=cache, start=step)
    # The output layer and log-softmax run in fp32 even under autocast: bf16 logits (8 bits of
    # mantissa) make close candidates tie or swap, so GPU and CPU would pick different words.
    with torch.autocast(h.device.type, enabled=False):
        logits = model.project(h[:, -1].float())  # (N, V), a new tensor
    lprobs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: no new (N, V)
    lprobs[:, :EOS].fill_(-float("inf"))  # PAD, UNK, BOS: never produced
    return lprobs


# What the compiled decoder step costs and saves on a GPU. Its compile takes seconds to tens of
# seconds: cold (Inductor's cache holds none of its kernels: a new machine, another torch) about
# COLD_COMPILE_S, warm (this cache compiled the step before: its kernels are read from disk)
# about WARM_COMPILE_S; each CUDA-graphed step then saves about SAVED_PER_STEP_S of launches
# over the eager step. These are the assumed figures until a GPU measures them
# (scripts/gpu_check.sh decode: compiled_first_s, warm_process_first_s and eager_s; docs/gpu.md).
# decode.compile_step auto compiles for a job whose decoder steps repay the price that applies.
COLD_COMPILE_S, WARM_COMPILE_S, SAVED_PER_STEP_S = 30.0, 6.0, 0.003


def compile_price(device: torch.device) -> tuple[float, str]:
    """(the seconds a compile of the decoder step is assumed to cost here, "cold" or
    "warm"): warm where this compile cache holds the step from an earlier compile."""
    if compiled_marker(device).is_file():
        return WARM_COMPILE_S, "warm"
    return COLD_COMPILE_S, "cold"


def compiled_marker(device: torch.device) -> Path:
    """The file that says the decoder step was compiled for this device and torch in the
    compile cache in use (written after its first compiled call)."""
    from mt.runtime.env import use_compile_cache

    use_compile_cache()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    tag = re.sub(r"[^A-Za-z0-9.]+", "_", f"{name}-{torch.__version__}")
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / f"mt-decoder-step-{tag}"


def compile_pays(choice: str, device: torch.device, steps: float) -> bool:
    """decode.compile_step: always, never, or auto: on a GPU for a job of `steps` decoder steps
    (math.inf: a server's) whose savings repay the compile's price here (compile_price)."""
    if choice != "auto":
        return choice == "always"
    return device.type == "cuda" and steps * SAVED_PER_STEP_S >= compile_price(device)[0]


class CompiledStep:
    """decoder_step under torch.compile, one graph without breaks, and the static caches'
    buffers, kept by a translator from one search to the next. Compiled once for every batch
    size, source length and cache room (dynamic shapes: a job's batches differ in all three);
    on a GPU each shape's step is then recorded as a CUDA graph (mode reduce-overhead), a
    replay instead of a few hundred launches. A compiler or GPU that cannot take the graph
    makes decoding slower, never impossible: the step falls back to decoder_step, said once
    on stderr. backend: another backend (tests use aot_eager or eager on the CPU)."""

    def __init__(self, device: torch.device, backend: str | None = None, warn=None):
        from mt.runtime.env import use_compile_cache

        use_compile_cache()
        self.fn: Callable[..., torch.Tensor]
        if backend is None and device.type == "cuda":
            self.fn = torch.compile(
                decoder_step, fullgraph=True, dynamic=True, mode="reduce-overhead"
            )
        elif backend is None:  # (torch.compile's default backend: Inductor)
            self.fn = torch.compile(decoder_step, fullgraph=True, dynamic=True)
        else:
            self.fn = torch.compile(decoder_step, fullgraph=True, dynamic=True, backend=backend)
        self.pool = BufferPool()
        self.warn = warn or (lambda message: print(message, file=sys.stderr))
        # Inductor's kernels for this device, to be marked as in the cache once they ran
        self.unmarked = compiled_marker(device) if backend is None else None

    def __call__(self, *args) -> torch.Tensor:
        try:
            # each size its own symbol: two sizes equal at the first call (a source length
            # and the model's width, say) would otherwise be assumed equal, and recompiled
            with shape_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]
                out = self.fn(*args)
            if self.unmarked is not None and self.fn is not decoder_step:
                _mark(self.unmarked)
                self.unmarked = None
            return out
        except Exception as e:  # Dynamo's, Inductor's and CUDA graphs' errors alike
            if self.fn is decoder_step:
                raise
            first = first_line(e)
            self.warn(
                f"warning: the compiled decoder step failed ({type(e).__name__}: {first}); "
                f"decoding without it (decode.compile_step: never skips the attempt)"
            )
            self.fn = decoder_step
            return decoder_step(*args)  # the same cache write at the same position


class Decoder:
    """The search's decoder steps over its cache: growing (`DecodeCache`), none (use_cache
    False), or static through a compiled step (`compiled`, where the model takes one: room for
    `steps` positions, rounded up so that batches of similar lengths share their buffers'
    shapes and CUDA graphs)."""

    def __init__(
        self,
        model,
        steps: int,
        use_cache: bool,
        per_sentence: bool,
        compiled: CompiledStep | None,
        device: torch.device,
    ):
        self.model = model
        self.static: Static | None = None
        self.step_fn: Callable[..., torch.Tensor] = decoder_step
        if use_cache and compiled is not None and model.static_cache:
            room = min(-(-steps // ROOM) * ROOM, model.max_positions)
            self.static, self.step_fn = Static(room, device, compiled.pool), compiled
        self.cache = (
            DecodeCache(model.cache_layers, per_sentence, self.static) if use_cache else None
        )

    def __call__(self, hyps: torch.Tensor, memory, pad_mask, step: int) -> torch.Tensor:
        """(N, V) after the hypotheses `hyps` (N, step + 1), BOS first."""
        if self.cache is None:
            return decoder_step(self.model, hyps, memory, pad_mask, None, step)
        if self.static is None:
            return decoder_step(self.model, hyps[:, -1:], memory, pad_mask, self.cache, step)
        self.static.position.fill_(step)
        # a contiguous (N, 1): the last column of a growing tensor changes its strides every
        # step, and a compiled graph would be specialised to each
        tokens = hyps[:, -1:].contiguous()
        # step 0 eagerly: it takes the static buffers from the pool (no allocation in a graph)
        fn = decoder_step if step == 0 else self.step_fn
        return fn(self.model, tokens, memory, pad_mask, self.cache, self.static.position)

    def first(self, memory, pad_mask, k: int) -> torch.Tensor:
        """Step 0 of a beam of k > 1 with a cache: a sentence's k hypotheses are all BOS, so
        each sentence is decoded once (eagerly: its cross keys computed here too) and its
        log-probabilities and self-attention cache copied to k rows; the cross parts stay one
        row per sentence where the cache keeps them so. (B * k, V)"""
        b, dev = memory.shape[0], memory.device
        bos = torch.full((b, 1), BOS, dtype=torch.long, device=dev)
        assert self.cache is not None  # a static cache's position starts at 0
        lprobs = decoder_step(self.model, bos, memory, pad_mask, self.cache, 0)
        self.cache.keep(torch.arange(b, device=dev).repeat_interleave(k), None)
        return lprobs.repeat_interleave(k, 0)


def announce_compile(device, setting: str, steps: float) -> None:
    """Say on stderr that the decoder step compiles first, and why (decode.compile_step
    `setting`; auto: a job of `steps` decoder steps repays the compile's assumed price)."""
    job = "a job without end" if math.isinf(steps) else f"a job of {int(steps):,} decoder steps"
    seconds, kind = compile_price(device)
    why = (
        "always"
        if setting == "always"
        else f"auto: {job} repays a {kind} compile, assumed {seconds:g} s"
    )
    print(
        f"compiling the decoder step for {device} first (decode.compile_step {why}; the "
        f"compiled kernels are cached for later runs)",
        file=sys.stderr,
    )


def _mark(marker: Path) -> None:
    """Leave `marker` in the compile cache (compile_price reads it); a cache that cannot be
    written only makes the next price the cold one."""
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass
