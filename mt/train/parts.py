"""What a run trains with, decided from its config and device: the model's parts (mt/fast's
or the reference modules), whether the step is compiled, and the one factory of the
objective the Trainer minimises (label-smoothed cross-entropy, fused where mt/fast applies;
R-Drop; scheduled sampling; the NAT's masked-target loss; the masked-LM loss of encoder
pretraining)."""

from __future__ import annotations

import functools

import torch

from mt import fast
from mt.config import Config
from mt.model import REFERENCE, Parts
from mt.objectives import Objective
from mt.objectives.loss import rdrop_loss, reference_loss
from mt.objectives.mlm import masked_lm_objective
from mt.objectives.nat import nat_loss, nat_valid_loss
from mt.objectives.scheduled_sampling import ScheduledSamplingLoss


def fast_paths_apply(setting: str | bool, device: torch.device) -> bool:
    """train.fast_paths "auto" means on a CPU only: mt/fast was built for CPU training, and on
    a GPU it makes more, smaller kernels and trains slower (scripts/bench/bench_train.py;
    figures in docs/gpu.md)."""
    return device.type == "cpu" if setting == "auto" else bool(setting)


def compile_applies(cfg, device: torch.device, pretraining: bool = False) -> bool:
    """train.compile resolved (cfg: the run's Config): true and false as said; auto on a GPU
    for a Transformer's label-smoothed cross-entropy alone (R-Drop, scheduled sampling, the
    NAT's and the RNN's steps stay eager), and not where train.fast_paths forces mt/fast or
    the ranks exchange through DDP."""
    t = cfg.train
    if pretraining or t.compile is False:
        return False
    if t.compile is True:
        return True
    plain = (
        cfg.model.arch in ("transformer", "decoder_only")
        and t.rdrop_alpha == 0
        and t.scheduled_sampling is None
        and t.data_parallel == "flat"
    )
    return device.type == "cuda" and plain and t.fast_paths is not True


# train.pack_width auto: data.max_len rounded up to a multiple of this (FlexAttention's blocks
# are 128 positions; half of one keeps short corpora's rows short)
PACK_MULTIPLE = 64


def for_device(cfg: Config, device: torch.device, pretraining: bool = False):
    """(the run's config with train.compile and train.pack_width as this device takes them,
    a line saying what was chosen and why, or None where nothing was left to choose). auto
    compiles the step on a GPU (compile_applies) and then packs the batches into blocks of one
    shape (packs_automatically), so the compiled step is one CUDA graph replayed; on a CPU
    both stay off, the step eager over mt/fast's paths."""
    t = cfg.train
    compile = compile_applies(cfg, device, pretraining)
    width = t.pack_width
    if width == "auto":
        width = auto_pack_width(cfg) if compile and packs_automatically(cfg, pretraining) else 0
    train = t.model_copy(update={"compile": compile, "pack_width": width})
    resolved = cfg.model_copy(update={"train": train})
    if device.type != "cuda" and compile:  # (asked for: auto compiles on a GPU only)
        return resolved, (
            "the training step on this CPU: compiled (train.compile true); its first updates "
            "take a minute or more while it compiles, and again at each new batch shape "
            "(eager, the CPU's default, starts at once)"
        )
    if device.type != "cuda" or (t.compile != "auto" and t.pack_width != "auto"):
        return resolved, None
    how = "compiled (train.compile auto)" if compile else "eager"
    if t.compile == "auto" and not compile:
        how += " (train.compile auto compiles a Transformer's plain cross-entropy, not this step)"
    if t.pack_width == "auto":
        how += (
            f", on packed blocks {width} positions wide (train.pack_width auto: data.max_len "
            f"{cfg.data.max_len} rounded up to a multiple of {PACK_MULTIPLE})"
            if width
            else ", one pair per row (train.pack_width auto packs a compiled plain step)"
        )
    return resolved, f"the training step on this GPU: {how}"


def packs_automatically(cfg: Config, pretraining: bool = False) -> bool:
    """Whether train.pack_width auto packs a compiled step: a Transformer's plain
    label-smoothed cross-entropy (R-Drop and scheduled sampling train on one pair per row),
    without shape buckets or mt/fast forced, with room for a row in a batch."""
    t = cfg.train
    width = auto_pack_width(cfg)
    return (
        not pretraining
        and cfg.model.arch == "transformer"
        and t.rdrop_alpha == 0
        and t.scheduled_sampling is None
        and not t.shape_buckets
        and t.fast_paths is not True
        and cfg.data.max_len <= width <= cfg.model.max_positions
        and t.max_tokens >= 2 * width
    )


def auto_pack_width(cfg: Config) -> int:
    """train.pack_width auto's width: data.max_len rounded up to a multiple of PACK_MULTIPLE,
    within model.max_positions."""
    width = -(-cfg.data.max_len // PACK_MULTIPLE) * PACK_MULTIPLE
    return min(width, cfg.model.max_positions)


def model_parts(
    t, device: torch.device, pretraining: bool = False, compile: bool = False, model=None
) -> Parts:
    """The module classes to build the model from: mt/fast's where `t.fast_paths`
    (TrainConfig) applies to `device`, else the reference ones. Encoder pretraining keeps the
    reference: the masked-LM loss reads the encoder alone; so does a compiled step (`compile`:
    compile_applies), which fuses the reference model itself (mt/fast's feed-forward on real
    rows would break its graph), except for packed attention's block masks (flex_applies;
    model: the ModelConfig)."""
    if flex_applies(t, model, device, pretraining, compile):
        from mt.fast.flex import FlexMultiHeadAttention, flex_layout  # (imports dynamo)

        return Parts(attention=FlexMultiHeadAttention, layout=flex_layout)
    if pretraining or compile or packed(t) or not fast_paths_apply(t.fast_paths, device):
        return REFERENCE
    if model is not None and (model.activation != "relu" or model.output_bias):
        return REFERENCE  # (mt/fast's fused feed-forward is ReLU's; its loss has no bias)
    return fast.PARTS


def packed(t) -> bool:
    """Whether the train config `t` packs its batches (auto counts as not yet: the Trainer
    takes a config decided for its device, for_device)."""
    return t.pack_width not in (0, "auto")


def flex_applies(t, model, device: torch.device, pretraining: bool, compile: bool) -> bool:
    """Packed batches' attention through FlexAttention block masks (mt/fast/flex.py): for a
    compiled step on a GPU (FlexAttention is fast compiled, and has no backward on a CPU), with
    train.fast_paths auto or true, no attention-weight dropout and absolute positions."""
    return (
        model is not None
        and packed(t)
        and compile
        and not pretraining
        and device.type == "cuda"
        and t.fast_paths is not False
        and model.attn_dropout == 0
        and model.positional != "relative"
    )


def build_objective(
    cfg: Config,
    *,
    fused: bool,
    seed: int = 0,
    pretraining: bool = False,
    vocab_size: int = 0,
    compiled: bool = False,
    layout=None,
) -> Objective:
    """fused: mt/fast's chunked loss instead of the reference (where the model is built from
    fast.PARTS, except under torch.compile, which fuses on its own); compiled: the step is
    compiled (train.compile resolved), which train.compiled_loss_chunk's loss applies to;
    seed: scheduled sampling's draws (this rank's); pretraining: the masked-LM objective over
    a source vocabulary of `vocab_size`; layout: what a packed batch's masks are made as
    (the model's Parts.layout)."""
    t = cfg.train
    if pretraining:
        return masked_lm_objective(vocab_size)
    eps = t.label_smoothing
    if cfg.model.arch == "nat":
        return Objective(
            loss=functools.partial(nat_loss, eps=eps),
            valid_loss=functools.partial(nat_valid_loss, eps=eps),
            valid_loss_over="masked target tokens, the same masks at every validation",
        )
    loss = fast.chunked_loss if fused else functools.partial(reference_loss, layout=layout)
    if compiled and t.compiled_loss_chunk:  # (a plain Transformer's: mt.config.schema)
        loss = functools.partial(
            fast.compiled_chunked_loss, chunk=t.compiled_loss_chunk, layout=layout
        )
    if t.rdrop_alpha > 0:  # fused like the plain loss where that is, else the reference
        loss = functools.partial(
            fast.chunked_rdrop_loss if fused else rdrop_loss, alpha=t.rdrop_alpha
        )
    if t.scheduled_sampling is None:
        return Objective(loss=functools.partial(loss, eps=eps))
    ss = t.scheduled_sampling
    two_pass = ss.mode == "two_pass" or (ss.mode == "auto" and cfg.model.arch != "rnn")
    sampled = ScheduledSamplingLoss(ss, loss, two_pass, seed=seed)
    return Objective(loss=functools.partial(sampled, eps=eps), on_step=sampled.set_step)
