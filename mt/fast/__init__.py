"""Fast paths for CPU training, beside the reference model rather than inside it.

The reference model (mt/model) is the paper written plainly. What made CPU training about
1.5x faster than Hugging Face Marian lives here, in one place, and is swapped in by
`install(model)` (called by mt.train.build on a CPU, where `train.fast_paths` is "auto", the default,
or on any device where it is true):

- nodes.py:   fused autograd nodes for the feed-forward, the post-LN add & norm and attention
              with its output projection (fp32 CPU training only, see `cpu_fused`);
- dropout.py: dropout masks from a counter hash instead of torch's one-core generator;
- modules.py: the subclasses that use them, and the packing of the feed-forward sublayers'
              rows to the real (not padding) positions;
- loss.py:    the output projection fused with the label-smoothed loss, in chunks of rows,
              and with R-Drop's two losses and their symmetric KL;
- optim.py:   Adam through PyTorch's fused kernel without torch.optim (the optimizer of
              every run, on every device: torch.optim's first step imports torch._dynamo,
              tens of MB of resident memory).

`install` changes the class of the model's modules to their fast subclasses: the parameters,
the state_dict and the checkpoints stay exactly those of the reference model, and each fast
path equals the reference in values and gradients (tests/test_fast_paths.py). Measurements:
docs/performance.md.
"""
from __future__ import annotations

from torch import nn

from mt.fast.dropout import HashDropout
from mt.fast.loss import chunked_loss, chunked_rdrop_loss
from mt.fast.modules import (FastFeedForward, FastMultiHeadAttention, FastResidual,
                             FastTransformer)
from mt.model.attention import MultiHeadAttention
from mt.model.layers import FeedForward, Residual
from mt.model.transformer import Transformer

FAST = {nn.Dropout: HashDropout, FeedForward: FastFeedForward, Residual: FastResidual,
        MultiHeadAttention: FastMultiHeadAttention, Transformer: FastTransformer}

__all__ = ["install", "chunked_loss", "chunked_rdrop_loss", "FAST"]


def install(model: nn.Module) -> nn.Module:
    """Swap every module of `model` that has a fast version to it, in place."""
    for module in model.modules():
        fast = FAST.get(type(module))
        if fast is not None:
            module.__class__ = fast
    return model
