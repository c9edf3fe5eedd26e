"""The architectures (`model.arch`): the encoder-decoder Transformer, the RNN encoder-decoder
with or without attention, and the decoder-only Transformer. All speak `Seq2Seq`."""

from mt.model.base import Seq2Seq
from mt.model.decoder_only import DecoderOnly
from mt.model.layers import REFERENCE, Parts
from mt.model.nat import NATransformer
from mt.model.rnn import RNNSeq2Seq
from mt.model.transformer import Transformer

__all__ = [
    "REFERENCE",
    "DecoderOnly",
    "NATransformer",
    "Parts",
    "RNNSeq2Seq",
    "Seq2Seq",
    "Transformer",
    "build_model",
]


def build_model(cfg, src_vocab: int, tgt_vocab: int, parts: Parts = REFERENCE) -> Seq2Seq:
    """cfg: ModelConfig. parts: the module classes to build from (mt.fast.PARTS for the CPU
    speed paths; the reference modules by default)."""
    common = {
        "src_vocab": src_vocab,
        "tgt_vocab": tgt_vocab,
        "d_model": cfg.d_model,
        "dropout": cfg.dropout,
        "tie_embeddings": cfg.tie_embeddings,
        "max_positions": cfg.max_positions,
        "parts": parts,
    }
    if cfg.arch == "rnn":
        return RNNSeq2Seq(
            enc_layers=cfg.enc_layers, dec_layers=cfg.dec_layers, attention=cfg.attention, **common
        )
    attn = dict(
        n_heads=cfg.n_heads,
        d_ff=cfg.d_ff,
        attn_dropout=cfg.attn_dropout,
        act_dropout=cfg.act_dropout,
        pre_norm=cfg.norm == "pre",
        positional=cfg.positional,
        max_relative=cfg.max_relative,
        activation=cfg.activation,
        output_bias=cfg.output_bias,
        **common,
    )
    if cfg.arch == "decoder_only":
        return DecoderOnly(layers=cfg.dec_layers, **attn)
    if cfg.arch == "nat":
        return NATransformer(enc_layers=cfg.enc_layers, dec_layers=cfg.dec_layers, **attn)
    return (parts.transformer or Transformer)(
        enc_layers=cfg.enc_layers, dec_layers=cfg.dec_layers, **attn
    )
