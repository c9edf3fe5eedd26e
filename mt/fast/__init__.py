"""Fast paths for CPU training, beside the reference model rather than inside it.

The reference model (mt/model) is the paper written plainly. What makes CPU training faster
lives here, in one place, and goes in through `PARTS`, the module classes that
mt.model.build_model builds a model from where they apply (mt.train.parts: on a CPU, where
`train.fast_paths` is "auto", the default, or on any device where it is true):

- nodes.py:   fused autograd nodes for the feed-forward, the post-LN add & norm and attention
              with its output projection (fp32 CPU training only, see `cpu_fused`);
- dropout.py: dropout masks from a counter hash instead of torch's one-core generator;
- modules.py: the subclasses that use them, and the feed-forward sublayers run on the real
              (not padding) rows alone;
- loss.py:    the output projection fused with the label-smoothed loss, in chunks of rows,
              and with R-Drop's two losses and their symmetric KL;
- flex.py:    packed batches' attention through FlexAttention's block masks (a compiled step
              on a GPU).

Each fast class subclasses its reference module: the parameters, the state_dict and the
checkpoints stay exactly those of the reference model, and each fast path equals the reference
in values and gradients (tests/test_fast_paths.py). Measurements: docs/performance.md.
"""

from __future__ import annotations

from mt.fast.dropout import HashDropout
from mt.fast.loss import chunked_loss, chunked_rdrop_loss, compiled_chunked_loss
from mt.fast.modules import FastFeedForward, FastMultiHeadAttention, FastResidual, FastTransformer
from mt.model import Parts

# what mt.model.build_model builds from where the fast paths apply (mt.train.parts)
PARTS = Parts(
    attention=FastMultiHeadAttention,
    feed_forward=FastFeedForward,
    residual=FastResidual,
    dropout=HashDropout,
    transformer=FastTransformer,
)

__all__ = ["PARTS", "chunked_loss", "chunked_rdrop_loss", "compiled_chunked_loss"]
