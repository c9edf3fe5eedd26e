"""From a Config and a run directory to a ready Trainer: data, tokenizer, model, optimizer,
and the state of an earlier run when there is one to resume."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

from mt.artifacts import checkpoint
from mt.config import Config
from mt.config.load import read_config
from mt.data.prepare import bpe_dropout_epochs, prepare_data
from mt.data.textform import text_form
from mt.data.tokenizer import MODEL_FILES
from mt.errors import MTError
from mt.model import REFERENCE, build_model
from mt.outputs import write_text
from mt.runtime.device import PRECISION_NAMES, amp_dtype, fp32_matmuls, pick_device
from mt.runtime.distributed import setup
from mt.runtime.memory import prefer_huge_pages
from mt.runtime.threads import choose_threads
from mt.train.parts import build_objective, for_device, model_parts
from mt.train.pretrained import (
    encoder_parameters,
    init_encoder,
    pretrained_tokenizer,
    translation_options_off,
)
from mt.train.rundir import (
    check_corpus_unchanged,
    has_checkpoint,
    prepare_run_dir,
    record_corpus,
)
from mt.train.start import (
    continue_optimizer,
    mt_source,
    source_tokenizer,
    start_from,
    with_source_settings,
)
from mt.train.state import TrainState, Validation
from mt.train.tracking import write_run_info
from mt.train.trainer import Trainer
from mt.train.update.build import resolve_update
from mt.train.update.schedule import build_optimizer


def _quiet(*_args) -> None:
    pass


# what TrainState.objective records, so that `mt train` and `mt pretrain` never resume
# each other's last.pt (a checkpoint written before the field existed is a translation run's)
OBJECTIVE_NAMES = {False: "translation", True: "masked_lm"}
COMMANDS = {"translation": "mt train", "masked_lm": "mt pretrain"}


def _resume(trainer: Trainer, ckpt: dict, path: Path, log) -> None:
    theirs = checkpoint.trained_objective(ckpt)
    if theirs != trainer.state.objective:
        raise MTError(
            f"{path} was written by `{COMMANDS.get(theirs, theirs)}`, not "
            f"`{COMMANDS[trainer.state.objective]}`; give this command another "
            f"--run-dir"
        )
    trainer.state = TrainState(
        **checkpoint.restore_training(
            ckpt, trainer.model, trainer.optimizer, trainer.scheduler, trainer.scaler
        )
    )
    ema = checkpoint.ema_of(ckpt)
    if trainer.ema is not None and ema is not None:  # else the average starts from here
        trainer.ema.load_state_dict(ema, trainer.model)
    # each rank continues its own dropout stream if saved by as many ranks; else rank 0's
    rng, own = checkpoint.generators_of(ckpt, trainer.dist.rank, trainer.dist.world)
    checkpoint.set_rng_state(rng, log)
    if trainer.dist.rank > 0 and not own:
        # Rank 0's generators everywhere would give all ranks the same dropout masks: each
        # other rank gets its own stream, fixed by (seed, rank, step), so such a resume is
        # reproducible too, though not the run that was interrupted.
        torch.manual_seed(
            (trainer.cfg.seed * 1_000_003 + trainer.dist.rank * 7_919 + trainer.state.step)
            % (2**63)
        )
    _truncate_log(trainer.run_dir / "train_log.jsonl", trainer.state.step, log)
    log(f"resuming from {path} at step {trainer.state.step}")


def _truncate_log(path: Path, step: int, log) -> None:
    """Drop log records written after the checkpoint (by a run killed later): the resumed
    run writes them again; and lines that are not JSON (a line cut off by a kill, an edit),
    saying so."""
    import json

    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept, damaged = [], []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            damaged.append(number)
            continue
        if isinstance(record, dict) and record.get("step", 0) <= step:
            kept.append(line)
    if damaged:
        log(
            f"warning: {path}: line(s) {', '.join(map(str, damaged[:5]))} are not JSON records "
            f"(cut off, or edited); dropped, the rest of the log kept"
        )
    if len(kept) != len(lines):
        write_text(path, "".join(x + "\n" for x in kept))


def load_run_config(path, overrides=(), log=None) -> Config:
    """The config of a run to train (mt.config.load_config), with the settings the model it
    imports fixes (model.init_from: its architecture and tokenizer; a setting the user wrote
    that contradicts them is refused)."""
    cfg, written, where = read_config(path, overrides, log)
    if cfg.model.init_from is not None and mt_source(cfg.model.init_from):
        cfg = with_source_settings(cfg, written, where)
    elif cfg.model.init_from is not None:
        from mt.hub.imports import with_imported_settings

        cfg = with_imported_settings(cfg, written, where)
    return cfg


def build_trainer(
    cfg: Config,
    run_dir: Path,
    allow_config_change: bool = False,
    log=print,
    pretraining: bool = False,
    restart: bool = False,
) -> Trainer:
    """pretraining: the masked-LM objective over the encoder (`mt pretrain`), which trains
    without validation and ignores the options of translation training (TRAIN_ONLY);
    restart: start again from step 0, the run directory's files moved aside (--restart)."""
    prefer_huge_pages()  # before torch's first large allocation (mt/runtime/memory.py)
    if pretraining:
        cfg = cfg.model_copy(update={"train": translation_options_off(cfg.train)})
    t = cfg.train
    dist, device_name = setup(t.device, t.dist_timeout_minutes, t.dist_wait_minutes, log)
    if t.data_parallel == "ddp" and not dist.enabled:
        log(
            "note: train.data_parallel ddp applies to several processes (torchrun "
            "--nproc_per_node N -m mt train ...); this run is one process"
        )
    if cfg.data.pair_temperature != 1.0 and len(cfg.data.pairs) < 2:
        log(
            f"note: data.pair_temperature {cfg.data.pair_temperature:g} weighs the pairs of "
            f"data.pairs; this run has one pair, so it does nothing"
        )
    if not dist.is_main:
        log = _quiet
    lock = prepare_run_dir(
        cfg, run_dir, allow_config_change or pretraining, dist.is_main, log, restart
    )
    try:
        trainer = _build(
            cfg, run_dir, dist, device_name, log, lock, pretraining, allow_config_change
        )
        if not _resume_if_saved(trainer, run_dir, log) and cfg.model.init_optimizer:
            continue_optimizer(trainer, cfg.model, log)
        trainer.state.precision = PRECISION_NAMES[trainer.amp_dtype]  # as resolved here
        return trainer
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _for_device(cfg: Config, device_name: str, dist, pretraining: bool, log):
    """(the device, the config as it takes it): train.compile and train.pack_width decided
    (parts.for_device), train.update resolved with every refusal, before the data and the
    model are made; what a GPU chose is said in one line."""
    device = pick_device(device_name)
    resolved, chosen = for_device(cfg, device, pretraining)
    fp16 = amp_dtype(cfg.train.precision, device) == torch.float16
    kind = resolve_update(resolved.train, device, dist, fp16)
    if chosen:
        log(f"{chosen}; the {kind} update (train.update {cfg.train.update})")
    return device, resolved


def _build(
    cfg: Config,
    run_dir: Path,
    dist,
    device_name: str,
    log,
    lock,
    pretraining: bool,
    allow_config_change: bool,
) -> Trainer:
    t = cfg.train
    if t.num_threads or not dist.enabled:  # ranks sharing a machine would count each other
        choose_threads(t.num_threads, log)
    torch.manual_seed(t.seed)
    device, resolved = _for_device(cfg, device_name, dist, pretraining, log)
    run_config = cfg.to_dict()  # (as the user gave it: auto is decided again on resuming)
    tokenizer, train_data, valid = _data(cfg, run_dir, dist, log, allow_config_change)
    cfg, t = resolved, resolved.train
    model, objective = _model_and_objective(cfg, tokenizer, run_dir, device, dist, pretraining, log)
    ranks = f" x {dist.world} ranks" if dist.enabled else ""
    log(f"model: {sum(p.numel() for p in model.parameters()):,} parameters on {device}{ranks}")
    optimizer, scheduler, scaler, dtype = _optimization(cfg, model, device, pretraining)
    # (no validation for the encoder's pretraining)
    validation = None if pretraining else _validation(cfg, *valid)
    return Trainer(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        train_data=None if t.bpe_dropout > 0 else train_data,
        validation=validation,
        tokenizer=tokenizer,
        cfg=t,
        run_config=run_config,
        objective=objective,
        run_dir=run_dir,
        device=device,
        amp_dtype=dtype,
        dist=dist,
        lock=lock,
        tensorboard=t.tensorboard,
        epoch_data=bpe_dropout_epochs(cfg, tokenizer, train_data) if t.bpe_dropout > 0 else None,
        state=TrainState(objective=OBJECTIVE_NAMES[pretraining]),
        compile=bool(t.compile),
        pair_temperature=cfg.data.pair_temperature,
    )


def _validation(cfg: Config, src, refs, data, pairs) -> Validation:
    """The valid split as validation decodes and scores it (prepare_data's valid tuple)."""
    beam = cfg.train.valid_beam or cfg.decode.beam
    text = text_form(cfg.data)
    refs = text.references(refs)  # (as translations are written)
    return Validation(src, refs, data, beam, cfg.decode, pairs, cfg.train.best_by, text)


def _model_and_objective(cfg: Config, tokenizer, run_dir: Path, device, dist, pretraining, log):
    """(the model on `device`, the objective it trains with), this rank's draws seeded."""
    compiles = bool(cfg.train.compile)
    model, parts = _model(cfg, tokenizer, run_dir, device, pretraining, log, compiles)
    seed = cfg.train.seed + dist.rank  # this rank's draws
    objective = build_objective(
        cfg,
        fused=parts is not REFERENCE and not compiles,  # (Flex: compiled)
        seed=seed,
        pretraining=pretraining,
        vocab_size=tokenizer.src_vocab_size,
        compiled=compiles,
        layout=parts.layout,
    )
    torch.manual_seed(seed)  # same initial weights everywhere, own dropout masks
    return model, objective


def _data(cfg: Config, run_dir: Path, dist, log, allow_config_change: bool):
    """(the tokenizer, the training pairs, (valid sources, references, pairs)), the corpus
    checked against the run's and recorded (mt.data.prepare)."""
    inherited = functools.partial(pretrained_tokenizer, cfg.model.init_encoder, log)
    if cfg.model.init_from is not None and mt_source(cfg.model.init_from):
        inherited = functools.partial(source_tokenizer, cfg.model, log)
    elif cfg.model.init_from is not None:
        inherited = functools.partial(imported_tokenizer, cfg.model.init_from, log)
    renew = check_corpus_unchanged(cfg, run_dir, allow_config_change, log)  # every rank
    saved = functools.partial(saved_tokenizer, run_dir, log)
    data = prepare_data(
        cfg, run_dir, dist, log, cfg.train.bpe_dropout, inherited=inherited, saved=saved
    )
    if dist.is_main:
        record_corpus(cfg, run_dir, renew)
        tokenizer = data[0]
        write_run_info(run_dir, vocab=(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size))
    return data


def saved_tokenizer(run_dir: Path, log, why: str):
    """Write again the BPE model of a run that has a checkpoint, from the checkpoint's own copy
    (the model's ids mean nothing in a BPE model trained anew), and return it; None: no
    checkpoint. why: what is wrong with the run directory's own (missing, damaged)."""
    last = run_dir / "last.pt"
    for path in (last, checkpoint.previous(last)):
        if path.is_file():
            try:
                tok = checkpoint.tokenizer_from(checkpoint.load(path))
            except MTError:
                continue
            for name in MODEL_FILES:
                (run_dir / name).unlink(missing_ok=True)
            tok.save(run_dir)
            log(f"warning: {run_dir} had a checkpoint but {why}: written again from {path.name}")
            return tok
    return None


def imported_tokenizer(source: str, log):
    """The tokenizer of the transformers model a new run starts from (model.init_from)."""
    from mt.hub.imports import imported

    log(f"using the tokenizer of {source} (model.init_from)")
    return imported(source).tokenizer


def _optimization(cfg: Config, model, device, pretraining: bool):
    """(Adam, its Noam schedule, the GradScaler, the autocast dtype or None): over the
    encoder's parameters alone when pretraining it."""
    t = cfg.train
    params = encoder_parameters(model) if pretraining else model.parameters()
    optimizer, scheduler = build_optimizer(params, t, cfg.model.d_model)
    dtype = amp_dtype(t.precision, device)
    fp32_matmuls(device, dtype)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    return optimizer, scheduler, scaler, dtype


def _model(cfg: Config, tokenizer, run_dir: Path, device, pretraining: bool, log, compiles: bool):
    """(the model on `device`, the Parts it was built from): built from mt/fast's modules
    where they apply (not under torch.compile: `compiles`), starting from a pretrained
    encoder where the config names one."""
    parts = model_parts(cfg.train, device, pretraining, compiles, model=cfg.model)
    model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, parts)
    if cfg.model.init_encoder and not has_checkpoint(run_dir):  # a resumed run has its own
        init_encoder(model, cfg.model.init_encoder, tokenizer, log)
    if cfg.model.init_from and not has_checkpoint(run_dir) and mt_source(cfg.model.init_from):
        start_from(model, cfg.model, log)
    elif cfg.model.init_from and not has_checkpoint(run_dir):
        from mt.hub.imports import init_from

        init_from(model, cfg.model.init_from, cfg.model.output_bias, log)
    return model.to(device), parts


def _set_aside_damaged_best(trainer: Trainer, best: Path, log) -> None:
    """A best.pt that cannot be read (a disk error, a copy cut short) is moved aside, said,
    and the run's best BLEU forgotten, so that its next validation writes best.pt again
    rather than the run ending without a model to translate with."""
    if not best.is_file():
        return
    try:
        checkpoint.load(best)
    except MTError as e:
        aside = best.with_name("best.pt.damaged")
        os.replace(best, aside)
        trainer.state.best_bleu, trainer.state.bad_validations = -1.0, 0
        log(
            f"warning: {str(e).split('; ')[0]}: moved to {aside}; the next validation "
            f"writes best.pt again"
        )


def _resume_if_saved(trainer: Trainer, run_dir: Path, log) -> bool:
    """Whether the run resumed from its last.pt (False: a new run)."""
    found = checkpoint.load_for_resume(run_dir / "last.pt", log)
    if found is not None:
        _resume(trainer, *found, log)
        if trainer.dist.is_main:
            _set_aside_damaged_best(trainer, run_dir / "best.pt", log)
        return True
    if not has_checkpoint(run_dir):  # a new run: a log left by one that saved nothing
        _truncate_log(run_dir / "train_log.jsonl", 0, log)  # (goes with it)
        return False
    raise MTError(
        f"no last.pt in {run_dir} that training can resume from (damaged, or weights "
        f"alone); start over with mt train ... --restart (the files are kept aside), or "
        f"train into a new --run-dir"
    )
