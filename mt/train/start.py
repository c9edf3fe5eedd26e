"""model.init_from an mt run: a new run starts from another run's weights and BPE model, of
any architecture mt trains, with an optimizer and schedule of its own (fine-tuning on new
data, or a model of part of a corpus continued on the rest), or with the source's where
model.init_optimizer asks. The model's shape and the tokenizer are the source's; a setting
the user wrote that says otherwise is refused, naming the key. (A transformers Marian model
is the other kind of source: mt/hub/imports.py.)"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from mt.artifacts import checkpoint
from mt.config import Config, with_fixed
from mt.data.pairs import Languages
from mt.errors import MTError

# the model settings a run may change from its source's: regularisation, not shape
FREE_MODEL_KEYS = {
    "dropout",
    "attn_dropout",
    "act_dropout",
    "init_from",
    "init_encoder",
    "init_optimizer",
}


def mt_source(source: str, optimizer: bool = False) -> Path | None:
    """The checkpoint of the mt run model.init_from names (a run directory: its best.pt, else
    last.pt, or its last.pt where the optimizer continues; or a checkpoint file), or None where
    it names something else (a transformers model's folder or hub id)."""
    path = Path(source).expanduser()
    marks = ("best.pt", "last.pt", "config.yaml", "train_log.jsonl")  # (Marian's: config.json)
    run = path.is_dir() and any((path / n).is_file() for n in marks)
    if run and optimizer and (path / "last.pt").is_file():
        return path / "last.pt"
    if run or path.suffix == ".pt":
        return checkpoint.resolve(path, "model.init_from")
    return None


@functools.lru_cache(maxsize=1)
def _source(source: str, optimizer: bool = False) -> tuple[Path, dict[str, Any]]:
    """The source run's checkpoint, read once per process (its settings, its BPE model and
    its weights all come from it, as mt/hub/imports.py reads a Marian model once)."""
    path = mt_source(source, optimizer)
    assert path is not None
    return path, checkpoint.load(path)


def with_source_settings(cfg: Config, written: set[str], where: str) -> Config:
    """cfg with the model and tokenizer settings of the run it starts from (model.init_from);
    a setting the user wrote (`written`, dotted keys) that says otherwise is refused."""
    source = str(cfg.model.init_from)
    path, ckpt = _source(source, cfg.model.init_optimizer)
    theirs = checkpoint.config_of(ckpt, str(path))
    fixed: dict[str, Any] = {
        f"model.{k}": v for k, v in theirs.model.model_dump().items() if k not in FREE_MODEL_KEYS
    }
    fixed |= {f"tokenizer.{k}": v for k, v in theirs.tokenizer.model_dump().items()}
    fixed |= _languages(cfg, theirs, source, where)
    return with_fixed(cfg, fixed, written, where, source)


def _languages(cfg: Config, theirs: Config, source: str, where: str) -> dict[str, Any]:
    """A source of several target languages reserved their tokens in its BPE: the run keeps
    telling its model the target (data.target_token), into languages the source wrote."""
    ours, known = Languages.of(cfg.data), Languages.of(theirs.data)
    if not known.tagged:
        return {}
    unknown = [t for t in ours.targets if t not in known.targets]
    if unknown:
        raise MTError(
            f"{where}: model.init_from {source} writes {', '.join(known.targets)}, not "
            f"{', '.join(unknown)} (its BPE has no token for it): train into its languages"
        )
    return {"data.target_token": True}


def start_from(model, model_cfg, log) -> None:
    """Load the source run's weights into `model` (built from the settings it fixed)."""
    path, ckpt = _source(str(model_cfg.init_from), model_cfg.init_optimizer)
    weights = checkpoint.weights_of(ckpt)
    model.load_state_dict(weights)
    log(f"model.init_from {path}: starting from its weights ({len(weights)} tensors)")


def source_tokenizer(model_cfg, log):
    """The BPE model of the run a new run starts from (its checkpoint's own copy)."""
    path, ckpt = _source(str(model_cfg.init_from), model_cfg.init_optimizer)
    log(f"using the BPE model of {path} (model.init_from)")
    return checkpoint.tokenizer_from(ckpt)


def continue_optimizer(trainer, model_cfg, log) -> None:
    """model.init_optimizer: the source run's optimizer state (Adam's moments and step
    counts) and its schedule's step in `trainer`'s, so that training goes on as that run
    would have; the learning rate then follows this config's schedule from that step."""
    path, ckpt = _source(str(model_cfg.init_from), True)
    if "optimizer" not in ckpt:
        raise MTError(
            f"model.init_optimizer: {path} holds weights alone, no optimizer state (a best.pt "
            f"or an average); name the run's last.pt, or remove model.init_optimizer"
        )
    try:
        trainer.optimizer.load_state_dict(ckpt["optimizer"])
    except (ValueError, KeyError) as e:  # another parameter layout (mt pretrain's encoder)
        raise MTError(
            f"model.init_optimizer: {path}'s optimizer does not fit this model ({e}); remove "
            f"model.init_optimizer to start a fresh one"
        ) from None
    trainer.scheduler.load_state_dict(ckpt["scheduler"])
    log(
        f"model.init_optimizer: continuing {path}'s optimizer and its schedule from step "
        f"{trainer.scheduler.last_epoch:,}"
    )
