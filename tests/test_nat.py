"""The non-autoregressive model (model.arch nat): masking in training, the length predictor's
loss, a decoder without the causal mask, and mask-predict decoding."""

import torch
import torch.nn.functional as F

from mt.config import ModelConfig
from mt.data.batching import Batch
from mt.decode.mask_predict import mask_predict
from mt.model import build_model
from mt.objectives.nat import (
    LENGTH_LOSS_WEIGHT,
    mask_for_training,
    nat_loss,
    targets_of,
)
from mt.tokens import BOS, EOS, MASK, PAD
from tests.conftest import ROOT, make_src, run_mt


def _model():
    torch.manual_seed(0)
    return build_model(
        ModelConfig(
            arch="nat",
            d_model=32,
            n_heads=4,
            enc_layers=2,
            dec_layers=2,
            d_ff=64,
            dropout=0.0,
            max_positions=64,
        ),
        40,
        40,
    )


def _batch():
    src = make_src([7, 5, 9])
    words = torch.randint(4, 40, (3, 6))
    words[1, 4:] = PAD
    tgt_out = torch.cat([words, torch.full((3, 1), PAD)], 1)
    for i, n in enumerate([6, 4, 6]):
        tgt_out[i, n] = EOS
    tgt_in = torch.cat([torch.full((3, 1), BOS), words], 1)
    return Batch(src, tgt_in, tgt_out, int((tgt_out != PAD).sum()))


def test_training_masks_hide_one_to_all_real_tokens_and_never_padding():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 40, (500, 12))
    lengths = torch.randint(1, 13, (500,))
    tokens[torch.arange(12)[None, :] >= lengths[:, None]] = PAD
    hidden = mask_for_training(tokens, g)
    assert not (hidden & (tokens == PAD)).any()
    counts = hidden.sum(1)
    assert ((counts >= 1) & (counts <= lengths)).all()
    assert (counts == lengths).any() and (counts == 1).any()  # the whole range


def test_the_loss_scores_exactly_the_hidden_tokens_plus_the_length_term():
    model, batch = _model().train(), _batch()
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    loss, nll = nat_loss(model, batch, 0.0, g1)
    tokens = targets_of(batch)
    hidden = mask_for_training(tokens, g2)
    memory = model.encode(batch.src, batch.src_pad_mask)
    logits = model.project(
        model.decode(tokens.masked_fill(hidden, MASK), memory, batch.src_pad_mask)
    )
    token_nll = F.cross_entropy(logits[hidden], tokens[hidden], reduction="sum")
    lengths = (tokens != PAD).sum(1)
    length_nll = F.cross_entropy(
        model.predict_length(memory, batch.src_pad_mask), lengths, reduction="sum"
    )
    torch.testing.assert_close(nll, token_nll, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        loss, token_nll + LENGTH_LOSS_WEIGHT * length_nll * hidden.sum() / 3, rtol=1e-5, atol=1e-5
    )


def test_the_decoder_sees_the_whole_target():
    """Unlike the autoregressive decoder, a later target token changes an earlier position."""
    model = _model().eval()
    src = make_src([6])
    a = torch.tensor([[5, 6, 7, 8]])
    b = torch.tensor([[5, 6, 7, 9]])
    with torch.no_grad():
        memory = model.encode(src, src == PAD)
        ha, hb = model.decode(a, memory, src == PAD), model.decode(b, memory, src == PAD)
    assert not torch.allclose(ha[:, 0], hb[:, 0])
    # and target padding is masked: what stands behind PAD changes nothing
    c = torch.tensor([[5, 6, PAD, PAD]])
    with torch.no_grad():
        hc = model.decode(c, memory, src == PAD)
        hd = model.decode(torch.tensor([[5, 6, PAD, PAD]]), memory, src == PAD)
    torch.testing.assert_close(hc[:, :2], hd[:, :2])


def test_one_iteration_is_one_parallel_pass_and_more_refine():
    model = _model().eval()
    src = make_src([7, 5, 9])
    calls = []
    real_decode = model.decode

    def counting(tgt_in, *a, **k):
        calls.append(tgt_in.shape)
        return real_decode(tgt_in, *a, **k)

    model.decode = counting
    once = mask_predict(model, src, src == PAD, iterations=1, length_beam=2)
    assert len(calls) == 1 and calls[0][0] == 3 * 2  # all candidates, one pass
    calls.clear()
    four = mask_predict(model, src, src == PAD, iterations=4, length_beam=2)
    assert len(calls) == 4
    for out in once + four:
        assert out and not {PAD, BOS, EOS, MASK} & set(out)


def test_nat_trains_and_translates_from_the_cli(tmp_path):
    proc = run_mt(
        "train",
        ROOT / "configs/tiny.yaml",
        "--run-dir",
        tmp_path / "nat",
        "--set",
        f"data.dir={tmp_path / 'd'}",
        "model.arch=nat",
        "train.max_steps=10",
        "train.valid_every=10",
        "decode.nat_iterations=2",
    )
    assert proc.returncode == 0, proc.stderr
    out = run_mt("translate", tmp_path / "nat", input="mi lo ka\n\ntu\n")
    assert out.returncode == 0 and len(out.stdout.split("\n")) == 4, out.stderr
    assert "mask-predict, 2 iterations" in out.stderr
    bad = run_mt(
        "train",
        ROOT / "configs/tiny.yaml",
        "--run-dir",
        tmp_path / "x",
        "--set",
        f"data.dir={tmp_path / 'd'}",
        "model.arch=nat",
        "train.rdrop_alpha=1",
    )
    assert bad.returncode == 2 and "autoregressive models only" in bad.stderr
