"""The architectures (`model.arch`): the encoder-decoder Transformer, the RNN encoder-decoder
with or without attention, and the decoder-only Transformer. All speak `Seq2Seq`."""

from mt.model.base import Seq2Seq
from mt.model.decoder_only import DecoderOnly
from mt.model.layers import REFERENCE, LayerShape, Parts
from mt.model.nat import NATransformer
from mt.model.rnn import RNNSeq2Seq
from mt.model.transformer import Transformer

__all__ = [
    "REFERENCE",
    "DecoderOnly",
    "LayerShape",
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
        "tie_embeddings": cfg.tie_embeddings,
        "max_positions": cfg.max_positions,
        "parts": parts,
    }
    if cfg.arch == "rnn":
        return RNNSeq2Seq(
            d_model=cfg.d_model,
            dropout=cfg.dropout,
            enc_layers=cfg.enc_layers,
            dec_layers=cfg.dec_layers,
            attention=cfg.attention,
            **common,
        )
    attn = dict(
        shape=layer_shape(cfg),
        positional=cfg.positional,
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


def layer_shape(cfg) -> LayerShape:
    """The LayerShape of a ModelConfig's Transformer blocks."""
    return LayerShape(
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_ff=cfg.d_ff,
        dropout=cfg.dropout,
        attn_dropout=cfg.attn_dropout,
        act_dropout=cfg.act_dropout,
        pre_norm=cfg.norm == "pre",
        relative=cfg.max_relative if cfg.positional == "relative" else 0,
        activation=cfg.activation,
    )
