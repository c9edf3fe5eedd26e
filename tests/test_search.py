"""Beam search against a scripted model whose log-probabilities are known: the hypothesis it
returns is the best one by logp / len^length_penalty, found by enumerating every output."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from mt.tokens import BOS, EOS
from tests.conftest import beam_search, greedy

V = 7  # PAD, UNK, BOS, EOS and three words
WORDS = [4, 5, 6]


class ScriptedModel(torch.nn.Module):
    """The next token's log-probabilities depend on the last token only: table[last]. The
    search's interface without a network: states are one-hot last tokens, `project` looks
    the row up."""

    cross_cache_per_sentence = False
    max_positions = 64

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table  # (V, V) log-probabilities

    def encode(self, src, src_pad_mask):
        return torch.zeros(src.shape[0], src.shape[1], 1)

    cache_layers = 1

    def decode(self, tgt_in, memory, src_pad_mask, cache=None, start=0, weights=None):
        return F.one_hot(tgt_in, V).float()  # (B, T, V)

    def project(self, h):
        return h @ self.table


def _table(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.full((V, V), -1e9)  # PAD, UNK, BOS: never
    for row in range(V):
        logits[row, [EOS, *WORDS]] = torch.randn(4, generator=g) * 2
    return torch.log_softmax(logits, -1)


def _best_by_enumeration(table, max_tokens: int, lp: float) -> list[int]:
    """Every output of at most max_tokens - 1 words, scored as logp / length ** lp: an output
    that ends by choosing EOS counts EOS in both; one cut at the length limit (its EOS forced,
    with probability 1) counts its words alone, as CTranslate2 does."""
    best = None
    for n in range(max_tokens):
        for words in itertools.product(WORDS, repeat=n):
            seq, logp = [BOS, *words], 0.0
            for a, b in itertools.pairwise(seq):
                logp += float(table[a, b])
            length = n  # cut at the limit
            if n < max_tokens - 1:
                logp += float(table[seq[-1], EOS])  # ends by choice, not forced
                length = n + 1
            # logp / length ** lp, compared in log space: length ** 1000 is no float
            score = -math.log(-logp) + lp * math.log(length)
            if best is None or score > best[0]:
                best = (score, list(words))
    return best[1]


@pytest.mark.parametrize("lp", [0.0, 1.0, 2.0, 1000.0])
def test_exhaustive_beam_returns_the_best_scored_hypothesis(lp):
    """With 3 words and at most 2 before EOS, beam 9 keeps every prefix alive: its answer must
    be the enumeration's, for every length penalty (over 15 random models)."""
    src = torch.tensor([[4, 5, EOS]])
    for seed in range(15):
        table = _table(seed)
        got = beam_search(ScriptedModel(table), src, src == 0, 9, lp, max_len_a=0.0, max_len_b=3)
        assert got == [_best_by_enumeration(table, 3, lp)], seed


def test_the_length_penalty_changes_the_winner_as_the_formula_says():
    """Some models prefer the short output without normalisation and a long one with it."""
    src = torch.tensor([[4, 5, EOS]])
    flipped = 0
    for seed in range(25):
        model = ScriptedModel(_table(seed))
        short = beam_search(model, src, src == 0, 9, 0.0, max_len_a=0.0, max_len_b=3)[0]
        long = beam_search(model, src, src == 0, 9, 3.0, max_len_a=0.0, max_len_b=3)[0]
        assert len(long) >= len(short)
        flipped += len(long) > len(short)
    assert flipped > 0


def test_greedy_follows_the_most_likely_token_and_beam_one_agrees(beam_of_one):
    src = torch.tensor([[4, 5, EOS], [6, EOS, 0]])
    for seed in range(20):
        table = _table(seed)
        expected, last = [], BOS
        for _ in range(5):  # max_len_b 6: 5 words at most
            nxt = int(table[last].argmax())
            if nxt == EOS:
                break
            expected.append(nxt)
            last = nxt
        model = ScriptedModel(table)
        assert greedy(model, src, src == 0, 0.0, 6) == [expected, expected]
        assert beam_search(model, src, src == 0, 1, 1.0, 0.0, 6) == [expected, expected]


def test_a_sentence_ends_at_its_length_limit_with_eos():
    """A model that never wants to stop is cut at max_len_b tokens (EOS included)."""
    table = torch.full((V, V), -1e9)
    table[:, 4] = 0.0  # always the word 4
    table = torch.log_softmax(table, -1)
    src = torch.tensor([[4, EOS]])
    assert greedy(ScriptedModel(table), src, src == 0, 0.0, 4) == [[4, 4, 4]]
    assert beam_search(ScriptedModel(table), src, src == 0, 3, 1.0, 0.0, 4) == [[4, 4, 4]]


def test_search_never_emits_pad_bos_or_unk():
    from mt.config import ModelConfig
    from mt.model import build_model
    from mt.tokens import BOS, EOS, PAD, UNK
    from tests.conftest import beam_search, greedy

    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=32, enc_layers=1, dec_layers=1, d_ff=64), 40, 40).eval()
    real = model.project

    def project(h):  # a model that loves the special tokens
        logits = real(h)
        logits[..., [PAD, BOS, UNK]] += 100.0
        return logits

    model.project = project
    src = torch.randint(4, 40, (3, 5))
    outs = greedy(model, src, src == 0, 0.0, 4) + beam_search(model, src, src == 0, 3, 1.0, 0.0, 4)
    emitted = {tok for out in outs for tok in out}
    assert emitted and not {PAD, BOS, UNK} & emitted, outs
    assert EOS not in emitted


def test_search_records_no_autograd_graph():
    # every decoding step runs without gradients: a search that recorded the graph would
    # keep every step's activations alive and run slower
    from mt.config import ModelConfig
    from mt.model import build_model
    from tests.conftest import beam_nbest

    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=32, enc_layers=1, dec_layers=1, d_ff=64), 40, 40).eval()
    real, seen = model.project, []

    def project(h):
        seen.append(torch.is_grad_enabled())
        return real(h)

    model.project = project
    src = torch.randint(4, 40, (2, 5))
    greedy(model, src, src == 0, 0.0, 4)
    beam_search(model, src, src == 0, 3, 1.0, 0.0, 4)
    beam_nbest(model, src, src == 0, 3, 2, 1.0, 0.0, 4)
    assert seen and not any(seen)


class Stopped(Exception):
    pass


def test_the_per_step_hook_sees_every_step_and_can_stop_the_search():
    """on_step(step) runs after each decoder step, for greedy, beam and sampling alike; what
    it raises ends the search (how a server cancels a request)."""
    from mt.decode.sampling import Sampling
    from tests.conftest import searched

    src = torch.tensor([[4, 5, EOS], [6, EOS, 0]])
    table = torch.full((V, V), -1e9)
    table[:, 4] = 0.0  # never ends before its limit: max_len_b steps
    model = ScriptedModel(torch.log_softmax(table, -1))
    for options in ({"beam": 1}, {"beam": 3}, {"beam": 1, "sampling": Sampling(seed=1)}):
        seen = []

        searched(model, src, src == 0, max_len_a=0.0, max_len_b=6, on_step=seen.append, **options)
        assert seen == list(range(6)), options

        def stop_at_2(step, seen=seen):
            seen.append(step)
            if step == 2:
                raise Stopped

        seen.clear()
        with pytest.raises(Stopped):
            searched(model, src, src == 0, max_len_a=0.0, max_len_b=6, on_step=stop_at_2, **options)
        assert seen == [0, 1, 2]


def test_decoding_options_out_of_bounds_are_refused_naming_the_option():
    from mt.decode.options import DecodeOptions, OptionError
    from mt.decode.sampling import Sampling

    for given, field in (
        ({"beam": 0}, "beam"),
        ({"beam": 101}, "beam"),
        ({"beam": 2.5}, "beam"),
        ({"beam": 2, "nbest": 3}, "nbest"),
        ({"length_penalty": -1.0}, "length_penalty"),
        ({"length_penalty": float("nan")}, "length_penalty"),
        ({"length_penalty": float("inf")}, "length_penalty"),
        ({"max_len_b": 0}, "max_len_b"),
        ({"sampling": Sampling(temperature=0.0)}, "temperature"),
        ({"sampling": Sampling(temperature=float("inf"))}, "temperature"),
        ({"sampling": Sampling(topp=1.5)}, "topp"),
        ({"sampling": Sampling(topp=0.0)}, "topp"),
        ({"sampling": Sampling(topk=-1)}, "topk"),
        ({"sampling": Sampling(), "nbest": 2}, "nbest"),
        ({"nat_iterations": 0}, "nat_iterations"),
    ):
        with pytest.raises(OptionError) as e:
            DecodeOptions(**given)
        assert e.value.field == field and str(e.value).startswith(field), (given, str(e.value))
        assert e.value.as_flag().args[0].startswith("--" + field.replace("_", "-"))
    assert DecodeOptions(beam=100, nbest=100).nbest == 100  # the bounds themselves are fine
    assert DecodeOptions(beam=1, sampling=Sampling(topp=1.0)).greedy


def test_a_penalty_beyond_floats_ranks_as_exact_arithmetic_does():
    """logp / len ** 1000 for outputs of a few tokens is beyond a float (an OverflowError once):
    the finished hypotheses are ranked by the formula in log space, as exact fractions rank."""
    from fractions import Fraction

    from mt.decode.search import Finished

    found = [(-3.0, 4), (-5.0, 4), (-1.0, 3), (-9.0, 5), (-0.5, 1), (-2.0, 5)]
    finished = Finished(1, len(found), 6, torch.device("cpu"))
    for j, (raw, length) in enumerate(found):
        finished.raw[0, j], finished.length[0, j] = raw, length
        finished.norm[0, j] = length + 1  # (each ended by the model's own EOS)
        finished.tokens[0, j, :length] = j + 4  # (which hypothesis it is)
    finished.count[0] = len(found)
    for lp in (1.0, 500.0, 1000.0):
        exact = sorted(
            range(len(found)),
            key=lambda j: -Fraction(found[j][0]) / Fraction(found[j][1] + 1) ** int(lp),
        )
        ranked = [ids[0] - 4 for ids, _ in finished.best(len(found), lp)[0]]
        assert ranked == exact, lp
