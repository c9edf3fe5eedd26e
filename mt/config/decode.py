"""The decode section: how a run translates, and the grid tuned on the valid split."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mt.config.section import Section

MAX_BEAM = 100
MAX_LENGTH_PENALTY = 1e3  # (finite up to it in log space: search.normalised_score)


class DecodeConfig(Section):
    beam: int = Field(5, ge=1, le=MAX_BEAM, description="beam size; 1 = greedy")
    length_penalty: float = Field(
        1.0,
        ge=0.0,
        le=MAX_LENGTH_PENALTY,
        description="scores are log-probability / length ** length_penalty",
    )
    max_len_a: float = Field(1.5, ge=0.0, le=1e3, description="max output length = a * src_len + b")
    max_len_b: int = Field(10, ge=1, le=1 << 20, description="see max_len_a")
    nat_iterations: int = Field(
        10, ge=1, le=1000, description="model.arch nat: Mask-Predict's refinement passes"
    )
    nat_length_beam: int = Field(
        3, ge=1, le=MAX_BEAM, description="model.arch nat: candidate lengths decoded in parallel"
    )
    max_tokens: int = Field(
        4000, ge=16, le=1 << 24, description="source tokens per translation batch"
    )
    compile_step: Literal["auto", "always", "never"] = Field(
        "auto",
        description="the search on the device keeps its self-attention cache in preallocated "
        "buffers and runs its decoder step through torch.compile (compiled once for every "
        "batch shape), with CUDA graphs on a GPU (one per batch shape, replayed at every "
        "step): auto = on a GPU, for a job whose decoder steps repay the compile (a few "
        "thousand: a run's validations, a large file, a server); always also on a CPU (needs "
        "a C compiler); the same hypotheses either way",
    )
    device_search: Literal["auto", "always", "never"] = Field(
        "auto",
        description="the search's pace: the host looks at it every 8 steps, finished sentences "
        "leaving the batch in power-of-two steps: auto = on a GPU (on a CPU looking at every "
        "step, dropping each finished sentence at once, is faster); the same hypotheses either "
        "way",
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
        if not self.tune_length_penalties or any(
            not 0 <= p <= 1e3 for p in self.tune_length_penalties
        ):
            raise ValueError("decode.tune_length_penalties: give at least one penalty, 0 to 1000")
        for key in ("tune_nat_length_beams", "tune_nat_iterations"):
            high = MAX_BEAM if key == "tune_nat_length_beams" else 1000
            if any(not 1 <= x <= high for x in getattr(self, key)):
                raise ValueError(
                    f"decode.{key}: give values 1 to {high} (got {getattr(self, key)})"
                )
        return self
