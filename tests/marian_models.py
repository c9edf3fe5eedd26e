"""transformers Marian models made here, offline, for the import and export tests: one that
follows OPUS-MT's conventions (separate source and target sentencepiece models over one
vocab.json whose ids are not theirs, </s> = 0, the pad token last and starting the decoder,
swish, a non-zero final_logits_bias), with random weights."""

from __future__ import annotations

import io
import json
from pathlib import Path

import sentencepiece as spm
import torch


def _spm(lines: list[str], size: int) -> bytes:
    buf = io.BytesIO()
    # sentencepiece's default ids (<unk> 0, <s> 1, </s> 2), as Marian's models have them
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buf,
        model_type="unigram",
        vocab_size=size,
        hard_vocab_limit=False,
        minloglevel=2,
        num_threads=1,
    )
    return buf.getvalue()


def _pieces(model: bytes) -> list[str]:
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(model)
    return [sp.IdToPiece(i) for i in range(sp.GetPieceSize()) if not sp.IsControl(i)]


def make_opus_like(
    folder: Path,
    src: list[str],
    tgt: list[str],
    seed: int = 0,
    d_model: int = 32,
    size: int = 200,
    codes: tuple[str, ...] = (),
    **languages: str,
) -> Path:
    """An OPUS-MT-like MarianMTModel with random weights and its MarianTokenizer in `folder`
    (save_pretrained's files), its sentencepiece models trained on `src` and `tgt`; codes: a
    multilingual model's target languages, each a token of the vocabulary (>>fr<<) as
    OPUS-MT's multilingual models have them; languages: tokenizer_config.json's source_lang
    and target_lang."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    models = {"source.spm": _spm(src, size), "target.spm": _spm(tgt, size)}
    for name, model in models.items():
        (folder / name).write_bytes(model)
    # one vocabulary over both models, numbered its own way: </s> 0, <unk> 1, the pieces in
    # order of first appearance (the target's first: no id is the sentencepiece one), pad last
    pieces = ["</s>", "<unk>", *(f">>{code}<<" for code in codes)]
    for piece in _pieces(models["target.spm"]) + _pieces(models["source.spm"]):
        if piece not in pieces:
            pieces.append(piece)
    pieces.append("<pad>")
    vocab = {p: i for i, p in enumerate(pieces)}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    pad = len(pieces) - 1
    config = MarianConfig(
        vocab_size=len(pieces),
        d_model=d_model,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        max_position_embeddings=128,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        dropout=0.1,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # weights large enough to matter
            if "embed_positions" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.1))
            if "layer_norm.weight" in name:
                p.add_(1.0)
        # a random bias, </s>'s raised so that some greedy outputs end early (random weights
        # otherwise repeat one piece to the length limit: here about half do)
        bias = torch.randn(1, len(pieces), generator=g)
        bias[0, 0] += 6.0
        model.final_logits_bias.copy_(bias)
    model.save_pretrained(folder)
    tok = MarianTokenizer(
        source_spm=str(folder / "source.spm"),
        target_spm=str(folder / "target.spm"),
        vocab=str(folder / "vocab.json"),
        **languages,
    )
    tok.save_pretrained(folder)
    return folder
