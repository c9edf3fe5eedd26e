"""Equations of the papers the models follow, each checked against the formula as the paper
writes it, computed here with plain Python arithmetic, not with the code under test."""

import math

import torch

from mt.config import ModelConfig
from mt.decode.mask_predict import mask_predict
from mt.model import build_model
from mt.model.positions import sinusoidal_table
from mt.tokens import MASK, PAD
from tests.test_nat import ScriptedNAT, _expected_winner


def test_the_sinusoid_puts_sines_on_even_and_cosines_on_odd_dimensions():
    """Vaswani et al. (2017), sec. 3.5: PE(pos, 2i) = sin(pos / 10000^(2i / d_model)) and
    PE(pos, 2i + 1) = cos(pos / 10000^(2i / d_model))."""
    d = 16
    table = sinusoidal_table(64, d)
    model = build_model(ModelConfig(d_model=d, n_heads=2, enc_layers=1, dec_layers=1, d_ff=32,
                                    max_positions=64), 20, 20)  # fmt: skip
    positions = model.positions(torch.arange(64))  # what the embeddings get added
    for pos in (0, 1, 2, 7, 40, 63):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            for got in (table[pos], positions[pos]):
                assert math.isclose(float(got[2 * i]), math.sin(angle), abs_tol=1e-5)
                assert math.isclose(float(got[2 * i + 1]), math.cos(angle), abs_tol=1e-5)


class UnsureOfWhatItReads(ScriptedNAT):
    """ScriptedNAT, except that a token it reads unhidden it re-predicts with probability
    SHOWN only, below every first prediction: Mask-Predict must not take that in."""

    SHOWN = 0.05

    def decode(self, tokens, memory, src_pad_mask):
        lprobs = super().decode(tokens, memory, src_pad_mask)
        rest = math.log((1 - self.SHOWN) / (self.V - self.OTHER))
        for r, j in ((tokens != MASK) & (tokens != PAD)).nonzero().tolist():
            lprobs[r, j, self.OTHER :] = rest
            lprobs[r, j, self.WORD + j] = math.log(self.SHOWN)
        return lprobs


def test_mask_predict_updates_the_probabilities_of_the_re_masked_tokens_only():
    """Ghazvininejad et al. (2019), sec. 3.1, eq. 3-4: a pass predicts the masked tokens Y_mask
    and updates their tokens and probabilities, y_i, p_i for i in Y_mask; the others keep
    theirs. So the tokens hidden at pass t are the n = L (T - t) / T with the lowest
    probabilities of their last prediction as a hidden token (BASE[L] * WEIGHT[j], what the
    scripted model gives a hidden position), and a candidate's score is the mean of those."""
    T, lengths = 4, [7, 5, 6]
    base = {7: 0.9, 5: 0.8, 6: 0.7}
    model = UnsureOfWhatItReads(lengths, base)
    src = torch.tensor([[5, 6, 7]])
    out = mask_predict(model, src, src == PAD, iterations=T, length_beam=3)[0]
    assert len(model.inputs) == T
    for t, tokens in enumerate(model.inputs):
        for r, length in enumerate(lengths):
            hidden = [j for j in range(length) if tokens[r, j] == MASK]
            n = length if t == 0 else int(length * (T - t) / T)
            p = [base[length] * ScriptedNAT.WEIGHT[j] for j in range(length)]  # p_i of eq. 4
            least_sure = sorted(sorted(range(length), key=lambda j: p[j])[:n])
            assert hidden == least_sure, (t, length, hidden)
    winner = _expected_winner(lengths, base)
    assert out == [ScriptedNAT.WORD + j for j in range(winner)]
