"""The run configuration: one frozen section per part of a run (mt/config/data.py, model.py,
train.py, decode.py), each rejecting unknown keys and wrong types, and the checks that span
sections."""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from mt.config.data import DataConfig, TokenizerConfig
from mt.config.decode import DecodeConfig
from mt.config.model import ModelConfig
from mt.config.section import Section
from mt.config.train import TrainConfig


class Config(Section):
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    decode: DecodeConfig = DecodeConfig()

    @model_validator(mode="after")
    def _lengths_fit_positions(self) -> Config:
        # a kept pair has at most max_len tokens a side (EOS/BOS included); the decoder-only
        # model reads both sides as one sequence
        need = self.data.max_len * (2 if self.model.arch == "decoder_only" else 1)
        if self.model.arch != "rnn" and need > self.model.max_positions:
            what = "twice data.max_len" if self.model.arch == "decoder_only" else "data.max_len"
            raise ValueError(
                f"data.max_len ({self.data.max_len}) does not fit "
                f"model.max_positions ({self.model.max_positions}): {what} must be "
                f"<= model.max_positions; raise model.max_positions to {need} or "
                f"lower data.max_len"
            )
        return self

    @model_validator(mode="after")
    def _nat_trains_its_own_way(self) -> Config:
        if self.model.arch == "nat" and (
            self.train.scheduled_sampling is not None or self.train.rdrop_alpha > 0
        ):
            raise ValueError(
                "model.arch nat learns from masked targets: train.scheduled_sampling"
                " and train.rdrop_alpha apply to the autoregressive models only"
            )
        return self

    @model_validator(mode="after")
    def _bidirectional_needs_joint(self) -> Config:
        if self.train.bidirectional_share > 0 and not self.tokenizer.joint:
            raise ValueError(
                "train.bidirectional_share trains one model on both directions "
                "and needs one vocabulary for both: set tokenizer.joint: true "
                "(or train.bidirectional_share: 0)"
            )
        return self

    @model_validator(mode="after")
    def _packing_fits_the_model(self) -> Config:
        width = self.train.pack_width
        if not width or width == "auto":  # (auto packs only where it fits: mt.train.parts)
            return self
        if self.model.arch != "transformer":
            raise ValueError(
                f"train.pack_width applies to model.arch transformer (this is {self.model.arch})"
            )
        if width < self.data.max_len or width > self.model.max_positions:
            raise ValueError(
                f"train.pack_width ({width}) must be at least data.max_len ({self.data.max_len}), "
                f"so that every pair fits a row, and at most model.max_positions "
                f"({self.model.max_positions})"
            )
        return self

    @model_validator(mode="after")
    def _pairs_fit_the_run(self) -> Config:
        d, t = self.data, self.train
        if t.best_by != "mean" and t.best_by not in d.pairs:
            raise ValueError(
                f"train.best_by {t.best_by!r}: mean, or one of data.pairs "
                f"({', '.join(d.pairs) or 'none: one pair, whose BLEU it is'})"
            )
        if len(d.pairs) > 1 and t.bidirectional_share > 0:
            raise ValueError(
                "train.bidirectional_share trains one pair both ways; with data.pairs list "
                "both directions as pairs (en-de, de-en)"
            )
        return self

    @model_validator(mode="after")
    def _chunked_loss_fits_the_step(self) -> Config:
        t, m = self.train, self.model
        if not t.compiled_loss_chunk:
            return self
        other = (
            f"model.arch {m.arch}"
            if m.arch != "transformer"
            else "model.output_bias"
            if m.output_bias
            else "train.rdrop_alpha"
            if t.rdrop_alpha > 0
            else "train.scheduled_sampling"
            if t.scheduled_sampling is not None
            else None
        )
        if other:
            raise ValueError(
                f"train.compiled_loss_chunk fuses a Transformer's plain label-smoothed loss "
                f"with its output projection, which has no bias: it does not apply with "
                f"{other}; set train.compiled_loss_chunk: 0"
            )
        return self

    @model_validator(mode="after")
    def _tie_needs_joint(self) -> Config:
        if self.model.tie_embeddings == "all" and not self.tokenizer.joint:
            raise ValueError(
                "model.tie_embeddings: all needs tokenizer.joint: true "
                "(or set model.tie_embeddings: decoder)"
            )
        return self

    @property
    def max_side_len(self) -> int:
        """The longest source or target (EOS/BOS included) the model takes."""
        m = self.model
        return m.max_positions // 2 if m.arch == "decoder_only" else m.max_positions

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="python")
