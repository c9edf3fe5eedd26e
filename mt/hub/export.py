"""`mt export RUN OUT --format transformers`: a Transformer run as a folder that transformers'
`MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` load with no code of
mt's: config.json and generation_config.json, the weights as safetensors, the sentencepiece
models with the vocabulary files MarianTokenizer reads, and a model card (README.md). The
folder is written by transformers itself (save_pretrained) from the mapped weights
(mt/hub/marian.py), so what it loads is what it wrote."""

from __future__ import annotations

import json
from pathlib import Path

from mt.artifacts import checkpoint
from mt.artifacts.export import check_out
from mt.data.textform import check_raw_text
from mt.errors import MTError
from mt.hub.card import check_license, model_card
from mt.hub.marian import to_marian
from mt.outputs import atomic_folder
from mt.tokens import BOS, EOS, PAD, UNK

ACTIVATION_NAMES = {"relu": "relu", "swish": "swish", "gelu": "gelu"}  # mt's -> transformers'


def transformers_modules():
    """transformers' Marian classes, or a one-line error naming the extra that installs it."""
    try:
        import transformers
    except ImportError:
        raise MTError("this needs the transformers package: pip install 'mt[hub]'") from None
    transformers.logging.set_verbosity_error()  # (its notes on unused keys are not the user's)
    transformers.logging.disable_progress_bar()  # (nor its bars for loading a small model)
    return transformers


def check_exportable(cfg) -> None:
    """What a Marian model cannot hold is refused, naming what would be lost."""
    check_raw_text(cfg.data)
    m = cfg.model
    if m.arch != "transformer":
        raise MTError(
            f"model.arch {m.arch}: a transformers Marian model is an encoder-decoder "
            f"Transformer; this run's {m.arch} would not survive the export"
        )
    if m.norm != "post":
        raise MTError(
            "model.norm pre: Marian's layers normalise after each residual (post-LN), and its "
            "stacks have no final LayerNorm; a pre-LN run would compute another function"
        )
    if m.positional != "sinusoidal":
        raise MTError(
            f"model.positional {m.positional}: Marian's positions are a fixed sinusoid; this "
            f"run's {m.positional} positions would be lost (export it to CTranslate2 instead: "
            f"--format ctranslate2)"
            if m.positional == "learned"
            else f"model.positional {m.positional}: Marian's positions are a fixed sinusoid; "
            f"mt's relative position keys would be lost"
        )


def marian_config(transformers, cfg, tokenizer):
    m = cfg.model
    return transformers.MarianConfig(
        vocab_size=tokenizer.src_vocab_size,
        decoder_vocab_size=tokenizer.tgt_vocab_size,
        d_model=m.d_model,
        encoder_layers=m.enc_layers,
        decoder_layers=m.dec_layers,
        encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads,
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.d_ff,
        activation_function=ACTIVATION_NAMES[m.activation],
        max_position_embeddings=m.max_positions,
        dropout=m.dropout,
        attention_dropout=m.attn_dropout,
        activation_dropout=m.dropout if m.act_dropout is None else m.act_dropout,
        scale_embedding=True,  # mt multiplies the embeddings by sqrt(d_model) (sec. 3.4)
        share_encoder_decoder_embeddings=m.tie_embeddings == "all",
        tie_word_embeddings=m.tie_embeddings != "none",
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=None,
        decoder_start_token_id=BOS,  # mt's targets start with BOS (Marian's with its pad)
        forced_eos_token_id=EOS,
    )


def generation_config(transformers, cfg, banned: int | None = None):
    """How `generate` searches by default: the run's beam and length penalty (as tuned on valid
    at the end of mt train), finishing a sentence's beam at K finished hypotheses as mt does
    (early_stopping), never emitting what mt's search never emits (pad, BOS, <unk>, and the
    back-translation tag where the run reserved it: `banned`)."""
    never = [[PAD], [BOS], [UNK]] + ([] if banned is None else [[banned]])
    return transformers.GenerationConfig(
        num_beams=cfg.decode.beam,
        length_penalty=cfg.decode.length_penalty,
        early_stopping=True,
        max_length=cfg.model.max_positions,
        bad_words_ids=never,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=EOS,
    )


def _write_tokenizer(transformers, tokenizer, out: Path, langs: tuple[str, str]) -> None:
    """source.spm, target.spm and vocab.json (target_vocab.json where the sides' ids differ):
    MarianTokenizer looks each sentencepiece piece up in the vocabulary, which holds mt's ids."""
    (out / "source.spm").write_bytes(tokenizer.src_model)
    (out / "target.spm").write_bytes(tokenizer.tgt_model)
    separate = not tokenizer.shared_ids
    files = {"vocab.json": "src"} | ({"target_vocab.json": "tgt"} if separate else {})
    for name, side in files.items():
        ids = {piece: i for i, piece in enumerate(tokenizer.pieces(side))}
        (out / name).write_text(json.dumps(ids, ensure_ascii=False, indent=1), encoding="utf-8")
    pieces = tokenizer.pieces("tgt")
    marian = transformers.MarianTokenizer(
        source_spm=str(out / "source.spm"),
        target_spm=str(out / "target.spm"),
        vocab=str(out / "vocab.json"),
        target_vocab_file=str(out / "target_vocab.json") if separate else None,
        separate_vocabs=separate,
        unk_token=pieces[UNK],
        eos_token=pieces[EOS],
        pad_token=pieces[PAD],
        source_lang=langs[0],  # (tokenizer_config.json: the direction, which an import checks)
        target_lang=langs[1],
    )
    marian.save_pretrained(str(out))


def export(
    run: Path, out: Path, scores: Path | None = None, force: bool = False, license_id="unknown"
) -> Path:
    """Write the transformers Marian model of a run (its best.pt, else last.pt) into `out`."""
    check_license(license_id)
    transformers = transformers_modules()
    trained = checkpoint.open_trained(run, "mt export")
    cfg, tokenizer, model = trained.config, trained.tokenizer, trained.model
    evaluated = _read_scores(scores) if scores is not None else None
    check_out(out, force, "config.json")
    check_exportable(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    m = cfg.model
    with atomic_folder(out) as folder:  # an earlier export (--force) replaced when this is whole
        marian = transformers.MarianMTModel(marian_config(transformers, cfg, tokenizer))
        state = to_marian(model.state_dict(), m.enc_layers, m.dec_layers, m.tie_embeddings)
        missing, unexpected = marian.load_state_dict(state, strict=False)
        assert not unexpected and all("embed_positions" in k for k in missing), (
            missing,
            unexpected,
        )
        marian.generation_config = generation_config(transformers, cfg, tokenizer.never_written())
        marian.save_pretrained(str(folder))
        _write_tokenizer(transformers, tokenizer, folder, (cfg.data.src_lang, cfg.data.tgt_lang))
        (folder / "README.md").write_text(
            model_card(trained, run, out, evaluated, license_id), encoding="utf-8"
        )
    return out


def _read_scores(path: Path) -> dict:
    """The scores `mt eval --json` printed (one system), for the model card."""
    try:
        scores = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise MTError(f"--scores {path}: not the JSON of mt eval --json ({e})") from None
    if not isinstance(scores, dict) or not {"bleu", "bleu_signature"} <= scores.keys():
        raise MTError(
            f"--scores {path}: not the JSON of one system's mt eval --json (it has no bleu "
            f"and bleu_signature); write it with mt eval RUN --src TEST --ref REF --json"
        )
    return scores
