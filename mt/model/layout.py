"""What a teacher-forced batch tells the layers: which keys each token may attend to and where
each token sits. The batch makes it, as the Annotated Transformer's Batch makes its src_mask
and tgt_mask: a packed batch (several pairs to a row, mt/data/packing.py) its dense masks, the
compiled step on a GPU FlexAttention's block masks (mt/fast/flex.py). A batch of one pair a
row needs none: the model's encode and decode make its masks from the padding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Layout:
    encoder_mask: Any  # may-attend (R, 1, S, S), or a FlexAttention BlockMask
    decoder_mask: Any  # (R, 1, T, T): the same pair's earlier tokens
    cross_mask: Any  # (R, 1, T, S): the same pair's source
    src_positions: torch.Tensor  # (R, S): each token's position in its own pair
    tgt_positions: torch.Tensor  # (R, T)
