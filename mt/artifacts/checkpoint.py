"""Self-describing checkpoints: config, tokenizer, model/optimizer/scheduler/scaler state,
train counters and RNG states in one file, written atomically and read without unpickling
code (`weights_only=True`)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mt.artifacts import members
from mt.errors import MTError, first_line
from mt.outputs import atomic_file

if TYPE_CHECKING:
    from mt.config import Config
    from mt.data.tokenizer import Tokenizer

FORMAT_VERSION = 1


def bytes_to_tensor(b: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).clone()


def tensor_to_bytes(t: torch.Tensor) -> bytes:
    return t.numpy().tobytes()


def atomic_save(obj: Any, path: Path, keep_previous: bool = False) -> None:
    """Write to a temp file in the same folder, fsync, then rename over `path`: a crash at
    any moment leaves either the old file or the new one, never a truncated mix. With
    `keep_previous`, the old file is kept as `<name>.prev` (a fallback for resuming). A full
    disk or an unwritable folder is an MTError naming the path."""
    path = Path(path)
    with atomic_file(path, "wb", keep_as=previous(path) if keep_previous else None) as f:
        torch.save(obj, f)


def previous(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


def load_for_resume(path: Path, warn: Callable[[str], None]) -> tuple[dict[str, Any], Path] | None:
    """last.pt, or its previous version when last.pt is damaged, missing, or holds no
    training state to resume from (with a warning)."""
    for candidate in (path, previous(path)):
        if not candidate.is_file():
            continue
        try:
            ckpt = load(candidate)
        except MTError as e:
            warn(f"warning: {e}; trying the previous checkpoint")
            continue
        if "optimizer" not in ckpt:
            warn(
                f"warning: {candidate} holds weights alone, no optimizer state to resume "
                f"from (written by mt average?); trying the previous checkpoint"
            )
            continue
        return ckpt, candidate
    return None


def _instead(path: Path) -> str:
    """What to use in place of a damaged checkpoint: the run's other one, where it is there."""
    others = [path.parent / n for n in ("last.pt", "best.pt", "last.pt.prev") if n != path.name]
    found = [str(p) for p in others if p.is_file()]
    if found:
        return f"use {found[0]} instead"
    return "use another checkpoint of the run (a step_N.pt snapshot), or train again"


def load(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise MTError(f"checkpoint {path} not found")
    with open(path, "rb") as f:
        head = f.read(4)
    if not head.startswith((b"PK\x03\x04", b"\x80")):  # torch's zip format, or a legacy pickle
        kind = "a text file" if _is_text(head) else "not a PyTorch file"
        raise MTError(
            f"{path} is not a checkpoint ({kind}): give a run directory or the best.pt or "
            f"last.pt that mt train wrote"
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # weights_only refused what it holds
        raise MTError(
            f"checkpoint {path} holds Python objects that mt checkpoints never hold (a file "
            f"of another program?); give a run directory or a checkpoint mt train wrote"
        ) from None
    except Exception as e:
        # torch's first sentence (the rest is advice for torch's own users)
        reason = first_line(e, 160).split(". ")[0]
        raise MTError(
            f"checkpoint {path} is corrupt or not an mt checkpoint "
            f"({reason or type(e).__name__}); {_instead(path)}"
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("format_version") != FORMAT_VERSION:
        raise MTError(f"checkpoint {path} is not an mt checkpoint of format {FORMAT_VERSION}")
    return ckpt


def _is_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return head.isascii() and all(c >= 32 or c in b"\t\r\n" for c in head)


# -- building and reading the format: the one place that knows its keys -------------------


def build(
    *,
    config: dict[str, Any],
    model_state: dict[str, Any],
    tokenizer: Tokenizer,
    train_state: dict[str, Any],
    training: tuple[Any, Any, torch.amp.GradScaler] | None = None,
    rank_rng: list[dict[str, Any]] | None = None,
    ema: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A checkpoint: config, weights, the BPE model and the train counters; with
    `training` = (optimizer, scheduler, scaler) also their states and the random generators,
    so that training resumes exactly (last.pt, best.pt); without it, a model snapshot
    (step_N.pt, for averaging). rank_rng: every rank's generators (multi-rank runs); ema: the
    weight average's state, when `model_state` holds the raw weights (last.pt)."""
    ckpt = {
        "format_version": FORMAT_VERSION,
        "config": config,
        "model": model_state,
        "spm": tokenizer_state(tokenizer),
        "train_state": train_state,
    }
    if training is not None:
        optimizer, scheduler, scaler = training
        ckpt.update(
            optimizer=optimizer.state_dict(),
            scheduler=scheduler.state_dict(),
            scaler=scaler.state_dict(),
            rng=rng_state(),
        )
        if rank_rng is not None and len(rank_rng) > 1:
            ckpt["rank_rng"] = rank_rng
    if ema is not None:  # train.ema_decay: the weight average, beside the raw weights
        ckpt["ema"] = ema
    return ckpt


def restore_training(
    ckpt: dict[str, Any],
    model: nn.Module,
    optimizer: Any,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
) -> dict[str, Any]:
    """Load a resumable checkpoint into the training objects; returns its train counters."""
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    scaler.load_state_dict(ckpt["scaler"])
    counters: dict[str, Any] = ckpt["train_state"]
    return counters


def ema_of(ckpt: dict[str, Any]) -> dict[str, Any] | None:
    """The weight average a resumable checkpoint carries (train.ema_decay), if any."""
    return ckpt.get("ema")


def generators_of(ckpt: dict[str, Any], rank: int, world: int) -> tuple[dict[str, Any], bool]:
    """(the generator states this rank resumes with, whether they are its own): each rank's
    own where as many ranks saved them, else rank 0's."""
    rank_rng = ckpt.get("rank_rng")
    if rank_rng is not None and len(rank_rng) == world:
        return rank_rng[rank], True
    return ckpt["rng"], False


def config_of(ckpt: dict[str, Any], source: str = "checkpoint") -> Config:
    from mt.config import config_from_dict

    return config_from_dict(ckpt["config"], source)


@dataclass
class Trained:
    """A checkpoint opened for use: where it came from, the file's contents, and what they
    describe (the config, the BPE model, the model with its weights, on the CPU) and the
    precision its training computed in (see trained_precision)."""

    path: Path | None
    ckpt: dict[str, Any]
    config: Any  # mt.config.Config
    tokenizer: Any  # mt.data.tokenizer.Tokenizer
    model: Any  # mt.model.Seq2Seq
    precision: str


def open_trained(path: str | Path, what: str = "this command") -> Trained:
    """The one way in for a command that uses one model: a run directory (its best.pt, else
    last.pt) or a checkpoint file, loaded once, with its config, tokenizer and model (`what`:
    the command, named where a run of several members is given)."""
    path = resolve(path, what)
    return trained_from(load(path), path)


def trained_from(ckpt: dict[str, Any], path: Path | None = None) -> Trained:
    """A checkpoint already in memory (`path`, where it was read from, names it in errors)."""
    from mt.model import build_model

    if trained_objective(ckpt) != "translation":  # (mt pretrain's: a masked-LM encoder)
        raise MTError(
            f"{path or 'the checkpoint'} holds an encoder pretrained by mt pretrain (masked "
            f"LM), not a translation model: start a translation run from it with mt train "
            f"CONFIG --set model.init_encoder=RUN_DIR/pretrained.pt"
        )
    cfg = config_of(ckpt, str(path or "checkpoint"))
    tokenizer = tokenizer_from(ckpt)
    model = build_model(cfg.model, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    model.load_state_dict(ckpt["model"])
    return Trained(path, ckpt, cfg, tokenizer, model, trained_precision(ckpt))


def weights_of(ckpt: dict[str, Any]) -> dict[str, Any]:
    weights: dict[str, Any] = ckpt["model"]
    return weights


def set_decoding(ckpt: dict[str, Any], settings: dict[str, Any]) -> None:
    """Store decoding settings (decode keys: what `mt translate RUN_DIR` then uses) in the
    checkpoint; other keys of `settings` (a tuning record's valid_bleu) are left out."""
    decode = ckpt["config"]["decode"]
    decode.update({k: v for k, v in settings.items() if k in decode})


def trained_precision(ckpt: dict[str, Any]) -> str:
    """What the run computed in: the precision its trainer resolved (train.precision "auto"
    is fp32 on a CPU, bf16 on an Ampere or later GPU), else, in checkpoints from before that
    was recorded, the config's train.precision."""
    resolved = train_counters(ckpt).get("precision")
    return str(resolved or ckpt["config"]["train"].get("precision", "auto"))


def set_train_state(ckpt: dict[str, Any], train_state: dict[str, Any]) -> None:
    ckpt["train_state"] = train_state


def mark_pretrained(ckpt: dict[str, Any], what: str) -> None:
    """Say what a pretraining checkpoint holds (`mt pretrain`'s: "masked-lm encoder")."""
    ckpt["pretrained"] = what


def train_counters(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The training counters a checkpoint was saved with (mt.train.state.TrainState's fields;
    empty for a file that has none)."""
    counters: dict[str, Any] = ckpt.get("train_state", {})
    return counters


def trained_steps(ckpt: dict[str, Any]) -> int:
    return int(train_counters(ckpt).get("step", 0))


def trained_objective(ckpt: dict[str, Any]) -> str:
    """What the run trained: "translation" (mt train) or "masked_lm" (mt pretrain's encoder);
    a checkpoint written before this was recorded is a translation run's."""
    return str(train_counters(ckpt).get("objective", "translation"))


def config_dict(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The run's config as the checkpoint stores it (a plain dict; config_of validates it)."""
    config: dict[str, Any] = ckpt["config"]
    return config


def tokenizer_from(ckpt: dict[str, Any]) -> Tokenizer:
    from mt.data.tokenizer import Tokenizer, Vocabulary

    spm = ckpt["spm"]
    vocab = (
        Vocabulary.from_json(tensor_to_bytes(spm["vocab"]), "the checkpoint's vocabulary")
        if "vocab" in spm
        else None
    )
    return Tokenizer(
        tensor_to_bytes(spm["src"]), tensor_to_bytes(spm["tgt"]) if "tgt" in spm else None, vocab
    )


def same_tokenizer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two checkpoints hold the same BPE model(s) (and vocabulary)."""
    return a["spm"].keys() == b["spm"].keys() and all(
        torch.equal(a["spm"][k], b["spm"][k]) for k in a["spm"]
    )


def tokenizer_state(tokenizer: Tokenizer) -> dict[str, Any]:
    state = {"src": bytes_to_tensor(tokenizer.src_model)}
    if not tokenizer.joint:
        state["tgt"] = bytes_to_tensor(tokenizer.tgt_model)
    if tokenizer.vocab is not None:
        state["vocab"] = bytes_to_tensor(tokenizer.vocab.to_json())
    return state


def resolve(path: str | Path, what: str = "this command") -> Path:
    """A checkpoint file, or a run directory (its best.pt, else last.pt); a run of several
    members is refused (`what` takes one model: resolve_all takes their ensemble)."""
    path = Path(path)
    dirs = members.member_dirs(path) if path.is_dir() else None
    if dirs is not None:
        raise MTError(
            f"{path} is a run of {len(dirs)} members (train.members), and {what} takes one "
            f"model: give one member ({dirs[0]}), or distil the ensemble into one model "
            f"first (mt distill {path} ...)"
        )
    if path.is_dir():
        for name in ("best.pt", "last.pt"):
            if (path / name).is_file():
                return path / name
        raise MTError(f"{path} holds no best.pt or last.pt: train first with mt train")
    if not path.exists():
        raise MTError(f"{path} not found: give a run directory or a checkpoint file")
    return path


def resolve_all(paths: Sequence[str | Path]) -> list[Path]:
    """The checkpoints of `paths` (see resolve), a run of several members standing for each
    member's: the models of an ensemble."""
    out: list[Path] = []
    for path in paths:
        dirs = members.member_dirs(path) if Path(path).is_dir() else None
        out += [resolve(d) for d in dirs] if dirs is not None else [resolve(path)]
    return out


def snapshots(run_dir: Path) -> list[Path]:
    """The periodic model snapshots step_N.pt of a run, oldest first."""
    found = [
        (int(p.stem.split("_")[1]), p)
        for p in Path(run_dir).glob("step_*.pt")
        if p.stem.split("_")[1].isdigit()
    ]
    return [p for _, p in sorted(found)]


def rng_state() -> dict[str, Any]:
    """This process's generator states: torch's CPU one and, where there is CUDA, each GPU's."""
    return {
        "torch": torch.get_rng_state(),
        **({"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}),
    }


def set_rng_state(state: dict[str, Any], warn: Callable[[str], None] | None = None) -> None:
    """The generators as `rng_state` found them. GPUs are restored by index as far as both
    sides have them: a run saved on 8 GPUs resumes on 1 (and on 1 resumes on 8), and `warn`
    hears which generators could not be restored."""
    torch.set_rng_state(state["torch"])
    saved = state.get("cuda", [])
    here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index in range(min(len(saved), here)):
        torch.cuda.set_rng_state(saved[index], index)
    if warn is not None and len(saved) != here:
        warn(
            f"note: the checkpoint holds random generator states of {len(saved)} GPU(s), this "
            f"machine has {here}: restored {min(len(saved), here)}; dropout masks continue "
            f"from a fresh state on the others, so the resumed run is not bit-identical"
        )
