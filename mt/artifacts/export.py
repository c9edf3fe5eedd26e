"""`mt export RUN_DIR --to ctranslate2 OUT`: a Transformer run as a CTranslate2 model
directory, for fast inference (github.com/OpenNMT/CTranslate2), through the `ctranslate2`
package's converter API (TransformerSpec.from_config). mt's sinusoidal (or learned) position
table goes in as it is, the fused Q/K/V and K/V projections map onto CTranslate2's fused ones,
and the sentencepiece model(s) are copied beside the model."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mt.artifacts import checkpoint
from mt.data.pairs import Languages, tag
from mt.data.textform import check_raw_text
from mt.errors import MTError
from mt.outputs import atomic_folder, check_folder_creatable

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int16", "float16", "bfloat16", "float32")


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise MTError("exporting needs the ctranslate2 package: pip install 'mt[export]'") from None
    return ctranslate2


def check_exportable(cfg) -> None:
    """What CTranslate2's Transformer cannot represent is refused before any work."""
    check_raw_text(cfg.data)
    m = cfg.model
    if m.arch != "transformer":
        raise MTError(
            f"model.arch {m.arch}: only the encoder-decoder Transformer can be "
            f"exported to CTranslate2"
        )
    if m.positional == "relative":
        raise MTError(
            "model.positional relative: mt's relative positions (Shaw et al., key "
            "term only) have no CTranslate2 equivalent; export a run with sinusoidal "
            "or learned positions"
        )


def _np(t: torch.Tensor):
    return t.detach().float().cpu().numpy()


def _linear(spec, layer: torch.nn.Linear) -> None:
    spec.weight = _np(layer.weight)
    if layer.bias is not None:
        spec.bias = _np(layer.bias)


def _norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _attention(spec, attn, cross: bool) -> None:
    if cross:  # CTranslate2: [query, fused key/value, output]
        _linear(spec.linear[0], attn.q)
        _linear(spec.linear[1], attn.kv)
    else:  # [fused query/key/value, output]
        _linear(spec.linear[0], attn.qkv)
    _linear(spec.linear[-1], attn.out)


def _ffn(spec, ffn, norm) -> None:
    _linear(spec.linear_0, ffn.net[0])
    _linear(spec.linear_1, ffn.net[3])
    _norm(spec.layer_norm, norm)


def _inputs(spec, embedding: torch.nn.Embedding, positions) -> None:
    (spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings).weight = _np(
        embedding.weight
    )
    spec.scale_embeddings = True  # x sqrt(d_model), sec. 3.4
    table = positions.table if positions.kind == "sinusoidal" else positions.learned.weight
    spec.position_encodings.encodings = _np(table)


def model_spec(model, cfg, tokenizer):
    """The CTranslate2 TransformerSpec holding `model`'s weights and vocabularies."""
    ct2 = _ctranslate2()
    from ctranslate2.specs import transformer_spec

    m = cfg.model
    spec = transformer_spec.TransformerSpec.from_config(
        (m.enc_layers, m.dec_layers),
        m.n_heads,
        pre_norm=m.norm == "pre",
        activation=getattr(ct2.specs.Activation, m.activation.upper()),  # RELU, SWISH, GELU
    )
    _inputs(spec.encoder, model.src_embed, model.positions)
    for s, layer in zip(spec.encoder.layer, model.encoder, strict=True):
        _attention(s.self_attention, layer.self_attn, cross=False)
        _norm(s.self_attention.layer_norm, layer.res1.norm)
        _ffn(s.ffn, layer.ffn, layer.res2.norm)
    _inputs(spec.decoder, model.tgt_embed, model.positions)
    for s, layer in zip(spec.decoder.layer, model.decoder, strict=True):
        _attention(s.self_attention, layer.self_attn, cross=False)
        _norm(s.self_attention.layer_norm, layer.res1.norm)
        _attention(s.attention, layer.cross_attn, cross=True)
        _norm(s.attention.layer_norm, layer.res2.norm)
        _ffn(s.ffn, layer.ffn, layer.res3.norm)
    if m.norm == "pre":
        _norm(spec.encoder.layer_norm, model.enc_norm)
        _norm(spec.decoder.layer_norm, model.dec_norm)
    spec.decoder.projection.weight = _np(model.output_weight)
    if model.output_bias is not None:
        spec.decoder.projection.bias = _np(model.output_bias)
    spec.register_source_vocabulary(tokenizer.pieces("src"))
    spec.register_target_vocabulary(tokenizer.pieces("tgt"))
    spec.config.add_source_eos = True  # mt's sources end with EOS
    spec.config.decoder_start_token = "<s>"  # and targets start with BOS
    return spec


def export(run: Path, out: Path, quantization: str | None = None, force: bool = False) -> Path:
    """Write the CTranslate2 model of a run (its best.pt, else last.pt) into `out`."""
    ct2 = _ctranslate2()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise MTError(f"--quantization {quantization}: use one of {', '.join(QUANTIZATIONS)}")
    trained = checkpoint.open_trained(run, "mt export")
    cfg, tokenizer, model = trained.config, trained.tokenizer, trained.model
    check_exportable(cfg)
    check_out(out, force)

    # ctranslate2 is imported when export runs (an optional extra)
    class Converter(ct2.converters.Converter):  # type: ignore[name-defined]
        def _load(self):
            return model_spec(model.eval(), cfg, tokenizer)

    with atomic_folder(out) as folder:  # an earlier export (--force) replaced when this is whole
        Converter().convert(str(folder), quantization=quantization, force=True)
        _describe(folder, trained, cfg, tokenizer, quantization)
    return out


def _describe(folder: Path, trained, cfg, tokenizer, quantization: str | None) -> None:
    """The export's BPE model(s) and mt_export.json (what it came from, how it decodes)."""
    tokenizer.save(folder)  # spm.model, or spm.src/tgt.model
    (folder / "mt_export.json").write_text(
        json.dumps(
            {
                "from": str(trained.path),
                "quantization": quantization or "float32",
                "source_tokens": "sentencepiece pieces of the source (spm.model or spm.src.model); "
                "the model appends </s>" + _lead(cfg),
                "decode": {"beam": cfg.decode.beam, "length_penalty": cfg.decode.length_penalty},
            },
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )


def _lead(cfg) -> str:
    """A model of several target languages: the token a source starts with."""
    langs = Languages.of(cfg.data)
    if not langs.tagged:
        return ""
    tokens = ", ".join(tag(lang) for lang in langs.targets)
    return f"; first the token of the language to translate into, one piece ({tokens})"


def check_out(out: Path, force: bool, marker: str = "model.bin") -> None:
    """OUT is absent, an empty folder, or (with --force) an earlier export of the same format,
    recognised by its `marker` file; never a user's other folder. Nothing is removed here."""
    if out.exists() and not out.is_dir():
        raise MTError(f"{out} is a file; give a folder for the exported model")
    check_folder_creatable(out.parent, "export")  # OUT is removed and made again in it
    if out.exists() and any(out.iterdir()):
        if not force:
            raise MTError(f"{out} already exists and is not empty; pass --force to replace it")
        if not (out / marker).is_file():
            raise MTError(
                f"{out} is not an exported model (no {marker}): mt will not replace "
                f"it even with --force; choose another folder"
            )
