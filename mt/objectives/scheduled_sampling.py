"""Scheduled sampling (Bengio et al. 2015): in training, each previous target token the
decoder reads is the gold one with probability p (decaying over updates, mt.train.update.schedule.
gold_probability) and the model's own prediction otherwise, so that training meets the
mistakes that decoding will make. With p = 1 it is exactly teacher forcing.

- two_pass (Transformers; Mihaylova & Liu 2019, Duckworth et al. 2019): a first decoder pass
  without gradients predicts every position in parallel, the predictions are mixed into the
  gold input, and a second pass learns from the mixed input. Training stays parallel.
- step_by_step (the RNN, as Bengio et al.): the decoder runs one position at a time with its
  cache, and each step's input is chosen from the gold token and the previous step's
  prediction.
"""

from __future__ import annotations

import math

import torch

from mt.data.batching import Batch
from mt.decode.cache import DecodeCache
from mt.objectives.loss import logits_loss
from mt.tokens import PAD


def mixed_input(
    tgt_in: torch.Tensor,
    predicted: torch.Tensor,
    gold_p: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """tgt_in (B, T) starts with BOS; predicted[:, t] is the model's guess of tgt_in[:, t+1].
    Each position after BOS keeps its gold token with probability gold_p and takes the
    prediction otherwise; padding stays padding."""
    use_gold = torch.rand(tgt_in.shape, generator=generator, device=tgt_in.device) < gold_p
    mixed = tgt_in.clone()
    mixed[:, 1:] = torch.where(use_gold[:, 1:], tgt_in[:, 1:], predicted[:, :-1])
    return mixed.masked_fill(tgt_in == PAD, PAD)


def gold_probability(
    step: int, schedule: str, k: float, c: float = 0.0, min_gold: float = 0.0
) -> float:
    """Scheduled sampling's probability of feeding the gold previous token at update `step`
    (Bengio et al. 2015, sec. 2.4): linear k - c * step, exponential k ** step (k < 1), inverse
    sigmoid k / (k + exp(step / k)) (k >= 1); never below min_gold."""
    if schedule == "linear":
        p = k - c * step
    elif schedule == "exponential":
        p = k**step
    elif schedule == "inverse_sigmoid":
        p = k / (k + math.exp(min(step / k, 700.0)))
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    return min(1.0, max(min_gold, p))


class ScheduledSamplingLoss:
    """A loss function (model, batch, eps) -> (loss, nll) for the trainer: `base_loss` on the
    mixed input (two_pass), or the decoder run step by step (step_by_step), at the gold
    probability of the update count last given to set_step (the trainer's counter)."""

    def __init__(self, cfg, base_loss, two_pass: bool, seed: int = 0):
        self.cfg, self.base_loss, self.two_pass = cfg, base_loss, two_pass
        self.seed, self.step = seed, 0
        self.generator = torch.Generator()
        self.set_step(0)

    def set_step(self, step: int) -> None:
        """The update about to be made: its gold probability, and its draws, seeded by
        (seed, step) alone, so that a resumed run draws what the uninterrupted one drew (on a
        GPU the draws are CUDA's generator's, which checkpoints keep)."""
        self.step = step
        self.generator.manual_seed((self.seed * 1_000_003 + step) % (2**63))

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's token for each position of logits (..., V): its most likely, or drawn
        from its distribution (cfg.pick)."""
        if self.cfg.pick == "argmax":
            return logits.argmax(-1)
        probs = torch.softmax(logits.float(), -1)
        flat = torch.multinomial(
            probs.reshape(-1, probs.shape[-1]), 1, generator=self._draws(probs)
        )
        return flat.view(probs.shape[:-1])

    def gold_p(self) -> float:
        c = self.cfg
        return gold_probability(self.step, c.schedule, c.k, c.c, c.min_gold)

    def __call__(self, model, batch: Batch, eps: float):
        if not model.training:  # validation: the model as it decodes
            return self.base_loss(model, batch, eps)
        p = self.gold_p()
        if self.two_pass:
            return self.base_loss(model, self._mixed_batch(model, batch, p), eps)
        return self._step_by_step(model, batch, eps, p)

    def _draws(self, like: torch.Tensor) -> torch.Generator | None:
        return self.generator if like.device.type == "cpu" else None

    def _mixed_batch(self, model, batch: Batch, p: float) -> Batch:
        if p >= 1.0:
            return batch
        with torch.no_grad():  # the first pass only predicts
            predicted = self._pick(model(batch.src, batch.tgt_in, batch.src_pad_mask))
        tgt_in = mixed_input(batch.tgt_in, predicted, p, self._draws(batch.tgt_in))
        return Batch(batch.src, tgt_in, batch.tgt_out, batch.n_tokens)

    def _step_by_step(self, model, batch: Batch, eps: float, p: float):
        memory = model.encode(batch.src, batch.src_pad_mask)
        cache = DecodeCache(model.cache_layers)
        token, states = batch.tgt_in[:, :1], []  # BOS
        for t in range(batch.tgt_in.shape[1]):
            h = model.decode(token, memory, batch.src_pad_mask, cache=cache, start=t)
            states.append(h)  # (B, 1, D)
            if t + 1 < batch.tgt_in.shape[1]:
                with torch.no_grad():
                    guess = self._pick(model.project(h[:, -1]))
                gold = batch.tgt_in[:, t + 1]
                use_gold = (
                    torch.rand(gold.shape, generator=self._draws(gold), device=gold.device) < p
                )
                token = torch.where(use_gold | (gold == PAD), gold, guess)[:, None]
        return logits_loss(model.project(torch.cat(states, 1)), batch.tgt_out, eps)
