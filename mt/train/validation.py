"""How a run is validated: the valid loss, and the BLEU of decoding the valid split with the
same Translator and metric that `mt translate` and `mt eval` use (so the scores agree);
best.pt when the BLEU is the best so far."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from mt.data.batching import collate, epoch_batches
from mt.data.tokenizer import Tokenizer
from mt.decode.translator import Translator
from mt.evaluate.metrics import pair_scores
from mt.model import Seq2Seq
from mt.objectives import Objective
from mt.runtime.device import autocast
from mt.runtime.memory import release_free_memory
from mt.train.ema import WeightAverage
from mt.train.saving import Checkpoints
from mt.train.state import TrainState, Validation


class Validator:
    """Scores the model on the valid split and keeps the best (rank 0's). objective: the
    run's, whose loss (or valid_loss) is the valid loss; max_tokens: the size of the loss's
    batches; ema: the weight average, which is what is scored when the run keeps one
    (train.ema_decay); write_log: a record for train_log.jsonl; decodes: about how many times
    the run decodes the valid split (its validations and the end's), which decides with the
    split's size whether the decoder step is worth compiling (decode.compile_step auto)."""

    def __init__(
        self,
        *,
        model: Seq2Seq,
        validation: Validation,
        tokenizer: Tokenizer,
        objective: Objective,
        max_tokens: int,
        device: torch.device,
        amp_dtype: torch.dtype | None,
        ema: WeightAverage | None,
        checkpoints: Checkpoints,
        write_log: Callable[[dict], None],
        decodes: int = 1,
    ):
        self.model, self.validation, self.tokenizer = model, validation, tokenizer
        self.objective, self.max_tokens = objective, max_tokens
        self.device, self.amp_dtype, self.ema = device, amp_dtype, ema
        self.checkpoints, self.write_log = checkpoints, write_log
        self.decodes = decodes
        self._translator: Translator | None = None  # made at the first validation, kept

    def validate(self, st: TrainState) -> dict:
        """The log record of a validation at st.step; best.pt, and st's best_bleu and
        bad_validations, when its BLEU is the best so far."""
        if self.ema is None:
            record, bleu = self._validate(st.step)
        else:
            weights = self.ema.weights(self.model)
            record, bleu = with_weights(self.model, weights, lambda: self._validate(st.step))
        if bleu > st.best_bleu:
            st.best_bleu, st.bad_validations = bleu, 0
            self.checkpoints.save("best.pt", st)
            record["best"] = True
        else:
            st.bad_validations += 1
        self.write_log(record)
        return record

    @torch.no_grad()
    def _validate(self, step: int) -> tuple[dict, float]:
        began = time.perf_counter()
        release_free_memory()  # what training freed, before decoding allocates its own
        self.model.eval()
        v = self.validation
        loss_sum = nll_sum = 0.0
        n = 0
        valid_loss = self.objective.valid_loss
        for i, indices in enumerate(epoch_batches(v.data, self.max_tokens, 0, 0)):
            batch = collate(v.data, indices).to(self.device)
            with autocast(self.device, self.amp_dtype):
                if valid_loss is None:
                    (loss, nll), count = self.objective.loss(self.model, batch), batch.n_tokens
                else:  # scores some tokens, the same ones every time
                    loss, nll, count = valid_loss(self.model, batch, index=i)
            loss_sum, nll_sum, n = loss_sum + float(loss), nll_sum + float(nll), n + count
        bleu, chrf, by_pair = self.scores()
        record: dict = {
            "step": step,
            "valid_loss": round(loss_sum / n, 4),
            "valid_nll": round(nll_sum / n, 4),
            "valid_ppl": round(math.exp(min(nll_sum / n, 50)), 2),
            "valid_bleu": round(bleu, 2),
            "valid_chrf": round(chrf, 2),
            "valid_seconds": round(time.perf_counter() - began, 2),  # (loss and decoding)
        }
        if by_pair:
            record["valid_bleu_pairs"] = {k: round(b, 2) for k, b in by_pair.items()}
        if self.objective.valid_loss_over:
            record["valid_loss_over"] = self.objective.valid_loss_over
        release_free_memory()
        return record, bleu

    def scores(self) -> tuple[float, float, dict[str, float]]:
        """(BLEU, chrF, each pair's BLEU) of decoding the valid split: with several pairs
        (data.pairs) each pair is scored on its own lines, and the BLEU is train.best_by's
        (their mean, or one pair's) and the chrF their mean; else {} for the pairs."""
        v = self.validation
        return self.criterion(self.translator().translate(v.src, beam=v.beam))

    def criterion(self, hyps: list[str]) -> tuple[float, float, dict[str, float]]:
        """scores() of these translations of the valid sources."""
        v = self.validation
        return pair_scores(hyps, v.refs, v.pairs, v.best_by)

    def translator(self) -> Translator:
        """The model as it decodes the valid split (also for the end of the run's averaging
        and tuning), one Translator for the whole run: a compiled decoder step and its CUDA
        graphs are made once."""
        if self._translator is None:
            v = self.validation
            self._translator = Translator(
                self.model, self.tokenizer, v.decode, self.device, self.amp_dtype, text=v.text
            )
            self._translator.repeats = self.decodes
        return self._translator

    def bleu_with(self, weights: dict) -> tuple[float, float]:
        """(BLEU, chrF) of decoding the valid split with `weights` in the model."""
        return with_weights(self.model, weights, lambda: self.scores()[:2])


def describe_validation(rec: dict) -> str:
    """A validation's log record as the line the user sees."""
    over = f" (over {rec['valid_loss_over']})" if "valid_loss_over" in rec else ""
    pairs = rec.get("valid_bleu_pairs")
    each = f" ({', '.join(f'{k} {b}' for k, b in pairs.items())})" if pairs else ""
    return (
        f"step {rec['step']}: valid loss{over} {rec['valid_loss']} ppl {rec['valid_ppl']} "
        f"BLEU {rec['valid_bleu']}{each} chrF {rec['valid_chrf']}"
        + (" (best)" if rec.get("best") else "")
    )


def with_weights(model: torch.nn.Module, weights: dict, work):
    """work() in eval mode with the model holding `weights`, its own weights back afterwards."""
    current = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(weights)
    try:
        model.eval()
        return work()
    finally:
        model.load_state_dict(current)
