"""Scheduled sampling: the schedules, the mixing of predictions into the input, and teacher
forcing exactly when the gold probability is 1."""

import itertools
import math

import pytest
import torch

from mt.config import ModelConfig, ScheduledSamplingConfig
from mt.data.batching import Batch
from mt.model import build_model
from mt.objectives.loss import reference_loss
from mt.objectives.scheduled_sampling import (
    ScheduledSamplingLoss,
    gold_probability,
    mixed_input,
)
from mt.tokens import BOS, PAD
from tests.conftest import make_src, run_mt, train_tiny


@pytest.mark.parametrize(
    "schedule,k,c",
    [("linear", 1.0, 1e-4), ("exponential", 0.9995, 0.0), ("inverse_sigmoid", 500.0, 0.0)],
)
def test_schedules_start_at_one_decay_and_respect_the_floor(schedule, k, c):
    ps = [gold_probability(s, schedule, k, c, min_gold=0.25) for s in range(0, 20001, 500)]
    assert ps[0] == pytest.approx(1.0, abs=2e-3)
    assert all(a >= b for a, b in itertools.pairwise(ps)) and ps[-1] == 0.25
    assert gold_probability(1000, "linear", 1.0, 1e-4) == pytest.approx(0.9)
    assert gold_probability(10, "exponential", 0.5) == pytest.approx(0.5**10)
    assert gold_probability(2000, "inverse_sigmoid", 1000.0) == pytest.approx(
        1000 / (1000 + torch.e**2)
    )


def test_mixed_input_keeps_bos_and_padding_and_mixes_the_rest():
    tgt_in = torch.tensor([[BOS, 5, 6, 7, PAD], [BOS, 8, 9, PAD, PAD]])
    predicted = torch.full((2, 5), 11)
    assert torch.equal(mixed_input(tgt_in, predicted, 1.0), tgt_in)
    all_pred = mixed_input(tgt_in, predicted, 0.0)
    assert all_pred.tolist() == [[BOS, 11, 11, 11, PAD], [BOS, 11, 11, PAD, PAD]]
    g = torch.Generator().manual_seed(0)
    big = torch.full((200, 50), 5)
    big[:, 0] = BOS
    share = float((mixed_input(big, torch.full((200, 50), 11), 0.3, g)[:, 1:] == 5).float().mean())
    assert abs(share - 0.3) < 0.03


def _small_transformer():
    """A one-layer Transformer of 40 tokens, the same weights every time, without dropout."""
    torch.manual_seed(0)
    return build_model(
        ModelConfig(d_model=32, n_heads=4, enc_layers=1, dec_layers=1, d_ff=64, dropout=0.0), 40, 40
    )


def _batch():
    src = make_src([6, 4, 7])
    tgt = torch.randint(4, 40, (3, 6))
    tgt[:, 0] = BOS
    tgt[1, 4:] = PAD
    return Batch(src, tgt[:, :-1], tgt[:, 1:], int((tgt[:, 1:] != PAD).sum()))


@pytest.mark.parametrize(
    "arch,two_pass",
    [("transformer", True), ("transformer", False), ("rnn", False), ("decoder_only", False)],
)
def test_gold_probability_one_is_teacher_forcing(arch, two_pass):
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(
            arch=arch, d_model=32, n_heads=4, enc_layers=1, dec_layers=2, d_ff=64, dropout=0.0
        ),
        40,
        40,
    ).train()
    batch = _batch()
    ss = ScheduledSamplingLoss(
        ScheduledSamplingConfig(schedule="linear", k=1.0, c=0.0, min_gold=1.0),
        reference_loss,
        two_pass,
    )
    ss.set_step(1000)
    ref, ref_nll = reference_loss(model, batch, 0.1)
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    loss, nll = ss(model, batch, 0.1)
    loss.backward()
    if two_pass:  # the same computation: bit for bit
        assert torch.equal(loss, ref) and torch.equal(nll, ref_nll)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-5)
    for n, g in ref_grads.items():
        torch.testing.assert_close(
            dict(model.named_parameters())[n].grad, g, rtol=1e-4, atol=1e-5, msg=n
        )


def test_gold_probability_zero_feeds_the_first_pass_predictions():
    model = _small_transformer().train()
    batch = _batch()
    seen = []
    ss = ScheduledSamplingLoss(
        ScheduledSamplingConfig(schedule="linear", k=1.0, c=1.0),
        lambda m, b, e: seen.append(b.tgt_in) or reference_loss(m, b, e),
        two_pass=True,
    )
    ss.set_step(5)  # p = 1 - 5, floored at 0
    ss(model, batch, 0.1)
    with torch.no_grad():
        predicted = model(batch.src, batch.tgt_in, batch.src_pad_mask).argmax(-1)
    expected = mixed_input(batch.tgt_in, predicted, 0.0)
    assert torch.equal(seen[0], expected) and not torch.equal(seen[0], batch.tgt_in)


def test_training_with_scheduled_sampling_from_the_cli(tmp_path):
    """Through `mt train`: gold probability 1 (c = 0) trains exactly as teacher forcing; gold
    probability 0 from the first update (c = 1) feeds predictions and learns otherwise."""

    def losses(run, arch, *ss):
        args = [f"model.arch={arch}", "train.max_steps=6", "train.valid_every=6"]
        args += ["train.log_every=1", "train.average_last=0", *ss]
        return [loss for _, loss in train_tiny(tmp_path / run, tmp_path / "d", *args)[1]]

    linear = ["train.scheduled_sampling.schedule=linear", "train.scheduled_sampling.k=1.0"]
    for arch in ("transformer", "rnn"):
        plain = losses(f"{arch}-plain", arch)
        sampled = losses(f"{arch}-p0", arch, *linear, "train.scheduled_sampling.c=1.0")
        assert len(plain) == len(sampled) == 6
        assert sampled[0] == pytest.approx(plain[0], abs=1e-4)  # step 0: p = 1
        assert all(abs(a - b) > 1e-3 for a, b in zip(plain[2:], sampled[2:], strict=True))
    forced = losses(
        "transformer-p1", "transformer", *linear, "train.scheduled_sampling.min_gold=1.0",
        "train.scheduled_sampling.c=0.0",
    )  # fmt: skip
    assert forced == losses("transformer-plain-again", "transformer")


class ScriptedDecoder:
    """A stand-in model run step by step: whatever it reads, it predicts NEXT[token]
    (a token never in the gold targets), and it records every token it is fed."""

    V = 40
    NEXT = tuple(30 + (t * 7) % 10 for t in range(V))  # predictions: 30..39; gold: 4..29

    def __init__(self):
        self.fed: list[torch.Tensor] = []
        self.training = True
        self.param = torch.nn.Parameter(torch.zeros(()))

    def encode(self, src, src_pad_mask):
        return torch.zeros(src.shape[0], src.shape[1], 4)

    cache_layers = 0

    def decode(self, token, memory, src_pad_mask, cache=None, start=0):
        self.fed.append(token[:, -1].clone())
        onehot = torch.nn.functional.one_hot(token[:, -1:], self.V).float()
        return onehot + self.param  # (B, 1, V): a "state" project() maps to logits

    def project(self, h):
        nxt = torch.tensor([self.NEXT[t] for t in range(self.V)])
        return h @ torch.nn.functional.one_hot(nxt, self.V).float()  # argmax: NEXT[token]


def _gold_batch(rows=64, length=12):
    g = torch.Generator().manual_seed(3)
    words = torch.randint(4, 30, (rows, length), generator=g)
    tgt_in = torch.cat([torch.full((rows, 1), BOS), words[:, :-1]], 1)
    tgt_in[0, 8:] = PAD  # one shorter sentence
    tgt_out = words.masked_fill(tgt_in == PAD, PAD)
    return Batch(torch.full((rows, 3), 5), tgt_in, tgt_out, int((tgt_out != PAD).sum()))


def _step_by_step_inputs(gold_p: float, seed: int = 0, pick: str = "argmax"):
    model, batch = ScriptedDecoder(), _gold_batch()
    c = 1.0 - gold_p  # linear k - c * step at step 1
    ss = ScheduledSamplingLoss(
        ScheduledSamplingConfig(schedule="linear", k=1.0, c=c, pick=pick),
        reference_loss,
        False,
        seed,
    )
    ss.set_step(1)
    ss(model, batch, 0.0)
    return torch.stack(model.fed, 1), batch  # (B, T): what each step read


def test_step_by_step_at_gold_probability_zero_feeds_each_step_its_own_prediction():
    fed, batch = _step_by_step_inputs(0.0)
    assert torch.equal(fed[:, 0], batch.tgt_in[:, 0])  # BOS
    for t in range(1, fed.shape[1]):
        previous_guess = torch.tensor([ScriptedDecoder.NEXT[int(x)] for x in fed[:, t - 1]])
        expected = torch.where(batch.tgt_in[:, t] == PAD, PAD, previous_guess)
        assert torch.equal(fed[:, t], expected), t


@pytest.mark.parametrize("gold_p", [0.25, 0.7])
def test_step_by_step_mixes_gold_tokens_at_the_scheduled_rate(gold_p):
    fed, batch = _step_by_step_inputs(gold_p)
    real = batch.tgt_in[:, 1:] != PAD
    gold = fed[:, 1:] == batch.tgt_in[:, 1:]
    share = float(gold[real].float().mean())  # predictions are never gold tokens
    assert abs(share - gold_p) < 0.05, share
    again, _ = _step_by_step_inputs(gold_p)
    other, _ = _step_by_step_inputs(gold_p, seed=1)
    assert torch.equal(fed, again) and not torch.equal(fed, other)  # the seed decides


@pytest.mark.parametrize("gold_p", [0.25, 0.7])
def test_two_pass_mixes_first_pass_predictions_at_the_scheduled_rate(gold_p):
    model = _small_transformer().train()
    batch, seen = _gold_batch(), []
    ss = ScheduledSamplingLoss(
        ScheduledSamplingConfig(schedule="linear", k=1.0, c=1.0 - gold_p),
        lambda m, b, e: seen.append(b.tgt_in) or reference_loss(m, b, e),
        two_pass=True,
    )
    ss.set_step(1)
    ss(model, batch, 0.1)
    with torch.no_grad():
        predicted = model(batch.src, batch.tgt_in, batch.src_pad_mask).argmax(-1)
    mixed, gold_in = seen[0][:, 1:], batch.tgt_in[:, 1:]
    real = gold_in != PAD
    assert torch.equal(seen[0][:, 0], batch.tgt_in[:, 0]) and (mixed[~real] == PAD).all()
    from_gold = mixed == gold_in
    from_model = mixed == predicted[:, :-1]
    assert (from_gold | from_model)[real].all()  # every input is one or the other
    differ = real & (gold_in != predicted[:, :-1])  # where the two can be told apart
    share = float(from_gold[differ].float().mean())
    assert abs(share - gold_p) < 0.06, share


def test_sampled_predictions_follow_the_model_s_distribution():
    """pick: sample (Bengio et al.): each fed token is drawn from softmax(logits); the scripted
    model's logits are 1 for NEXT[token] and 0 for the V - 1 others."""
    fed, batch = _step_by_step_inputs(0.0, pick="sample")
    real = batch.tgt_in[:, 1:] != PAD
    nxt = torch.tensor(ScriptedDecoder.NEXT)[fed[:, :-1]]
    share = float((fed[:, 1:] == nxt)[real].float().mean())
    expected = math.e / (math.e + ScriptedDecoder.V - 1)  # 0.065
    assert abs(share - expected) < 0.03, share
    argmax, _ = _step_by_step_inputs(0.0)
    assert not torch.equal(fed, argmax)


def test_a_linear_schedule_that_would_never_decay_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="would stay at k = 1"):
        ScheduledSamplingConfig(schedule="linear", k=1.0, c=0.0)
    assert ScheduledSamplingConfig(schedule="linear", k=1.0, c=1e-4).c == 1e-4
    proc = run_mt(
        "train", "tiny", "--set", "train.scheduled_sampling.schedule=linear",
        "train.scheduled_sampling.k=1.0",
    )  # fmt: skip
    assert proc.returncode == 2 and "train.scheduled_sampling.c is 0" in proc.stderr


def test_scheduled_sampling_resumes_exactly(tmp_path):
    """Its draws are seeded by the update, so 3 updates, a stop and 3 more equal 6 straight."""

    def run(name, steps):
        return train_tiny(
            tmp_path / name, tmp_path / "d", f"train.max_steps={steps}", "train.log_every=1",
            "train.valid_every=100", "train.save_every=3", "train.average_last=0",
            "train.scheduled_sampling.schedule=linear", "train.scheduled_sampling.k=1.0",
            "train.scheduled_sampling.c=0.2",
        )[1]  # fmt: skip

    straight = run("straight", 6)
    run("resumed", 3)
    assert run("resumed", 6) == straight


def _loss_of(gold_p: float, pick: str = "argmax", seed: int = 0):
    return ScheduledSamplingLoss(
        ScheduledSamplingConfig(schedule="linear", k=1.0, c=1.0 - gold_p, pick=pick),
        reference_loss,
        True,
        seed,
    )


def test_picks_are_draws_from_the_softmax_over_the_vocabulary():
    """pick: sample, counted: each token's frequency is its softmax probability along the
    vocabulary (not along the batch or time), for (N, V) and (B, T, V) logits; the seed
    decides the draws."""
    ss = _loss_of(0.5, "sample")
    logits = torch.tensor([[2.0, 0.0, -1.0, 1.0], [0.0, 3.0, 0.0, 0.0]])
    expected = torch.softmax(logits, -1)
    for shape in ((2, 4), (1, 2, 4)):
        ss.set_step(0)
        counts = torch.zeros(2, 4)
        batch = logits.view(*shape)
        for _ in range(2000):
            drawn = ss._pick(batch).reshape(-1)
            counts[torch.arange(2), drawn] += 1
        torch.testing.assert_close(counts / 2000, expected, atol=0.04, rtol=0)
    big = torch.randn(8, 5, 30)
    ss.set_step(7)
    a = ss._pick(big)
    ss.set_step(7)
    assert torch.equal(a, ss._pick(big))
    other = _loss_of(0.5, "sample", seed=1)
    other.set_step(7)
    assert not torch.equal(a, other._pick(big))
    assert torch.equal(_loss_of(0.5)._pick(big), big.argmax(-1))


def test_two_pass_mixing_is_decided_by_the_seed_and_the_update():
    model = _small_transformer().train()
    batch = _gold_batch()

    def mixed(seed, step):
        seen = []
        ss = ScheduledSamplingLoss(
            ScheduledSamplingConfig(schedule="linear", k=1.0, c=0.5 / max(step, 1)),
            lambda m, b, e: seen.append(b.tgt_in) or reference_loss(m, b, e),
            True,
            seed,
        )
        ss.set_step(step)
        ss(model, batch, 0.1)
        return seen[0]

    assert torch.equal(mixed(0, 3), mixed(0, 3))
    assert not torch.equal(mixed(0, 3), mixed(1, 3))
    assert not torch.equal(mixed(0, 3), mixed(0, 4))


def test_validation_sees_the_model_as_it_decodes():
    """In eval mode (validation) the loss is the base loss on the gold input, whatever p."""
    model = _small_transformer().eval()
    batch = _batch()
    ss = _loss_of(0.0)
    ss.set_step(10)
    with torch.no_grad():
        got, want = ss(model, batch, 0.1), reference_loss(model, batch, 0.1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
