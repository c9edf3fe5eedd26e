"""How the Trainer validates: the valid loss, and the BLEU of decoding the valid split with
the same Translator and metric that `mt translate` and `mt eval` use (so the scores agree);
best.pt when the BLEU is the best so far."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch

from mt.config import TrainConfig
from mt.data.batching import Batch, collate, epoch_batches
from mt.data.tokenizer import Tokenizer
from mt.decode.translator import Translator
from mt.evaluate.metrics import score
from mt.model import Seq2Seq
from mt.objectives.objective import Objective
from mt.runtime.memory import release_free_memory
from mt.train.ema import WeightAverage
from mt.train.finish import with_weights
from mt.train.state import TrainState, Validation


class Validating:
    """The Trainer's validation (a part of the Trainer: it reads the Trainer's model, state,
    valid split and config)."""

    # what it reads of the Trainer, which sets them
    model: Seq2Seq
    ema: WeightAverage | None
    validation: Validation | None
    cfg: TrainConfig
    device: torch.device
    amp_dtype: torch.dtype | None
    state: TrainState
    tokenizer: Tokenizer
    objective: Objective
    if TYPE_CHECKING:  # the Trainer's own and Saving's

        def _loss(self, batch: Batch, model: torch.nn.Module | None = None, loss=None) -> tuple: ...
        def save(self, name: str, rank_rng: list[dict] | None = None) -> None: ...
        def write_log(self, record: dict) -> None: ...

    def validate(self) -> dict:
        """Valid loss and BLEU (of the weight average with train.ema_decay); best.pt when
        the BLEU is the best so far."""
        if self.ema is None:
            return self._validate()
        return with_weights(self, self.ema.weights(self.model), self._validate)

    @torch.no_grad()
    def _validate(self) -> dict:
        """The valid loss, and with a translating objective the BLEU of decoding the split."""
        release_free_memory()  # what training freed, before decoding allocates its own
        self.model.eval()
        v = self.validation
        assert v is not None  # a run that validates: one that translates
        loss_sum = nll_sum = 0.0
        n = 0
        valid_loss = self.objective.valid_loss
        for i, indices in enumerate(epoch_batches(v.data, self.cfg.max_tokens, 0, 0)):
            batch = collate(v.data, indices).to(self.device)
            if valid_loss is None:
                (loss, nll), count = self._loss(batch), batch.n_tokens
            else:  # scores some tokens, the same ones every time
                loss, nll, count = self._loss(batch, loss=functools.partial(valid_loss, index=i))
            loss_sum, nll_sum, n = loss_sum + float(loss), nll_sum + float(nll), n + count
        s = score(self.translator().translate(v.src, beam=v.beam), v.refs)
        record: dict = {
            "step": self.state.step,
            "valid_loss": round(loss_sum / n, 4),
            "valid_nll": round(nll_sum / n, 4),
            "valid_ppl": round(math.exp(min(nll_sum / n, 50)), 2),
            "valid_bleu": round(s.bleu, 2),
            "valid_chrf": round(s.chrf, 2),
        }
        if self.objective.valid_loss_over:
            record["valid_loss_over"] = self.objective.valid_loss_over
        if s.bleu > self.state.best_bleu:
            self.state.best_bleu, self.state.bad_validations = s.bleu, 0
            self.save("best.pt")
            record["best"] = True
        else:
            self.state.bad_validations += 1
        self.write_log(record)
        release_free_memory()
        return record

    def translator(self) -> Translator:
        """The model as it decodes the valid split (also for the end of the run's averaging
        and tuning)."""
        assert self.validation is not None
        return Translator(
            self.model, self.tokenizer, self.validation.decode, self.device, self.amp_dtype
        )
