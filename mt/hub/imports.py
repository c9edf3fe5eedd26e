"""`model.init_from: PATH_OR_HUB_ID`: a run that starts from a transformers Marian model (an
OPUS-MT model, or an mt export), so that fine-tuning a published model on one's own corpus is
one config. The model's architecture becomes the run's model settings (a config that says
otherwise is refused), its tokenizer the run's, its weights the first step's. Afterwards the
run is an ordinary mt run: its checkpoints hold mt's config, tokenizer and weights.

OPUS-MT's conventions, which mt holds as options of its own: the swish activation
(model.activation), an output bias (model.output_bias, Marian's final_logits_bias), and a
vocab.json numbering the pieces of two sentencepiece models its own way, with </s> = 0 and the
pad token starting the decoder. The vocabulary is reordered so that mt's four special ids
(PAD, UNK, BOS, EOS = 0-3) hold the model's pad, <unk>, decoder start and </s> (a start token
that is the pad token takes a row of its own, a copy of the pad's); the embedding, output and
bias rows follow, so every logit is the model's own."""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from mt.config.load import with_fixed
from mt.data.pairs import Languages, tag
from mt.data.tokenizer import Tokenizer, Vocabulary
from mt.errors import MTError, first_line
from mt.hub import HUB_ID
from mt.hub.export import transformers_modules
from mt.hub.marian import from_marian, tie_mode
from mt.tokens import BOS, EOS, PAD, UNK

ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
LANGUAGE_TOKEN = re.compile(r">>([^<>\s]+)<<")


class Imported:
    """A Marian model read once: transformers' model and tokenizer, and mt's view of them (the
    settings it fixes, the vocabulary order, the tokenizer)."""

    def __init__(self, source: str):
        self.source = source
        transformers = transformers_modules()
        _check_is_marian(source, transformers)
        try:
            self.model = transformers.MarianMTModel.from_pretrained(source).eval()
            self.hf_tokenizer = transformers.MarianTokenizer.from_pretrained(source)
        except (OSError, ValueError, KeyError, AssertionError, TypeError) as e:
            raise MTError(f"model.init_from {source}: cannot load it ({first_line(e)})") from None
        self.config = self.model.config
        hf_tok, c = self.hf_tokenizer, self.config
        target = hf_tok.target_encoder if hf_tok.separate_vocabs else hf_tok.encoder
        sides = [
            ("vocab.json", hf_tok.encoder, c.vocab_size),
            ("target vocabulary", target, c.decoder_vocab_size),
        ]
        for name, vocab, size in sides:
            past = [p for p, i in vocab.items() if not 0 <= i < size]
            if past:
                raise MTError(
                    f"model.init_from {source}: its {name} numbers {len(past)} piece(s) "
                    f"({', '.join(map(repr, past[:3]))}) at or past the model's vocabulary "
                    f"size {size}: the vocabulary and the weights are not one model's; restore "
                    f"the folder as it was saved"
                )
        self.src_order, src_pieces = _order(hf_tok.encoder, self, c.vocab_size)
        self.tgt_order, tgt_pieces = _order(target, self, c.decoder_vocab_size)
        src_spm, tgt_spm = (Path(f).read_bytes() for f in self.hf_tokenizer.spm_files)
        self.tokenizer = Tokenizer(src_spm, tgt_spm, Vocabulary(src_pieces, tgt_pieces))

    @property
    def target_tokens(self) -> list[str]:
        """The languages of a multilingual model's target-language tokens (">>fr<<" in its
        source vocabulary, which MarianTokenizer keeps whole): what a source may ask for."""
        found = (LANGUAGE_TOKEN.fullmatch(p) for p in self.hf_tokenizer.encoder)
        return sorted(m.group(1) for m in found if m)

    @property
    def languages(self) -> tuple[str | None, str | None]:
        """(source, target) as its tokenizer_config.json says them (None where it does not)."""
        kwargs = self.hf_tokenizer.init_kwargs
        return kwargs.get("source_lang"), kwargs.get("target_lang")

    def settings(self) -> dict[str, Any]:
        """The run settings (dotted keys) the model fixes; what mt cannot hold is refused."""
        c = self.config
        where = f"model.init_from {self.source}"
        if c.encoder_attention_heads != c.decoder_attention_heads:
            raise MTError(
                f"{where}: its encoder and decoder have different head counts; "
                f"mt's model.n_heads is one for both"
            )
        if c.encoder_ffn_dim != c.decoder_ffn_dim:
            raise MTError(
                f"{where}: its encoder and decoder feed-forward widths differ; "
                f"mt's model.d_ff is one for both"
            )
        if not c.scale_embedding:
            raise MTError(
                f"{where}: it does not scale its embeddings by sqrt(d_model) "
                f"(scale_embedding false), which mt always does"
            )
        if c.activation_function not in ACTIVATIONS:
            raise MTError(
                f"{where}: its activation {c.activation_function} is not one of mt's "
                f"model.activation (relu, swish, gelu)"
            )
        bias = self.model.final_logits_bias
        return {
            "model.arch": "transformer",
            "model.d_model": c.d_model,
            "model.n_heads": c.encoder_attention_heads,
            "model.enc_layers": c.encoder_layers,
            "model.dec_layers": c.decoder_layers,
            "model.d_ff": c.encoder_ffn_dim,
            "model.norm": "post",
            "model.positional": "sinusoidal",
            "model.tie_embeddings": tie_mode(
                c.share_encoder_decoder_embeddings, c.tie_word_embeddings
            ),
            "model.max_positions": c.max_position_embeddings,
            "model.activation": ACTIVATIONS[c.activation_function],
            "model.output_bias": bool(bias.any()),
            "tokenizer.joint": self.tokenizer.shared_ids,
            "tokenizer.vocab_size": self.tokenizer.src_vocab_size,  # (what config.yaml says)
        }

    def weights(self, output_bias: bool) -> dict[str, torch.Tensor]:
        """mt's state_dict of the model (mt's ids, mt's layout)."""
        c = self.config
        tie = tie_mode(c.share_encoder_decoder_embeddings, c.tie_word_embeddings)
        return from_marian(
            self.model.state_dict(),
            c.encoder_layers,
            c.decoder_layers,
            tie,
            torch.tensor(self.src_order),
            torch.tensor(self.tgt_order),
            output_bias,
        )


def _check_is_marian(source: str, transformers) -> None:
    """A folder with a Marian config.json, or a hub id whose config says Marian; else one line."""
    where = f"model.init_from {source}"
    path = Path(source).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise MTError(
                f"{where} is not a transformers model folder (no config.json); give the "
                f"folder of a MarianMTModel (save_pretrained's, or mt export --format "
                f"transformers's) or a Hugging Face hub id"
            )
        try:
            kind = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
        except (ValueError, UnicodeDecodeError, AttributeError):
            raise MTError(f"{where}: its config.json is not JSON; restore it") from None
        if kind == "marian":
            _check_files(path, where)
    elif not HUB_ID.fullmatch(source) or _looks_local(source):
        raise MTError(
            f"{where}: no such folder (relative to {Path.cwd()}), and not a Hugging Face "
            f"hub id (OWNER/NAME)"
        )
    elif os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise MTError(
            f"{where}: no such folder here, and HF_HUB_OFFLINE is set: download it where the "
            f"hub is reachable (hf download {source} --local-dir DIR) and set "
            f"model.init_from: DIR"
        )
    else:
        try:
            kind = transformers.AutoConfig.from_pretrained(source).model_type
        except (OSError, ValueError) as e:
            raise MTError(
                f"{where}: no such folder here, and the Hugging Face hub cannot give it "
                f"({first_line(e)}); where the hub is reachable, download it (hf download "
                f"{source} --local-dir DIR) and set model.init_from: DIR"
            ) from None
    if kind != "marian":
        raise MTError(
            f"{where} is a {kind} model; mt starts from Marian models (MarianMTModel, as OPUS-MT's)"
        )


# what a Marian model folder holds: save_pretrained's of the model and of MarianTokenizer
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_TOKENIZER = ("source.spm", "target.spm", "vocab.json")


def _check_files(path: Path, where: str) -> None:
    """Every file the import reads, named when one is missing (transformers would fail on it
    with a TypeError far from the cause)."""
    missing = [name for name in _TOKENIZER if not (path / name).is_file()]
    if not any((path / name).is_file() for name in _WEIGHTS):
        missing.insert(0, " or ".join(_WEIGHTS))
    if missing:
        raise MTError(
            f"{where} lacks {', '.join(missing)}: a Marian model folder holds the model's "
            f"weights and its MarianTokenizer's files (save_pretrained of both); copy them in"
        )


def _looks_local(source: str) -> bool:
    """A path mistyped rather than a hub id: its first part is a folder here (runs/typo)."""
    first = source.split("/")[0]
    return "/" in source and Path(first).expanduser().is_dir()


def _order(vocab: dict[str, int], imported: Imported, size: int) -> tuple[list[int], tuple]:
    """(mt's id -> the model's, the piece of each mt id): the model's pad, <unk>, decoder start
    and </s> at mt's PAD, UNK, BOS and EOS, then its other ids in their order."""
    c, tok = imported.config, imported.hf_tokenizer
    named = {i: p for p, i in vocab.items() if 0 <= i < size}
    unk = vocab.get(str(tok.unk_token))
    specials = [c.pad_token_id, unk, c.decoder_start_token_id, c.eos_token_id]
    if None in specials or len({c.pad_token_id, unk, c.eos_token_id}) < 3:
        raise MTError(
            f"model.init_from {imported.source}: its pad, <unk> and </s> tokens are not three "
            f"ids of its vocabulary; mt needs each"
        )
    taken = set(specials)
    order = specials + [i for i in range(size) if i not in taken]
    pieces = [named.get(i, f"<unused{i}>") for i in order]
    if c.decoder_start_token_id == c.pad_token_id:  # (OPUS-MT's): BOS a token of its own
        pieces[BOS] = "<s>" if "<s>" not in vocab else "<mt:bos>"
    assert [order[i] for i in (PAD, UNK, EOS)] == [c.pad_token_id, unk, c.eos_token_id]
    return order, tuple(pieces)


@functools.lru_cache(maxsize=1)
def imported(source: str) -> Imported:
    """The model at `source`, read once per process (the config, the tokenizer and the
    weights all come from it)."""
    return Imported(source)


def with_imported_settings(cfg, written: set[str], where: str):
    """cfg with the settings the imported model fixes; a setting the user wrote (`written`,
    dotted keys) that says otherwise is refused, as is any tokenizer setting but joint (the
    model brings its tokenizer)."""
    source = cfg.model.init_from
    model = imported(source)
    fixed = model.settings()
    langs, tokens = Languages.of(cfg.data), model.target_tokens
    if tokens:  # a multilingual model: its tokens say what it writes
        _check_targets(langs, tokens, source, where)
        fixed["data.target_token"] = True
    else:
        _check_direction(langs, model.languages, source, where)
        _check_no_targets(langs, source, where)
    for key in sorted(written):
        if key.startswith("tokenizer.") and key not in fixed:
            raise MTError(
                f"{where}: {key}: model.init_from {source} brings its own tokenizer; remove {key}"
            )
    return with_fixed(cfg, fixed, written, where, source)


def _check_direction(
    langs: Languages, theirs: tuple[str | None, str | None], source: str, where: str
) -> None:
    """A bilingual model's direction (its tokenizer_config.json's, where it says) is the run's."""
    ours = (langs.default.src, langs.default.tgt)
    several = len(langs.pairs) > 1
    if None not in theirs and (theirs != ours or several):
        raise MTError(
            f"{where}: model.init_from {source} translates {theirs[0]} -> {theirs[1]} (its "
            f"tokenizer_config.json), but this run's data is {langs.describe()}: set "
            f"data.src_lang and data.tgt_lang to its direction, or start from a model of "
            f"{'these pairs' if several else 'this direction'}"
        )


def _check_no_targets(langs: Languages, source: str, where: str) -> None:
    """A model without target-language tokens cannot be told which language to write."""
    if langs.tagged:
        raise MTError(
            f"{where}: model.init_from {source} has no target-language tokens (>>fr<<), so "
            f"sources cannot ask it for {', '.join(langs.targets)}: start from a multilingual "
            f"model (one with such tokens), or train it on one target language"
        )


def _check_targets(langs: Languages, tokens: list[str], source: str, where: str) -> None:
    """Every target language of the run has its token in the multilingual model."""
    missing = [lang for lang in langs.targets if lang not in tokens]
    if missing:
        shown = ", ".join(tag(t) for t in tokens[:12]) + (", ..." if len(tokens) > 12 else "")
        raise MTError(
            f"{where}: model.init_from {source} has no token for {', '.join(missing)} "
            f"({', '.join(tag(m) for m in missing)}); it writes {len(tokens)} target "
            f"language(s): {shown}. Name the target files with its codes (train.{tokens[0]})"
        )


def init_from(model, source: str, output_bias: bool, log) -> None:
    """Load the imported model's weights into `model` (built from the settings it fixed)."""
    weights = imported(source).weights(output_bias)
    model.load_state_dict(weights)
    log(f"model.init_from {source}: starting from its weights ({len(weights)} tensors)")
