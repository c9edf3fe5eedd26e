"""The model section: the architecture and its sizes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from mt.config.section import Section, user_path


class ModelConfig(Section):
    # transformer: encoder-decoder (Vaswani et al. 2017); rnn: bidirectional GRU encoder and
    # GRU decoder; decoder_only: one causal Transformer over `source <sep> target`.
    # nat: the non-autoregressive Transformer of Mask-Predict (Ghazvininejad et al. 2019).
    arch: Literal["transformer", "rnn", "decoder_only", "nat"] = Field(
        "transformer",
        description="transformer: encoder-decoder; rnn: bidirectional GRU encoder, GRU decoder; "
        "decoder_only: one causal Transformer over source <sep> target; nat: Mask-Predict",
    )
    # rnn only: bahdanau (additive), luong (multiplicative), none (one fixed context vector).
    attention: Literal["bahdanau", "luong", "none"] = Field(
        "bahdanau", description="rnn only: the decoder's attention over the source"
    )
    # transformer / decoder_only: sinusoidal or learned absolute positions, or relative
    # positions in self-attention (Shaw et al. 2018) clipped at max_relative.
    positional: Literal["sinusoidal", "learned", "relative"] = Field(
        "sinusoidal", description="how a Transformer knows positions"
    )
    max_relative: int = Field(
        16, ge=1, le=1 << 16, description="relative positions: distances are clipped at this"
    )
    d_model: int = Field(256, ge=8, le=1 << 16, description="width of embeddings and hidden states")
    n_heads: int = Field(4, ge=1, le=1 << 10, description="attention heads (must divide d_model)")
    enc_layers: int = Field(3, ge=1, le=1 << 10, description="encoder layers")
    dec_layers: int = Field(3, ge=1, le=1 << 10, description="decoder layers")
    d_ff: int = Field(1024, ge=1, le=1 << 18, description="hidden width of each feed-forward layer")
    dropout: float = Field(
        0.1, ge=0.0, lt=1.0, description="dropout on embeddings and every sublayer's output"
    )
    attn_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on attention weights")
    # dropout on the FFN's hidden activation (tensor2tensor's relu_dropout; fairseq's
    # activation_dropout, 0 by default there and in Wu et al. 2021's transformer_tiny)
    act_dropout: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="dropout on the FFN's hidden activation; unset = model.dropout",
    )
    norm: Literal["post", "pre"] = Field(
        "post",
        description="LayerNorm after each residual (post, Vaswani et al.) or before each "
        "sublayer (pre, Xiong et al. 2020)",
    )
    # none: three matrices; decoder: target embedding = output projection (Press & Wolf 2017);
    # all: source, target and output share one matrix (needs tokenizer.joint).
    tie_embeddings: Literal["none", "decoder", "all"] = Field(
        "all",
        description="none: three matrices; decoder: target embedding = output layer; "
        "all: source, target and output share one (needs tokenizer.joint)",
    )
    activation: Literal["relu", "swish", "gelu"] = Field(
        "relu",
        description="the feed-forward layers' nonlinearity: relu (the paper's), swish (SiLU, "
        "as OPUS-MT's Marian models), gelu",
    )
    output_bias: bool = Field(
        False, description="a learned bias per output token added to the logits (as Marian's)"
    )
    max_positions: int = Field(
        1024, ge=8, le=1 << 20, description="the longest sequence the model takes"
    )
    init_encoder: str | None = Field(
        None,
        description="start the encoder from a masked-LM pretraining (RUN_DIR/pretrained.pt "
        "of mt pretrain)",
    )

    init_from: str | None = Field(
        None,
        description="start from an mt run (its run directory: best.pt, else last.pt; or a "
        "checkpoint), of any architecture, with a fresh optimizer and schedule; or from a "
        "transformers Marian model (a folder, or a Hugging Face hub id such as "
        "Helsinki-NLP/opus-mt-de-en): its architecture, weights and tokenizer",
    )

    init_optimizer: bool = Field(
        False,
        description="with model.init_from an mt run: continue its optimizer (Adam's moments) "
        "and its schedule's step too, as if that run went on with this config's data (its "
        "last.pt: a run directory's, or the checkpoint named); false: a fresh optimizer and "
        "schedule, as fine-tuning takes",
    )

    _init_encoder_is_a_path = field_validator("init_encoder", mode="before")(user_path)

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.init_from is not None and self.init_encoder is not None:
            raise ValueError(
                "model.init_from and model.init_encoder both start the model from elsewhere: "
                "keep one of them"
            )
        if self.init_optimizer and self.init_from is None:
            raise ValueError(
                "model.init_optimizer continues the optimizer of the run model.init_from "
                "names: set model.init_from to that run, or remove model.init_optimizer"
            )
        if self.arch == "rnn":
            if self.positional != "sinusoidal":
                raise ValueError(
                    f"model.positional: {self.positional} applies to the "
                    f"transformer and decoder_only archs; an rnn reads positions "
                    f"by its recurrence (remove the key)"
                )
            if self.act_dropout is not None:
                raise ValueError(
                    "model.act_dropout applies to the Transformer's feed-forward "
                    "layers; an rnn has none (remove the key)"
                )
            if self.d_model % 2:
                raise ValueError(
                    f"model.d_model ({self.d_model}) must be even for the bidirectional rnn encoder"
                )
            return self
        if self.attention != "bahdanau":
            raise ValueError(
                f"model.attention: {self.attention} applies to model.arch: rnn "
                f"only (the {self.arch} uses multi-head attention)"
            )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        return self
