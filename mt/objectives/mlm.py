"""The masked-language-model objective of encoder pretraining (BERT, Devlin et al. 2019), which
`mt pretrain` trains through the same Trainer as translation.

15% of the real source tokens are chosen; of those, 80% are replaced by the mask token, 10% by
a random token and 10% left as they are, and the encoder learns to predict the originals
through the (tied) source embedding matrix, with plain cross-entropy. The mask token is
<unk> (mt.tokens.MASK)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mt.data.batching import Batch
from mt.objectives import Objective
from mt.tokens import BOS, EOS, MASK, PAD

MASK_RATE, REPLACE_MASK, REPLACE_RANDOM = 0.15, 0.8, 0.1


def mask_tokens(
    src: torch.Tensor,
    vocab_size: int,
    generator: torch.Generator | None = None,
    rate: float = MASK_RATE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) for masked-LM training of src (B, S): targets hold the original ids
    at the chosen positions and PAD elsewhere (not scored); PAD, BOS and EOS are never chosen."""

    def rand(shape):
        return torch.rand(shape, generator=generator, device=src.device)

    real = (src != PAD) & (src != BOS) & (src != EOS)
    chosen = real & (rand(src.shape) < rate)
    roll = rand(src.shape)
    to_mask = chosen & (roll < REPLACE_MASK)
    to_random = chosen & (roll >= REPLACE_MASK) & (roll < REPLACE_MASK + REPLACE_RANDOM)
    randoms = torch.randint(4, vocab_size, src.shape, generator=generator, device=src.device)
    inputs = torch.where(to_mask, torch.full_like(src, MASK), src)
    inputs = torch.where(to_random, randoms, inputs)
    return inputs, src.masked_fill(~chosen, PAD)


def masked_batch(batch: Batch, seed: list[int], vocab_size: int) -> Batch:
    """The walked batch as a masked-LM batch: src the masked inputs, tgt_out the originals at
    the chosen positions (PAD elsewhere), n_tokens their number; the draw depends on `seed`
    alone (the batch's epoch seed and position)."""
    generator = torch.Generator().manual_seed(
        int(np.random.SeedSequence(seed).generate_state(1)[0])
    )
    inputs, targets = mask_tokens(batch.src, vocab_size, generator)
    return Batch(inputs, batch.src, targets, int((targets != PAD).sum()))


def mlm_loss(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy over the masked positions, the same): BERT's loss is not smoothed."""
    states = model.encode(batch.src, batch.src_pad_mask)  # (B, S, D)
    chosen = batch.tgt_out != PAD
    logits = F.linear(states[chosen], model.src_embed.weight)  # (N, V), tied
    loss = F.cross_entropy(logits.float(), batch.tgt_out[chosen], reduction="sum")
    return loss, loss.detach()


def masked_lm_objective(vocab_size: int) -> Objective:
    return Objective(
        loss=mlm_loss,
        prepare=lambda batch, seed: masked_batch(batch, seed, vocab_size),
    )
