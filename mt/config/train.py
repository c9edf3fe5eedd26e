"""The train section: budgets, batches, the optimizer and its schedule, regularisation,
logging and checkpoints, the device and the step's speed paths."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from mt.config.decode import MAX_BEAM
from mt.config.section import STEPS, Section, no_number
from mt.errors import shorten


class ScheduledSamplingConfig(Section):
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


class TrainConfig(Section):
    max_steps: int = Field(20000, ge=1, le=STEPS, description="optimizer updates")
    max_minutes: float = Field(
        0.0,
        ge=0.0,
        le=1e7,
        description="also stop (validate, average, tune) "
        "after this many minutes of training; "
        "0 = no time limit",
    )
    expected_steps: int = Field(
        0,
        ge=0,
        le=STEPS,
        description="the updates this config's reported results came from: when the "
        "time budget will stop the run well short of them (a slow or busy machine), "
        "mt train says so at its forecast, with what to do; 0 = not said",
    )
    max_tokens: int = Field(
        4096,
        ge=16,
        le=1 << 24,
        description="source+target tokens per batch, padding incl. (at most 16M: larger "
        "updates come from accum_steps)",
    )
    accum_steps: int = Field(1, ge=1, le=1 << 16, description="batches accumulated into one update")
    shape_buckets: int = Field(
        0,
        ge=0,
        le=1 << 16,
        description="pad both widths of a batch to multiples of this, with the same row count "
        "for every batch of a width pair, so an epoch has a few batch shapes (for a compiled "
        "or CUDA-graphed step; mt/data/batching.py bucket_batches); 0 = the length-sorted "
        "batches of least padding",
    )
    pack_width: int | Literal["auto"] = Field(  # (0 to 1 << 20: _width_or_auto)
        "auto",
        description="pack several sentence pairs into each row of fixed blocks of "
        "max_tokens // (2 * pack_width) rows of this many source and target positions (one "
        "batch shape for the whole run, little padding; each pair attends to itself alone); "
        "0 = one pair per row; auto: packed where the step is compiled on a GPU (train.compile) "
        "and the objective packs (a Transformer's plain label-smoothed cross-entropy), "
        "data.max_len rounded up to a multiple of 64 wide; one pair per row elsewhere",
    )
    prefetch_batches: int = Field(
        2,
        ge=0,
        le=64,
        description="training batches collated ahead by a background thread while the "
        "model trains (which batch comes when depends on the position in the walk alone, "
        "so resuming stays exact); 0 = each one collated when it is needed",
    )
    lr_factor: float = Field(
        1.0,
        gt=0.0,
        le=1e3,
        description="Noam schedule: lr = lr_factor * d_model^-0.5 * "
        "min(step^-0.5, step * warmup^-1.5)",
    )
    warmup: int = Field(
        4000, ge=1, le=STEPS, description="updates of linear warmup before 1/sqrt(step)"
    )
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
    adam_eps: float = Field(1e-9, gt=0.0, le=1.0, description="Adam's epsilon")
    weight_decay: float = Field(0.0, ge=0.0, le=10.0, description="decoupled weight decay (AdamW)")
    label_smoothing: float = Field(
        0.1, ge=0.0, lt=1.0, description="probability mass spread over the other tokens"
    )
    scheduled_sampling: ScheduledSamplingConfig | None = Field(
        None, description="scheduled sampling's settings (below); unset: teacher forcing"
    )
    rdrop_alpha: float = Field(
        0.0,
        ge=0.0,
        le=1e3,
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
    clip_norm: float = Field(1.0, ge=0.0, le=1e6, description="0 disables clipping")
    log_every: int = Field(
        100, ge=1, le=STEPS, description="updates between lines of train_log.jsonl"
    )
    valid_every: int = Field(1000, ge=1, le=STEPS, description="updates between validations")
    save_every: int = Field(1000, ge=1, le=STEPS, description="updates between step_N.pt snapshots")
    keep_checkpoints: int = Field(5, ge=0, le=1 << 20, description="step_N.pt model snapshots kept")
    average_last: int = Field(
        0,
        ge=0,
        le=1 << 20,
        description="at the end, average this many last snapshots; kept as best.pt if better",
    )
    patience: int = Field(
        0,
        ge=0,
        le=1 << 20,
        description="stop after this many validations without a better BLEU; 0 = never stop early",
    )
    valid_beam: int = Field(
        0, ge=0, le=MAX_BEAM, description="beam for validation BLEU; 0 = decode.beam"
    )
    max_nonfinite: int = Field(
        5,
        ge=1,
        le=STEPS,
        description="stop after this many NaN/inf losses in a row (each such update is skipped)",
    )
    seed: int = Field(
        1234, ge=0, le=2**63 - 1, description="seeds weights, batches, dropout and sampling"
    )
    members: int = Field(
        1,
        ge=1,
        le=64,
        description="train this many models side by side as one run (an ensemble): member K "
        "in RUN_DIR/memberK with the seed seed + K - 1, on a CPU each on its share of the "
        "cores; translate, eval, tune, serve and distill take RUN_DIR as their ensemble",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: a GPU when there is one"
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="auto: bf16 autocast on GPUs that have it, fp16 with loss scaling on "
        "older ones, fp32 on a CPU",
    )
    num_threads: int = Field(0, ge=0, le=1 << 20, description="CPU threads; 0 = torch default")
    dist_timeout_minutes: float = Field(
        30.0,
        gt=0.0,
        le=1e6,
        description="multi-rank runs: a collective that takes longer ends the run",
    )
    data_parallel: Literal["flat", "ddp"] = Field(
        "flat",
        description="multi-rank runs: how the ranks exchange gradients. flat: one all-reduce "
        "of flat gradient buffers after the backward pass, a batch that runs out of memory "
        "on one rank skipped by all; ddp: torch's DistributedDataParallel, its all-reduces "
        "overlapping the backward pass (faster across machines), a batch that runs out of "
        "memory ending the run (docs/distributed.md)",
    )
    ddp_bucket_mb: float = Field(
        25.0, gt=0.0, le=1e5, description="data_parallel ddp: the size of a gradient bucket, in MB"
    )
    dist_wait_minutes: float = Field(
        240.0,
        gt=0.0,
        le=1e6,
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
        description="swap in mt/fast (fused CPU training nodes, hash dropout, the "
        "feed-forward on real rows alone, chunked loss); auto: on a CPU only (on a GPU they "
        "make training slower: docs/gpu.md); "
        "false: the reference model and loss as written; true: on any device",
    )
    compile: Literal["auto", True, False] = Field(
        "auto",
        description="torch.compile the training forward/backward of the reference model and "
        "its loss (dynamic shapes; static ones, one compilation per shape, with shape_buckets "
        "or pack_width, each shape's step then replayed as a CUDA graph on a GPU); "
        "mt/fast then steps aside (fast_paths auto). auto: on a GPU, for the objectives it "
        "compiles (label-smoothed cross-entropy of a Transformer; not R-Drop, scheduled "
        "sampling, the NAT or the RNN), with fast_paths auto or false",
    )
    best_by: str = Field(
        "mean",
        max_length=80,
        description="data.pairs: the valid BLEU that best.pt, early stopping and the end's "
        "tuning follow: mean (over the pairs) or one pair's, e.g. en-fr",
    )
    compiled_loss_chunk: int = Field(
        0,
        ge=0,
        le=1 << 20,
        description="a compiled step's output projection and label-smoothed loss computed "
        "this many target positions at a time, each chunk's gradient in the forward pass, in "
        "autocast's dtype with an fp32 softmax per chunk (mt/fast/loss.py): the (N, V) fp32 "
        "log-probabilities never exist. 0: the logits whole, as the reference writes them. "
        "Applies where train.compile does, to a Transformer without model.output_bias and "
        "without R-Drop or scheduled sampling",
    )

    update: Literal["auto", "plain", "device", "graph"] = Field(
        "auto",
        description="how one optimizer update is made (mt/train/update/step.py). plain: as a "
        "textbook writes it (loss.backward(), clip_grad_norm_, optimizer.step(), a "
        "non-finite loss read and skipped on the host), one process or ranks under "
        "data_parallel ddp, fp16 too; device: gradients in flat buffers exchanged in one "
        "all-reduce, divided, clipped and skipped on the device with no read by the host; "
        "graph: the device update of one process on packed blocks recorded once as a CUDA "
        "graph and replayed (mt/train/update/graphed.py; on a CPU run as recorded); auto: "
        "device on a GPU or under torchrun, plain in one CPU process, for fp16 and for "
        "data_parallel ddp. All give the same weights; a run resumes across them",
    )

    @field_validator("pack_width", mode="before")
    @classmethod
    def _width_or_auto(cls, v: Any) -> Any:
        if v == "auto":
            return v
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 20:
            raise ValueError(
                f"give a whole number of positions, 0 to {1 << 20} (0: one pair per row), "
                f"or auto (got {shorten(repr(v))})"
            )
        return v

    @field_validator("fast_paths", "compile", mode="before")
    @classmethod
    def _switch_is_not_a_number(cls, v: Any) -> Any:
        return no_number(v)

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
    def _ddp_runs_eager(self) -> TrainConfig:
        if self.compile is True and self.data_parallel == "ddp":
            raise ValueError(
                "train.compile: true does not apply with train.data_parallel: ddp (the "
                "compiled step would be split at every gradient bucket); use data_parallel: "
                "flat, which exchanges outside the compiled step, or compile: false"
            )
        return self

    @model_validator(mode="after")
    def _packing_fits(self) -> TrainConfig:
        if not self.pack_width or self.pack_width == "auto":  # (auto: decided per device)
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
