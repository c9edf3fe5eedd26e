"""A pretrained encoder: what masked-language-model pretraining (`mt pretrain`, BERT: Devlin et
al. 2019) trains, and `model.init_encoder: PATH`, which starts a translation run from it."""

from __future__ import annotations

from pathlib import Path

from mt.artifacts import checkpoint
from mt.errors import MTError

# what `mt train` does with these and `mt pretrain` does not: said once, not an error, since
# one config usually serves both commands
TRAIN_ONLY = (
    "ema_decay",
    "rdrop_alpha",
    "scheduled_sampling",
    "compile",
    "pack_width",
    "bpe_dropout",
    "bidirectional_share",
    "word_dropout",
    "average_last",
)


def _defaults(t) -> dict:
    """TRAIN_ONLY's options at their defaults (t: a TrainConfig)."""
    return {k: type(t).model_fields[k].get_default(call_default_factory=True) for k in TRAIN_ONLY}


def translation_options_off(t):
    """The train config `t` (TrainConfig) with TRAIN_ONLY's options at their defaults."""
    return t.model_copy(update=_defaults(t))


def ignored_options(t) -> list[str]:
    """TRAIN_ONLY's options that `t` sets, as train.KEY."""
    return [f"train.{k}" for k, default in _defaults(t).items() if getattr(t, k) != default]


def encoder_parameters(model) -> list:
    """The parameters the masked-LM loss reaches: the encoder's, the (tied) source embedding
    and learned positions; each once."""
    seen, out = set(), []
    for module in (model.encoder, model.enc_norm, model.src_embed, model.positions):
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def encoder_keys(state: dict) -> list[str]:
    """The weights that belong to the encoder side: its layers and final norm, the source
    embedding and the position table (learned positions)."""
    return [k for k in state if k.startswith(("encoder.", "enc_norm.", "src_embed.", "positions."))]


def pretrained_tokenizer(path: str | None, log=print):
    """The BPE model of the pretrained encoder at `path` (model.init_encoder), which a new run
    starting from it adopts; None without one."""
    if not path:
        return None
    log(f"using the BPE model of {path} (model.init_encoder)")
    return checkpoint.tokenizer_from(checkpoint.load(encoder_checkpoint(path)))


def encoder_checkpoint(path: str) -> Path:
    """model.init_encoder's checkpoint: the file given, or in a run directory (as every
    command takes one) mt pretrain's pretrained.pt, else a training's best.pt or last.pt."""
    found = Path(path)
    if not found.is_dir():
        return found
    names = ("pretrained.pt", "best.pt", "last.pt")
    for name in names:
        if (found / name).is_file():
            return found / name
    raise MTError(
        f"model.init_encoder {path}: a folder without {', '.join(names)}; give the --run-dir "
        f"of mt pretrain (or of mt train), or a checkpoint"
    )


def init_encoder(model, path: str, tokenizer, log=print) -> None:
    """Load a pretrained encoder (RUN_DIR/pretrained.pt, or any mt checkpoint) into `model`:
    the same tokenizer and the same shapes, or a one-line error."""
    ckpt = checkpoint.load(encoder_checkpoint(path))
    pre_tok = checkpoint.tokenizer_from(ckpt)
    if pre_tok.src_model != tokenizer.src_model:
        raise MTError(
            f"model.init_encoder {path}: its BPE model differs from this run's; "
            f"train the run with the pretraining's tokenizer (start it in a new "
            f"--run-dir: it then adopts the pretrained BPE model)"
        )
    theirs, ours = checkpoint.weights_of(ckpt), model.state_dict()
    keys = encoder_keys(theirs)
    wrong = [k for k in keys if k not in ours or ours[k].shape != theirs[k].shape]
    if wrong or not keys:
        raise MTError(
            f"model.init_encoder {path}: its encoder does not fit this model "
            f"({(wrong or ['no encoder weights'])[0]}); use the same model.d_model, "
            f"n_heads, enc_layers, d_ff and positional as the pretraining"
        )
    model.load_state_dict({k: theirs[k] for k in keys}, strict=False)
    log(f"encoder initialised from {path} ({len(keys)} tensors)")
