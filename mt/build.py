"""From a Config and a run directory to a ready Trainer: data, tokenizer, model, optimizer,
and the state of an earlier run when there is one to resume."""
from __future__ import annotations

from pathlib import Path

import torch

from mt import checkpoint, fast
from mt.config import Config
from mt.data.corpus import (Stats, clean_pairs, drop_empty, encode_pairs, encode_stream,
                            has_split, iter_parallel, read_parallel, sample_pairs, split_paths)
from mt.data.download import download
from mt.device import amp_dtype, pick_device
from mt.distributed import setup
from mt.errors import MTError
from mt.loss import reference_loss
from mt.model import build_model
from mt.rundir import prepare_run_dir, record_corpus, write_run_info
from mt.schedule import build_optimizer
from mt.threads import choose_threads
from mt.tokenizer import Tokenizer
from mt.trainer import Trainer, TrainState, Validation

def ensure_data(cfg: Config, log) -> None:
    d = cfg.data
    for split in ("train", "valid"):
        if has_split(d.dir, split, d.src_lang, d.tgt_lang):
            continue
        if d.dataset is None:
            src, tgt = split_paths(d.dir, split, d.src_lang, d.tgt_lang)
            raise MTError(f"no {split} data: {src} and {tgt} must exist; fetch a corpus with "
                          f"`mt download` or set data.dir")
        log(f"{d.dir} has no {split} split: downloading {d.dataset} ...")
        download(d.dataset, Path(d.dir), config=d.dataset_config,
                 langs=(d.src_lang, d.tgt_lang) if d.dataset != "synthetic" else None)
        if not has_split(d.dir, split, d.src_lang, d.tgt_lang):
            raise MTError(f"{d.dataset} gave no {split} split for {d.src_lang}-{d.tgt_lang}")


def _quiet(*_args) -> None:
    pass


def load_tokenizer(cfg: Config, run_dir: Path, train_paths: tuple[Path, Path], log) -> Tokenizer:
    """The run's BPE model, trained on (a sample of) the training split the first time."""
    tok = Tokenizer.load(run_dir)
    if tok is None:
        t = cfg.tokenizer
        log(f"training {'joint' if t.joint else 'separate'} BPE (vocab {t.vocab_size}) ...")
        src, tgt = sample_pairs(clean_pairs(iter_parallel(*train_paths), Stats()),
                                t.max_sentences, cfg.train.seed)
        if not src:
            raise MTError(f"{train_paths[0]}: the training split has no non-empty pairs")
        tok = Tokenizer.train(src, tgt, vocab_size=t.vocab_size, joint=t.joint,
                              character_coverage=t.character_coverage,
                              max_sentences=t.max_sentences, seed=cfg.train.seed)
        tok.save(run_dir)
    return tok


def _resume(trainer: Trainer, ckpt: dict, path: Path, log) -> None:
    trainer.model.load_state_dict(ckpt["model"])
    trainer.optimizer.load_state_dict(ckpt["optimizer"])
    trainer.scheduler.load_state_dict(ckpt["scheduler"])
    trainer.scaler.load_state_dict(ckpt["scaler"])
    trainer.state = TrainState(**ckpt["train_state"])
    rank_rng = ckpt.get("rank_rng")
    # each rank continues its own dropout stream if saved by as many ranks; else rank 0's
    own = rank_rng is not None and len(rank_rng) == trainer.dist.world
    rng = rank_rng[trainer.dist.rank] if own else ckpt["rng"]
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


def _load_data(cfg: Config, run_dir: Path, dist, log):
    """The tokenizer (trained by rank 0 if the run has none yet), the training split as token
    ids and the valid split as text and token ids."""
    d = cfg.data
    train_stats, valid_stats = Stats(), Stats()
    train_paths = split_paths(d.dir, "train", d.src_lang, d.tgt_lang)
    vsrc, vtgt = drop_empty(*read_parallel(*split_paths(d.dir, "valid", d.src_lang, d.tgt_lang)),
                            valid_stats)
    if not vsrc:
        raise MTError(f"{d.dir}: the valid split has no non-empty pairs")
    if dist.is_main:
        load_tokenizer(cfg, run_dir, train_paths, log)
    dist.wait_for_main()
    tokenizer = load_tokenizer(cfg, run_dir, train_paths, log)
    # The training split is streamed: text is never held whole, only its token ids.
    train_data = encode_stream(clean_pairs(iter_parallel(*train_paths), train_stats),
                               tokenizer, d.max_len, train_stats)
    valid_data = encode_pairs(vsrc, vtgt, tokenizer, cfg.max_side_len, valid_stats)
    log(train_stats.describe("train"))
    log(valid_stats.describe("valid"))
    if not len(train_data.src):
        raise MTError(f"{train_paths[0]}: no training pair left (empty, or longer than "
                      f"data.max_len={d.max_len})")
    return tokenizer, train_data, (vsrc, vtgt, valid_data)


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
    if dist.is_main:          # one rank downloads and trains BPE; the others wait, then read
        ensure_data(cfg, log)
        record_corpus(cfg, run_dir)
        write_run_info(run_dir)
    dist.wait_for_main()
    if t.num_threads or not dist.enabled:   # ranks sharing a machine would count each other
        choose_threads(t.num_threads, log)
    torch.manual_seed(t.seed)
    tokenizer, train_data, (vsrc, vtgt, valid_data) = _load_data(cfg, run_dir, dist, log)
    device = pick_device(device_name)
    model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size).to(device)
    loss_fn = reference_loss
    if t.fast_paths:          # the CPU speed work, beside the reference model (mt/fast)
        fast.install(model)
        loss_fn = reference_loss if t.compile else fast.chunked_loss
    torch.manual_seed(t.seed + dist.rank)   # same initial weights everywhere, own dropout masks
    log(f"model: {sum(p.numel() for p in model.parameters()):,} parameters on {device}"
        + (f" x {dist.world} ranks" if dist.enabled else ""))
    optimizer, scheduler = build_optimizer(model.parameters(), t, cfg.model.d_model)
    dtype = amp_dtype(t.precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    trainer = Trainer(
        model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
        train_data=train_data,
        validation=Validation(vsrc, vtgt, valid_data, t.valid_beam or cfg.decode.beam),
        tokenizer=tokenizer, cfg=t, decode_cfg=cfg.decode, full_config=cfg.to_dict(),
        run_dir=run_dir, device=device, amp_dtype=dtype, log=log, dist=dist, lock=lock,
        loss_fn=loss_fn)
    found = checkpoint.load_for_resume(run_dir / "last.pt", log)
    if found is not None:
        _resume(trainer, *found, log)
    elif (run_dir / "last.pt").exists() or checkpoint.previous(run_dir / "last.pt").exists():
        raise MTError(f"no readable last.pt in {run_dir} to resume from; move the damaged "
                      f"files away to start over")
    return trainer
