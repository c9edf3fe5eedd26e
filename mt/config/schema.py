"""The run configuration's schema: one frozen pydantic model per section, each rejecting
unknown keys and wrong types, and the checks that span sections."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class DataConfig(_Section):
    dir: str = Field("data/multi30k", description="folder with {train,valid,test}.{lang}")
    src_lang: str = Field("de", description="source language: the suffix of the source files")
    tgt_lang: str = Field("en", description="target language: the suffix of the target files")
    dataset: str | None = Field(
        None,
        description="corpus to download into dir when it holds none yet (multi30k, wmt14, "
        "synthetic, or a Hugging Face hub id); unset: the corpus must already be there",
    )
    dataset_config: str | None = Field(
        None, description="the hub dataset's configuration, e.g. de-en for wmt14"
    )
    max_len: int = Field(128, ge=1, description="pairs longer than this (subwords) are dropped")
    token_cache: Literal["auto", True, False] = Field(
        "auto",
        description="keep the training split's token ids in a memory-mapped cache "
        "(MT_CACHE_DIR, else ~/.cache/mt) that later runs and every rank of a machine share; "
        "auto: for training files of 100 MB or more",
    )

    @field_validator("token_cache", mode="before")
    @classmethod
    def _token_cache_is_not_a_number(cls, v: Any) -> Any:
        return _no_number(v)


def _no_number(v: Any) -> Any:
    """A Literal of True/False also takes 1 and 0 (1 == True), which strict mode refuses for
    every other boolean key."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        raise ValueError(f"expected 'auto', true or false, not the number {v!r}")
    return v


class TokenizerConfig(_Section):
    vocab_size: int = Field(
        8000, ge=16, description="BPE pieces (each side's, or both's when joint)"
    )
    joint: bool = Field(
        True,
        description="one BPE model for source and target (needed by model.tie_embeddings: all "
        "and train.bidirectional_share)",
    )
    character_coverage: float = Field(
        1.0, gt=0.0, le=1.0, description="share of characters the BPE model covers (sentencepiece)"
    )
    max_sentences: int = Field(2_000_000, ge=1, description="sentences sampled to train BPE")


class ModelConfig(_Section):
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
        16, ge=1, description="relative positions: distances are clipped at this"
    )
    d_model: int = Field(256, ge=8, description="width of embeddings and hidden states")
    n_heads: int = Field(4, ge=1, description="attention heads (must divide d_model)")
    enc_layers: int = Field(3, ge=1, description="encoder layers")
    dec_layers: int = Field(3, ge=1, description="decoder layers")
    d_ff: int = Field(1024, ge=1, description="hidden width of each feed-forward layer")
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
    max_positions: int = Field(1024, ge=8, description="the longest sequence the model takes")
    init_encoder: str | None = Field(
        None,
        description="start the encoder from a masked-LM pretraining (RUN_DIR/pretrained.pt "
        "of mt pretrain)",
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
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


class ScheduledSamplingConfig(_Section):
    """Feed the model its own predictions instead of the gold previous tokens, with a gold
    probability that decays over updates (Bengio et al. 2015); see
    mt/objectives/scheduled_sampling.py."""

    schedule: Literal["linear", "exponential", "inverse_sigmoid"] = Field(
        "inverse_sigmoid",
        description="the gold probability's decay: k - c*step, k**step or k/(k + exp(step/k))",
    )
    k: float = Field(
        2000.0,
        gt=0.0,
        description="linear: the start probability; "
        "exponential: the decay base (< 1); inverse_sigmoid: the step scale (>= 1)",
    )
    c: float = Field(0.0, ge=0.0, description="linear: the decrease per update")
    min_gold: float = Field(0.0, ge=0.0, le=1.0, description="the gold probability's floor")
    # auto: two parallel decoder passes for Transformers (Duckworth et al. 2019), the decoder
    # step by step for the RNN (Bengio et al.)
    mode: Literal["auto", "two_pass", "step_by_step"] = Field(
        "auto",
        description="auto: two parallel decoder passes for Transformers, the decoder step by "
        "step for the RNN",
    )
    pick: Literal["argmax", "sample"] = Field(
        "argmax",
        description="the model's token fed in place of the gold one: its most likely "
        "(argmax), or one drawn from its distribution (sample, as Bengio et al.)",
    )

    @model_validator(mode="after")
    def _k_fits_schedule(self) -> ScheduledSamplingConfig:
        if self.schedule == "exponential" and self.k >= 1:
            raise ValueError(
                f"train.scheduled_sampling.k ({self.k}) must be < 1 for the "
                f"exponential schedule (the gold probability is k ** step)"
            )
        if self.schedule == "linear" and self.c == 0 and self.min_gold < 1:
            raise ValueError(
                f"train.scheduled_sampling.c is 0: the linear schedule k - c * step would stay "
                f"at k = {self.k:g} (teacher forcing from k = 1 up); set the decrease per "
                f"update, e.g. c: 1.0e-4 to reach 0 after 10,000 updates"
            )
        if self.schedule == "inverse_sigmoid" and self.k < 1:
            raise ValueError(
                f"train.scheduled_sampling.k ({self.k}) must be >= 1 for the "
                f"inverse_sigmoid schedule"
            )
        return self


class TrainConfig(_Section):
    max_steps: int = Field(20000, ge=1, description="optimizer updates")
    max_minutes: float = Field(
        0.0,
        ge=0.0,
        description="also stop (validate, average, tune) "
        "after this many minutes of training; "
        "0 = no time limit",
    )
    expected_steps: int = Field(
        0,
        ge=0,
        description="the updates this config's reported results came from: when the "
        "time budget will stop the run well short of them (a slow or busy machine), "
        "mt train says so at its forecast, with what to do; 0 = not said",
    )
    max_tokens: int = Field(
        4096, ge=16, description="source+target tokens per batch, padding incl."
    )
    accum_steps: int = Field(1, ge=1, description="batches accumulated into one update")
    shape_buckets: int = Field(
        0,
        ge=0,
        description="pad both widths of a batch to multiples of this, with the same row count "
        "for every batch of a width pair, so an epoch has a few batch shapes (for a compiled "
        "or CUDA-graphed step; mt/data/batching.py bucket_batches); 0 = the length-sorted "
        "batches of least padding",
    )
    pack_width: int = Field(
        0,
        ge=0,
        description="pack several sentence pairs into each row of fixed blocks of "
        "max_tokens // (2 * pack_width) rows of this many source and target positions (one "
        "batch shape for the whole run, little padding; each pair attends to itself alone); "
        "0 = one pair per row",
    )
    lr_factor: float = Field(
        1.0,
        gt=0.0,
        description="Noam schedule: lr = lr_factor * d_model^-0.5 * "
        "min(step^-0.5, step * warmup^-1.5)",
    )
    warmup: int = Field(4000, ge=1, description="updates of linear warmup before 1/sqrt(step)")
    cooldown: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="in this last fraction of the "
        "budget (max_steps, or max_minutes when that ends first) the "
        "learning rate falls linearly to 0; 0 = no cool-down",
    )
    ema_decay: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="keep an exponential moving "
        "average of the weights with this decay (e.g. 0.999) for "
        "validation, snapshots and best.pt; 0 = off",
    )
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="Adam's first-moment decay")
    adam_beta2: float = Field(0.98, ge=0.0, lt=1.0, description="Adam's second-moment decay")
    adam_eps: float = Field(1e-9, gt=0.0, description="Adam's epsilon")
    weight_decay: float = Field(0.0, ge=0.0, description="decoupled weight decay (AdamW)")
    label_smoothing: float = Field(
        0.1, ge=0.0, lt=1.0, description="probability mass spread over the other tokens"
    )
    scheduled_sampling: ScheduledSamplingConfig | None = Field(
        None, description="scheduled sampling's settings (below); unset: teacher forcing"
    )
    rdrop_alpha: float = Field(
        0.0,
        ge=0.0,
        description="R-Drop (Liang et al. 2021): two "
        "dropout passes per batch and this weight on their symmetric "
        "KL; 0 = off",
    )
    # BPE-dropout (Provilkov et al., ACL 2020): every epoch the training split is segmented
    # anew, each merge skipped with this probability, so the model sees many segmentations of
    # a word; valid, test and translation keep the deterministic segmentation. A train
    # setting, not a tokenizer one: the BPE model it samples from is the same.
    bpe_dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="BPE-dropout probability "
        "for the training split, resampled every epoch (Provilkov "
        "et al. 2020 use 0.1); 0 = off",
    )
    # Bidirectional training, BiT (Ding et al., EMNLP 2021): early updates also learn the
    # reverse direction from the same pairs (source+target -> target+source, no tags: the
    # source's language says which way), then the rest trains the configured direction
    # alone. The paper gives the first third of the updates to both directions. Decided at
    # each epoch's start, so the stage ends at the first epoch that begins past the share.
    bidirectional_share: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="train on both "
        "directions for this share of the budget (max_steps, "
        "or max_minutes when that ends first), then on the "
        "configured one (BiT, Ding et al. 2021 use 1/3); needs "
        "tokenizer.joint; 0 = off",
    )
    # Word dropout (Sennrich et al., WMT 2016; Xie et al., ICLR 2017's "blank noising"): each
    # source piece of a training batch is replaced by <unk> with this probability, so the
    # model cannot lean on any one source word; valid, test and translation see clean text.
    word_dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="replace each source "
        "token (BPE piece) of a training batch by <unk> with this "
        "probability, drawn anew for every batch; 0 = off",
    )
    clip_norm: float = Field(1.0, ge=0.0, description="0 disables clipping")
    log_every: int = Field(100, ge=1, description="updates between lines of train_log.jsonl")
    valid_every: int = Field(1000, ge=1, description="updates between validations")
    save_every: int = Field(1000, ge=1, description="updates between step_N.pt snapshots")
    keep_checkpoints: int = Field(5, ge=0, description="step_N.pt model snapshots kept")
    average_last: int = Field(
        0,
        ge=0,
        description="at the end, average this many last snapshots; kept as best.pt if better",
    )
    patience: int = Field(
        0,
        ge=0,
        description="stop after this many validations without a better BLEU; 0 = never stop early",
    )
    valid_beam: int = Field(0, ge=0, description="beam for validation BLEU; 0 = decode.beam")
    max_nonfinite: int = Field(
        5,
        ge=1,
        description="stop after this many NaN/inf losses in a row (each such update is skipped)",
    )
    seed: int = Field(1234, description="seeds weights, batches, dropout and sampling")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: a GPU when there is one"
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="auto: bf16 autocast on GPUs that have it, fp16 with loss scaling on "
        "older ones, fp32 on a CPU",
    )
    num_threads: int = Field(0, ge=0, description="CPU threads; 0 = torch default")
    dist_timeout_minutes: float = Field(
        30.0, gt=0.0, description="multi-rank runs: a collective that takes longer ends the run"
    )
    dist_wait_minutes: float = Field(
        240.0,
        gt=0.0,
        description="multi-rank runs: how long "
        "the other ranks wait while rank 0 alone downloads the "
        "corpus, trains BPE or validates",
    )
    tensorboard: bool = Field(
        False,
        description="also write train_log.jsonl's scalars as "
        "TensorBoard events in RUN_DIR/tensorboard (pip install "
        "'mt[tensorboard]')",
    )
    fast_paths: Literal["auto", True, False] = Field(
        "auto",
        description="swap in mt/fast (fused CPU training nodes, hash dropout, row "
        "packing, chunked loss); auto: on a CPU only (on an H200 they made training slower); "
        "false: the reference model and loss as written; true: on any device",
    )
    compile: Literal["auto", True, False] = Field(
        False,
        description="torch.compile the training forward/backward of the reference model and "
        "its loss (dynamic shapes; static ones, one compilation per shape, with shape_buckets "
        "or pack_width, each shape's step then replayed as a CUDA graph on a GPU); "
        "mt/fast then steps aside (fast_paths auto). auto: on a GPU, for the objectives it "
        "compiles (label-smoothed cross-entropy of a Transformer; not R-Drop, scheduled "
        "sampling, the NAT or the RNN), with fast_paths auto or false",
    )

    @field_validator("fast_paths", "compile", mode="before")
    @classmethod
    def _switch_is_not_a_number(cls, v: Any) -> Any:
        return _no_number(v)

    @model_validator(mode="after")
    def _one_way_to_a_fast_step(self) -> TrainConfig:
        if self.compile is True and self.fast_paths is True:
            raise ValueError(
                "train.compile and train.fast_paths: true are two ways to a fast step: "
                "torch.compile fuses the reference model itself, and mt/fast's hand-written "
                "nodes break its graph; set fast_paths: auto (or false), or compile: false"
            )
        return self

    @model_validator(mode="after")
    def _packing_fits(self) -> TrainConfig:
        if not self.pack_width:
            return self
        if self.shape_buckets:
            raise ValueError(
                "train.pack_width and train.shape_buckets are two ways to few batch shapes: "
                "set one of them to 0"
            )
        if self.max_tokens < 2 * self.pack_width:
            raise ValueError(
                f"train.max_tokens ({self.max_tokens}) must hold at least one row of "
                f"train.pack_width ({self.pack_width}) source and target positions: "
                f"raise it to {2 * self.pack_width} or more"
            )
        if self.rdrop_alpha > 0 or self.scheduled_sampling is not None:
            raise ValueError(
                "train.pack_width packs the plain cross-entropy's batches: R-Drop and "
                "scheduled sampling train on one pair per row (set pack_width: 0)"
            )
        if self.fast_paths is True:
            raise ValueError(
                "train.pack_width trains the reference model (mt/fast packs rows its own way): "
                "set fast_paths: auto or false"
            )
        return self

    @model_validator(mode="after")
    def _average_needs_snapshots(self) -> TrainConfig:
        if self.average_last > self.keep_checkpoints:
            raise ValueError(
                f"average_last ({self.average_last}) needs keep_checkpoints >= "
                f"{self.average_last} (it is {self.keep_checkpoints})"
            )
        return self


# Beams beyond this only cost time: BLEU peaks at beams of about 4-10 (Koehn & Knowles 2017).
MAX_BEAM = 100


class DecodeConfig(_Section):
    beam: int = Field(5, ge=1, le=MAX_BEAM, description="beam size; 1 = greedy")
    length_penalty: float = Field(
        1.0, ge=0.0, description="scores are log-probability / length ** length_penalty"
    )
    max_len_a: float = Field(1.5, ge=0.0, description="max output length = a * src_len + b")
    max_len_b: int = Field(10, ge=1, description="see max_len_a")
    nat_iterations: int = Field(
        10, ge=1, description="model.arch nat: Mask-Predict's refinement passes"
    )
    nat_length_beam: int = Field(
        3, ge=1, description="model.arch nat: candidate lengths decoded in parallel"
    )
    max_tokens: int = Field(4000, ge=16, description="source tokens per translation batch")
    compile_step: Literal["auto", "always", "never"] = Field(
        "auto",
        description="the search on the device keeps its self-attention cache in preallocated "
        "buffers and runs its decoder step through torch.compile, with CUDA graphs on a GPU "
        "(one per batch shape, replayed at every step): auto = on a GPU; always also on a CPU "
        "(needs a C compiler); the same hypotheses either way",
    )
    device_search: Literal["auto", "always", "never"] = Field(
        "auto",
        description="search whose bookkeeping stays on the device, the host looking every 8 "
        "steps (mt/decode/device_search.py): auto = on a GPU (on a CPU the search that drops "
        "finished sentences at every step is faster); the same hypotheses either way",
    )
    tune_beams: list[int] = Field(
        default_factory=list,
        description="at the end of mt train, try these beams x tune_length_penalties on the "
        "valid split and store the best pair in best.pt; empty: no tuning",
    )
    tune_length_penalties: list[float] = Field(
        default_factory=lambda: [1.0], description="the length penalties tune_beams tries"
    )
    tune_nat_length_beams: list[int] = Field(
        default_factory=list,
        description="model.arch nat: tune these candidate-length counts x "
        "tune_nat_iterations instead; empty: no tuning",
    )
    tune_nat_iterations: list[int] = Field(
        default_factory=list,
        description="model.arch nat: the iteration counts tried; empty: nat_iterations",
    )

    @model_validator(mode="after")
    def _grid_is_sane(self) -> DecodeConfig:
        if any(b < 1 or b > MAX_BEAM for b in self.tune_beams):
            raise ValueError(
                f"decode.tune_beams: beams must be 1 to {MAX_BEAM} (got {self.tune_beams})"
            )
        if not self.tune_length_penalties or any(p < 0 for p in self.tune_length_penalties):
            raise ValueError("decode.tune_length_penalties: give at least one penalty >= 0")
        for key in ("tune_nat_length_beams", "tune_nat_iterations"):
            if any(x < 1 for x in getattr(self, key)):
                raise ValueError(f"decode.{key}: give values >= 1 (got {getattr(self, key)})")
        return self


class Config(_Section):
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
        if not width:
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
