"""The non-autoregressive model (model.arch nat): masking in training, the length predictor's
loss, a decoder without the causal mask, and mask-predict decoding."""

import math

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
from tests.conftest import ROOT, assert_user_error, make_src, run_mt


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
    # the flags reach mask_predict: the CLI's output is the library's for the same knobs
    from mt.decode.translator import Translator

    lines = ["mi lo ka", "tu", "ka ka mi lo"]
    t = Translator.load(tmp_path / "nat", "cpu")
    for flags, knobs in (
        (["--nat-iterations", "1", "--nat-length-beam", "1"], (1, 1)),
        ([], (2, 3)),
    ):
        out = run_mt("translate", tmp_path / "nat", *flags, input="\n".join(lines) + "\n")
        assert out.returncode == 0, out.stderr
        assert f"mask-predict, {knobs[0]} iterations, {knobs[1]} candidate lengths" in out.stderr
        expected = t.translate(lines, nat_iterations=knobs[0], nat_length_beam=knobs[1])
        assert out.stdout.splitlines() == expected
    # --print-alignment: one link per output subword (no EOS row to drop: the length was
    # predicted), from the attention of the pass that produced the output
    out = run_mt("translate", tmp_path / "nat", "--print-alignment", input="\n".join(lines) + "\n")
    assert out.returncode == 0, out.stderr
    for row in out.stdout.splitlines():
        text, links = row.split("\t")
        n_pieces = len(t.tokenizer.encode_tgt([text])[0]) if text else 0
        assert len(links.split()) == n_pieces, row
    for flag in (["--beam", "3"], ["--greedy"], ["--length-penalty", "0.6"]):
        assert_user_error(run_mt("translate", tmp_path / "nat", *flag, input="tu\n"), "--nat-")
    ar = run_mt("eval", tmp_path / "nat", "--src", tmp_path / "d/test.src", "--ref",
                tmp_path / "d/test.tgt", "--beam", "2")  # fmt: skip
    assert_user_error(ar, "mask-predict", "--nat-length-beam")
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


# -- Mask-Predict against a scripted model whose every number is chosen here -------------
class ScriptedNAT:
    """A stand-in for the NAT model: predict_length ranks lengths as LENGTH_ORDER says; at
    position j of a candidate of length L the decoder predicts token WORD + j with probability
    BASE[L] * WEIGHT[j] (the rest spread over tokens OTHER..V-1), whatever it reads; every
    decoder input is recorded, so a test sees which positions each pass hid."""

    WORD, OTHER, V = 10, 30, 40
    WEIGHT = (0.99, 0.80, 0.95, 0.70, 0.90, 0.75, 0.85, 0.97, 0.65, 0.88)  # by position
    max_positions = 16

    def __init__(self, length_order: list[int], base: dict[int, float]):
        self.length_order, self.base, self.inputs = length_order, base, []

    def encode(self, src, src_pad_mask):
        return torch.zeros(src.shape[0], src.shape[1], 4)

    def predict_length(self, memory, src_pad_mask):
        logits = torch.full((memory.shape[0], self.max_positions), -50.0)
        for rank, length in enumerate(self.length_order):  # the first is the likeliest
            logits[:, length] = 10.0 - rank
        return logits

    def decode(self, tokens, memory, src_pad_mask):
        self.inputs.append(tokens.clone())
        lprobs = torch.full((*tokens.shape, self.V), -1e9)
        for r in range(tokens.shape[0]):
            length = int((tokens[r] != PAD).sum())
            for j in range(length):
                p = self.base[length] * self.WEIGHT[j]
                lprobs[r, j, self.WORD + j] = math.log(p)
                lprobs[r, j, self.OTHER :] = math.log((1 - p) / (self.V - self.OTHER))
        return lprobs

    def project(self, h):
        return h


def _scripted_run(iterations, length_order, base, length_beam=3):
    model = ScriptedNAT(length_order, base)
    src = torch.tensor([[5, 6, 7]])
    out = mask_predict(model, src, src == PAD, iterations=iterations, length_beam=length_beam)
    return model, out[0]


def test_mask_predict_hides_the_least_confident_tokens_n_times_l_t_minus_t_over_t():
    """Ghazvininejad et al. 2019: pass t (0-based) of T re-predicts n = L (T - t) / T tokens,
    the least confident ones; the first pass sees every position hidden."""
    T, lengths = 4, [7, 5, 6]
    model, _ = _scripted_run(T, lengths, {7: 0.9, 5: 0.8, 6: 0.7})
    assert len(model.inputs) == T
    seen_lengths = [int(n) for n in (model.inputs[0] != PAD).sum(1)]
    assert seen_lengths == lengths  # the candidate lengths, in the predictor's order
    for t, tokens in enumerate(model.inputs):
        for r, length in enumerate(lengths):
            hidden = [j for j in range(length) if tokens[r, j] == MASK]
            n = length if t == 0 else int(length * (T - t) / T)
            by_confidence = sorted(range(length), key=lambda j: ScriptedNAT.WEIGHT[j])
            assert hidden == sorted(by_confidence[:n]), (t, length, hidden)
            shown = [int(x) for x in tokens[r, :length] if x != MASK]
            assert all(x >= ScriptedNAT.WORD for x in shown)  # earlier predictions, kept
            assert (tokens[r, length:] == PAD).all()


def _expected_winner(lengths: list[int], base: dict[int, float]) -> int:
    """The candidate Mask-Predict should keep, computed here: the mean log-probability of its
    tokens plus the length predictor's log-probability of its length."""
    logits = ScriptedNAT(lengths, base).predict_length(torch.zeros(1, 1, 4), None)[0, 1:]
    length_lp = torch.log_softmax(logits, -1)

    def score(n):
        tokens = sum(math.log(base[n] * ScriptedNAT.WEIGHT[j]) for j in range(n)) / n
        return tokens + float(length_lp[n - 1])

    return max(lengths, key=score)


def test_mask_predict_keeps_the_candidate_with_the_best_score():
    """Label smoothing caps every token's probability, so a candidate a word short or long can
    tie with the right one on its tokens alone: the length predictor's log-probability joins
    the mean token log-probability (a length beam of 3 lost 8 BLEU on the synthetic task
    without it)."""
    lengths = [5, 7, 6]  # the predictor prefers 5, by one logit over 7
    for base, winner in (
        ({5: 0.6, 7: 0.95, 6: 0.8}, 5),  # 7's surer tokens do not outweigh the length term
        ({5: 0.3, 7: 0.95, 6: 0.8}, 7),  # these do
        ({5: 0.99, 7: 0.6, 6: 0.8}, 5),
    ):
        assert _expected_winner(lengths, base) == winner
        _, out = _scripted_run(3, lengths, base)
        assert out == [ScriptedNAT.WORD + j for j in range(winner)], base


def test_mask_predict_takes_the_length_beam_likeliest_lengths():
    model, _ = _scripted_run(1, [9, 3, 4, 6], {9: 0.9, 3: 0.9, 4: 0.9, 6: 0.9}, length_beam=2)
    assert [int(n) for n in (model.inputs[0] != PAD).sum(1)] == [9, 3]
    model, out = _scripted_run(1, [1, 3], {1: 0.9, 3: 0.5}, length_beam=1)
    assert out == [ScriptedNAT.WORD] and model.inputs[0].shape == (1, 1)


def test_nat_validation_scores_the_same_masked_tokens_every_time(tmp_path):
    """The NAT's valid loss hides tokens by a draw seeded by the batch's position: two
    validations of the same weights agree, the training RNG is not touched, the NLL is per
    hidden token (each hidden token's log-probability, counted here), and the record says
    what it scores."""
    from mt.objectives.nat import mask_for_training, nat_valid_loss
    from mt.train.build import build_trainer
    from tests.conftest import tiny_config

    cfg = tiny_config(tmp_path / "d", "model.arch=nat", "train.max_steps=5")
    t = build_trainer(cfg, tmp_path / "run", log=lambda *_: None)
    try:
        rng = torch.get_rng_state()
        first, second = t.validate(), t.validate()
        assert torch.equal(rng, torch.get_rng_state())
        assert first["valid_loss"] == second["valid_loss"]
        assert first["valid_nll"] == second["valid_nll"]
        assert "masked target tokens" in first["valid_loss_over"]
        # one batch by hand: the NLL over the hidden tokens only
        batch = _batch()
        t.model.eval()
        with torch.no_grad():
            _, nll, count = nat_valid_loss(t.model, batch, 0, eps=0.0)
            tokens = targets_of(batch)
            hidden = mask_for_training(tokens, torch.Generator().manual_seed(0))
            memory = t.model.encode(batch.src, batch.src_pad_mask)
            lp = torch.log_softmax(
                t.model.project(
                    t.model.decode(tokens.masked_fill(hidden, MASK), memory, batch.src_pad_mask)
                ).float(),
                -1,
            )
            expected = -lp.gather(-1, tokens[..., None])[..., 0][hidden].sum()
        assert count == int(hidden.sum()) < int((tokens != PAD).sum())
        torch.testing.assert_close(nll.float(), expected, rtol=1e-5, atol=1e-4)
    finally:
        t.close()


def test_mask_predict_hands_out_the_input_of_the_pass_that_made_the_output():
    _, out = _scripted_run(4, [5, 7, 6], {5: 0.6, 7: 0.95, 6: 0.8})
    inputs: list[list[int]] = []
    model2 = ScriptedNAT([5, 7, 6], {5: 0.6, 7: 0.95, 6: 0.8})
    src = torch.tensor([[5, 6, 7]])
    again = mask_predict(model2, src, src == PAD, iterations=4, length_beam=3, inputs_out=inputs)
    assert again == [out]
    row = [5, 7, 6].index(len(out))  # the winner's candidate row
    last = model2.inputs[-1][row, : len(out)].tolist()
    assert inputs == [last] and MASK in last  # the last pass re-predicted some tokens


def test_nat_cross_attention_reads_the_given_decoder_input():
    from mt.decode.alignment import hard_alignment, nat_cross_attention

    model = _model().eval()
    src_ids, dec_in = [7, 8, 9, 10], [11, MASK, 13]
    weights = nat_cross_attention(model, src_ids, dec_in, torch.device("cpu"))
    assert weights.shape == (2, 4, 3, 5)  # layers, heads, outputs (no EOS row), source + EOS
    other = nat_cross_attention(model, src_ids, [11, 12, 13], torch.device("cpu"))
    assert not (weights == other).all()  # the masked input is what it read
    assert len(hard_alignment(weights, eos_row=False)) == 3
    assert len(hard_alignment(weights)) == 2


def test_mask_predict_keeps_candidate_lengths_within_max_len():
    model = ScriptedNAT([6, 3, 5], {6: 0.9, 3: 0.9, 5: 0.9})
    src = torch.tensor([[5, 6, 7]])
    mask_predict(model, src, src == PAD, iterations=1, length_beam=2, max_len=5)
    assert [int(n) for n in (model.inputs[0] != PAD).sum(1)] == [3, 5]  # 6 is too long
