"""From a Config and a run directory to a ready Trainer: data, tokenizer, model, optimizer,
and the state of an earlier run when there is one to resume."""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from mt import fast
from mt.artifacts import checkpoint
from mt.config import Config
from mt.data.prepare import bpe_dropout_epochs, prepare_data
from mt.runtime.device import PRECISION_NAMES, amp_dtype, pick_device
from mt.runtime.distributed import setup
from mt.errors import MTError
from mt.objectives.loss import rdrop_loss, reference_loss
from mt.model import build_model
from mt.objectives.nat import nat_loss
from mt.train.pretrain import init_encoder, pretrained_tokenizer
from mt.train.rundir import has_checkpoint, prepare_run_dir, record_corpus, write_run_info
from mt.train.schedule import build_optimizer
from mt.objectives.scheduled_sampling import ScheduledSamplingLoss
from mt.runtime.threads import choose_threads
from mt.train.trainer import Trainer, TrainState, Validation


def _quiet(*_args) -> None:
    pass


def _resume(trainer: Trainer, ckpt: dict, path: Path, log) -> None:
    trainer.state = TrainState(**checkpoint.restore_training(
        ckpt, trainer.model, trainer.optimizer, trainer.scheduler, trainer.scaler))
    ema = checkpoint.ema_of(ckpt)
    if trainer.ema is not None and ema is not None:   # else the average starts from here
        trainer.ema.load_state_dict(ema, trainer.model)
    # each rank continues its own dropout stream if saved by as many ranks; else rank 0's
    rng, own = checkpoint.generators_of(ckpt, trainer.dist.rank, trainer.dist.world)
    checkpoint.set_rng_state(rng, log)
    if trainer.dist.rank > 0 and not own:
        # Rank 0's generators everywhere would give all ranks the same dropout masks: each
        # other rank gets its own stream, fixed by (seed, rank, step), so such a resume is
        # reproducible too, though not the run that was interrupted.
        torch.manual_seed((trainer.cfg.seed * 1_000_003 + trainer.dist.rank * 7_919
                           + trainer.state.step) % (2 ** 63))
    _truncate_log(trainer.run_dir / "train_log.jsonl", trainer.state.step)
    log(f"resuming from {path} at step {trainer.state.step}")


def _truncate_log(path: Path, step: int) -> None:
    """Drop log records written after the checkpoint (by a run killed later): the resumed
    run writes them again."""
    import json
    if path.is_file():
        lines = path.read_text(encoding="utf-8").splitlines()
        kept = [x for x in lines if x.strip() and json.loads(x).get("step", 0) <= step]
        if len(kept) != len(lines):
            path.write_text("".join(x + "\n" for x in kept), encoding="utf-8")


def fast_paths_apply(setting: str | bool, device: torch.device) -> bool:
    """train.fast_paths "auto" means on a CPU only: mt/fast was built for CPU training, and on
    an H200 mt trained at 0.82x nn.Transformer's tokens/s with it and 1.13x without it
    (scripts/bench_train.py, base model, bf16; docs/gpu.md)."""
    return device.type == "cpu" if setting == "auto" else setting


def install_fast_paths(model, t):
    """Where `t.fast_paths` (TrainConfig) applies to the device `model` is on, the CPU speed
    work beside the reference model (mt/fast) goes into `model`; returns the loss to train
    with: the fused chunked loss, or the reference loss (no fast paths, or torch.compile,
    which fuses on its own)."""
    if not fast_paths_apply(t.fast_paths, next(model.parameters()).device):
        return reference_loss
    fast.install(model)
    return reference_loss if t.compile else fast.chunked_loss


def build_trainer(cfg: Config, run_dir: Path, allow_config_change: bool = False,
                  log=print) -> Trainer:
    t = cfg.train
    dist, device_name = setup(t.device, t.dist_timeout_minutes, t.dist_wait_minutes)
    if not dist.is_main:
        log = _quiet
    lock = prepare_run_dir(cfg, run_dir, allow_config_change, dist.is_main, log)
    try:
        return _build(cfg, run_dir, dist, device_name, log, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _build(cfg: Config, run_dir: Path, dist, device_name: str, log, lock) -> Trainer:
    t = cfg.train
    if t.num_threads or not dist.enabled:   # ranks sharing a machine would count each other
        choose_threads(t.num_threads, log)
    torch.manual_seed(t.seed)
    tokenizer, train_data, (vsrc, vtgt, valid_data) = prepare_data(
        cfg, run_dir, dist, log, t.bpe_dropout,
        inherited=lambda: pretrained_tokenizer(cfg.model.init_encoder, log))
    if dist.is_main:
        record_corpus(cfg, run_dir)
        write_run_info(run_dir)
    device = pick_device(device_name)
    model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    if cfg.model.init_encoder and not has_checkpoint(run_dir):   # a resumed run has its own
        init_encoder(model, cfg.model.init_encoder, tokenizer, log)
    model = model.to(device)
    loss_fn = install_fast_paths(model, t)
    if cfg.model.arch == "nat":
        loss_fn = nat_loss
    if t.rdrop_alpha > 0:     # fused like the plain loss where that is, else the reference
        rdrop = fast.chunked_rdrop_loss if loss_fn is fast.chunked_loss else rdrop_loss
        loss_fn = functools.partial(rdrop, alpha=t.rdrop_alpha)
    torch.manual_seed(t.seed + dist.rank)   # same initial weights everywhere, own dropout masks
    log(f"model: {sum(p.numel() for p in model.parameters()):,} parameters on {device}"
        + (f" x {dist.world} ranks" if dist.enabled else ""))
    optimizer, scheduler = build_optimizer(model.parameters(), t, cfg.model.d_model)
    dtype = amp_dtype(t.precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    trainer = Trainer(
        model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
        train_data=None if t.bpe_dropout > 0 else train_data,
        validation=Validation(vsrc, vtgt, valid_data, t.valid_beam or cfg.decode.beam),
        tokenizer=tokenizer, cfg=t, decode_cfg=cfg.decode, full_config=cfg.to_dict(),
        run_dir=run_dir, device=device, amp_dtype=dtype, log=log, dist=dist, lock=lock,
        loss_fn=loss_fn, tensorboard=t.tensorboard,
        epoch_data=bpe_dropout_epochs(cfg, tokenizer, train_data) if t.bpe_dropout > 0
        else None)
    if t.scheduled_sampling is not None:   # a wrapper around the loss, fed the update count
        ss = t.scheduled_sampling
        two_pass = ss.mode == "two_pass" or (ss.mode == "auto" and cfg.model.arch != "rnn")
        trainer.loss_fn = ScheduledSamplingLoss(ss, trainer.loss_fn, lambda: trainer.state.step,
                                                two_pass, seed=t.seed + dist.rank)
    found = checkpoint.load_for_resume(run_dir / "last.pt", log)
    if found is not None:
        _resume(trainer, *found, log)
    elif has_checkpoint(run_dir):
        raise MTError(f"no readable last.pt in {run_dir} to resume from; move the damaged "
                      f"files away to start over")
    trainer.state.precision = PRECISION_NAMES[dtype]
    return trainer
