"""The search, in one place: beam search against a scripted model whose log-probabilities are
known (the hypothesis it returns is the best one by logp / len^length_penalty, found by
enumerating every output); the one search at the pace of a GPU (ON_DEVICE: the host looks every
8 steps, finished sentences stay frozen in the batch until then and leave it in power-of-two
steps), which gives the hypotheses and scores it gives at the pace of a CPU (EVERY_STEP), and
reads the device at most once per look, its static cache and compiled step too; and what users
do with a trained model: n-best lists, sampling, ensembles, a forced prefix, through the Python
API and `mt translate`."""

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mt import Sampling, Translator
from mt.artifacts import checkpoint
from mt.data.batching import pad_sources
from mt.data.synthetic import generate
from mt.decode.cache import BufferPool, DecodeCache
from mt.decode.ensemble import Ensemble
from mt.decode.sampling import sampler
from mt.decode.search import ON_DEVICE, Pace, max_lengths
from mt.decode.step import CompiledStep, decoder_step
from mt.runtime.host_syncs import HostSyncs
from mt.tokens import BOS, EOS, PAD
from tests.conftest import (
    V,
    assert_user_error,
    beam_nbest,
    beam_search,
    greedy,
    make_model,
    make_src,
    run_mt,
)

# -- beam search against a scripted model ----------------------------------------------

SCRIPTED_V = 7  # the scripted model's vocabulary: PAD, UNK, BOS, EOS and three words
WORDS = [4, 5, 6]


class ScriptedModel(torch.nn.Module):
    """The next token's log-probabilities depend on the last token only: table[last]. The
    search's interface without a network: states are one-hot last tokens, `project` looks
    the row up."""

    cross_cache_per_sentence = False
    max_positions = 64

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table  # (SCRIPTED_V, SCRIPTED_V) log-probabilities

    def encode(self, src, src_pad_mask):
        return torch.zeros(src.shape[0], src.shape[1], 1)

    cache_layers = 1

    def decode(self, tgt_in, memory, src_pad_mask, cache=None, start=0, weights=None):
        return F.one_hot(tgt_in, SCRIPTED_V).float()  # (B, T, SCRIPTED_V)

    def project(self, h):
        return h @ self.table


def _table(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.full((SCRIPTED_V, SCRIPTED_V), -1e9)  # PAD, UNK, BOS: never
    for row in range(SCRIPTED_V):
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
    table = torch.full((SCRIPTED_V, SCRIPTED_V), -1e9)
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
    table = torch.full((SCRIPTED_V, SCRIPTED_V), -1e9)
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


# -- the search at a GPU's pace gives what it gives at a CPU's ----------------------------

CHECK_EVERY = ON_DEVICE.check_every


def beam_nbest_on_device(*args, **kw):
    return beam_nbest(*args, pace=ON_DEVICE, **kw)


class _Static:
    """A stand-in for CompiledStep that runs `step_fn` (default: the eager step) over a
    static cache whose buffers come from `pool`."""

    def __init__(self, step_fn=decoder_step, pool=None):
        self.step_fn, self.pool = step_fn, pool or BufferPool()

    def __call__(self, *args):
        return self.step_fn(*args)


def _same(a, b, tol=1e-5):
    """The same hypotheses in the same order, scores within `tol` (a batch whose size differs
    rounds a matrix product differently in its last bit)."""
    assert [[ids for ids, _ in s] for s in a] == [[ids for ids, _ in s] for s in b]
    for sa, sb in zip(a, b, strict=True):
        for (_, x), (_, y) in zip(sa, sb, strict=True):
            assert x is y is None or abs(x - y) <= tol * max(1.0, abs(x)), (x, y)


@pytest.mark.parametrize("beam", [1, 2, 3, 5, 10])
def test_the_scripted_model_gets_the_same_nbest_lists(beam):
    src = torch.tensor([[4, 5, EOS, PAD], [6, 4, 5, EOS], [5, EOS, PAD, PAD]])
    for seed in range(6):
        model = ScriptedModel(_table(seed))
        for lp, nbest in ((1.0, 1), (0.6, beam), (2.0, min(2, beam))):
            args = (model, src, src == PAD, beam, nbest, lp, 1.0, 4)
            assert beam_nbest_on_device(*args) == beam_nbest(*args), (seed, lp)
            prefix = {"forced": [5, 4]}
            assert beam_nbest_on_device(*args, **prefix) == beam_nbest(*args, **prefix)


def _batch(translator, n=40, seed=1):
    lines, _ = generate(n, seed=seed)
    ids = translator.source_ids(lines)
    src = pad_sources([np.asarray(x, dtype=np.int64) for x in ids])
    return src, src == PAD


@pytest.mark.parametrize("beam", [1, 2, 5, 10])
def test_a_trained_model_gets_the_same_hypotheses(tiny_run, beam):
    t = Translator.load(tiny_run, "cpu")
    src, mask = _batch(t)
    for nbest, kw in ((1, {}), (beam, {}), (1, {"use_cache": False}), (1, {"forced": [5]})):
        args = (t.model, src, mask, beam, nbest, 1.0, 1.5, 5)
        _same(beam_nbest_on_device(*args, **kw), beam_nbest(*args, **kw))


def test_an_ensemble_gets_the_same_hypotheses(tiny_run):
    t = Translator.load([tiny_run / "step_30.pt", tiny_run / "step_60.pt"], "cpu")
    src, mask = _batch(t, 24, seed=2)
    args = (t.model, src, mask, 4, 2, 1.0, 1.5, 5)
    _same(beam_nbest_on_device(*args), beam_nbest(*args))
    assert t.model.static_cache  # its members' caches, side by side, static too
    _same(beam_nbest_on_device(*args, compiled=_Static()), beam_nbest(*args))


def test_the_host_reads_the_search_at_most_once_per_8_steps(tiny_run):
    """Counted as mt/runtime/host_syncs counts them: before the loop one read of the longest
    allowed output, in the loop one per check, after it four reads of the results."""
    t = Translator.load(tiny_run, "cpu")
    src, mask = _batch(t, 60, seed=3)
    steps = int(max_lengths(mask, 1.5, 5, t.model.max_positions - 1).max())
    for beam in (1, 5):
        with HostSyncs() as syncs:
            beam_nbest_on_device(t.model, src, mask, beam, 1, 1.0, 1.5, 5)
        assert syncs.count <= 1 + math.ceil(steps / CHECK_EVERY) + 4, syncs.where
        with HostSyncs() as before:
            beam_nbest(t.model, src, mask, beam, 1, 1.0, 1.5, 5)
        assert before.count > 2 * syncs.count  # what the bookkeeping on the device saves


def test_translate_gives_the_same_translations_with_either_search(tiny_run):
    lines, _ = generate(30, seed=4)
    lines[3] = ""
    host = Translator.load(tiny_run, "cpu")
    assert not host.searches_on_device  # auto on a CPU: the batch-shrinking search
    device = Translator(
        host.model, host.tokenizer, host.cfg.model_copy(update={"device_search": "always"}),
        host.device,
    )  # fmt: skip
    assert device.searches_on_device
    for beam in (1, 4):
        assert device.translate(lines, beam=beam) == host.translate(lines, beam=beam)
    a, b = device.translate_nbest(lines, 3, beam=4), host.translate_nbest(lines, 3, beam=4)
    assert [[x for x, _ in s] for s in a] == [[x for x, _ in s] for s in b]


def test_done_sentences_leave_the_batch_in_power_of_two_steps():
    bucketed_keep = Pace(check_every=8, buckets=True).keep

    assert bucketed_keep([True] * 5) == []
    assert bucketed_keep([False] * 6) == list(range(6))  # nothing to drop below 8
    # 3 searched: a batch of 4, the first done sentence kept frozen beside them
    assert bucketed_keep([True, False, True, True, False, True, False]) == [0, 1, 4, 6]
    assert bucketed_keep([True, True, False, True]) == [2]
    assert bucketed_keep([False, True, True, True, False, True, True, True, True]) == [0, 4]
    assert bucketed_keep([False] * 5 + [True] * 4) == list(range(8))
    # the GPU's pace stops at 8 sentences (a batch of one would be a compiled shape of its own)
    assert ON_DEVICE.keep([True, True, False, True]) == [0, 1, 2, 3]
    assert ON_DEVICE.keep([True] * 12 + [False]) == [*range(7), 12]
    assert ON_DEVICE.keep([False] * 9 + [True] * 7) == list(range(16))


def test_the_batch_shapes_of_a_search_are_few(tiny_run):
    """Sentences of many lengths: the decoder meets only power-of-two batches of sentences."""
    t = Translator.load(tiny_run, "cpu")
    src, mask = _batch(t, 37, seed=5)
    rows, real_decode = [], t.model.decode

    def decode(tgt_in, *a, **kw):
        rows.append(tgt_in.shape[0])
        return real_decode(tgt_in, *a, **kw)

    t.model.decode = decode
    try:
        got = beam_nbest_on_device(t.model, src, mask, 4, 1, 1.0, 1.5, 5)
    finally:
        t.model.decode = real_decode
    _same(got, beam_nbest(t.model, src, mask, 4, 1, 1.0, 1.5, 5))
    sentences = {r // 4 for r in rows[1:]}  # after the first step: 4 hypotheses a sentence
    assert sentences <= {37, 32, 16, 8, 4, 2, 1}, sentences


def test_a_minimum_length_holds_as_in_the_batch_shrinking_search(tiny_run):
    t = Translator.load(tiny_run, "cpu")
    src, mask = _batch(t, 12, seed=6)
    for beam in (1, 3):
        args = (t.model, src, mask, beam, 1, 1.0, 1.5, 5)
        got = beam_nbest_on_device(*args, min_len=6)
        _same(got, beam_nbest(*args, min_len=6))
        assert all(len(s[0][0]) >= 5 for s in got)  # 6 tokens with EOS


@pytest.mark.parametrize("arch", ["rnn", "decoder_only"])
def test_models_with_a_cross_cache_per_hypothesis_get_the_same_hypotheses(arch):
    """An RNN and a decoder-only model keep their cache one row per hypothesis: dropping done
    sentences must select those rows too (sources of different lengths end at different
    steps, so the batch shrinks at the checks)."""
    from mt.config import ModelConfig
    from mt.model import build_model
    from tests.conftest import make_src

    torch.manual_seed(0)
    model = build_model(
        ModelConfig(arch=arch, d_model=32, n_heads=4, enc_layers=1, dec_layers=2, d_ff=64,
                    dropout=0.0),
        40,
        40,
    ).eval()  # fmt: skip
    assert not model.cross_cache_per_sentence
    src = make_src([3, 9, 5, 14, 7, 2, 11, 6, 4, 12])
    for beam in (1, 3):
        args = (model, src, src == PAD, beam, 1, 1.0, 1.5, 2)
        _same(beam_nbest_on_device(*args), beam_nbest(*args))


def test_greedy_on_the_device_is_greedy_and_samples_by_its_seed(tiny_run):
    t = Translator.load(tiny_run, "cpu")
    src, mask = _batch(t, 50, seed=8)
    for kw in ({}, {"forced": [5]}, {"use_cache": False}, {"min_len": 6}):
        assert greedy(t.model, src, mask, 1.5, 5, pace=ON_DEVICE, **kw) == greedy(
            t.model, src, mask, 1.5, 5, **kw
        )
    with HostSyncs() as syncs:
        greedy(t.model, src, mask, 1.5, 5, pace=ON_DEVICE)
    steps = int(max_lengths(mask, 1.5, 5, t.model.max_positions - 1).max())
    assert syncs.count <= 1 + math.ceil(steps / CHECK_EVERY) + 1, syncs.where

    def sampled(seed):
        g = torch.Generator().manual_seed(seed)
        return greedy(
            t.model, src, mask, 1.5, 5, pace=ON_DEVICE, sampling=Sampling(2.0), generator=g
        )

    assert sampled(3) == sampled(3) and sampled(3) != sampled(4)
    device = Translator(
        t.model, t.tokenizer, t.cfg.model_copy(update={"device_search": "always"}), t.device
    )
    lines, _ = generate(10, seed=9)
    once = device.translate(lines, sampling=Sampling(temperature=2.0, seed=5))
    assert once == device.translate(lines, sampling=Sampling(temperature=2.0, seed=5))
    greedy_lines = device.translate(lines, sampling=Sampling(topk=1, seed=1))
    assert greedy_lines == t.translate(lines, beam=1)  # top-1 sampling is greedy search


# -- the static cache and the compiled decoder step --------------------------------------------


@pytest.mark.parametrize("beam", [1, 2, 5, 10])
def test_a_static_cache_gets_the_same_hypotheses(tiny_run, beam):
    """Keys and values written in place into preallocated buffers, attention masked to the
    positions written: what the growing cache gives (scores within a float's rounding: the
    masked keys add zeros to the sums)."""
    t = Translator.load(tiny_run, "cpu")
    src, mask = _batch(t, 30, seed=7)
    for nbest, kw in ((1, {}), (beam, {}), (1, {"forced": [5]}), (1, {"min_len": 4})):
        args = (t.model, src, mask, beam, nbest, 1.0, 1.5, 5)
        _same(beam_nbest_on_device(*args, compiled=_Static(), **kw), beam_nbest(*args, **kw))
    static_greedy = greedy(t.model, src, mask, pace=ON_DEVICE, compiled=_Static())
    assert static_greedy == greedy(t.model, src, mask)


class _Recorder:
    """A step function that records, at every call, the rows of the batch and where each
    layer's static buffers live, then runs the real step."""

    def __init__(self, step_fn):
        self.step_fn, self.calls = step_fn, []

    def __call__(self, model, tokens, memory, pad_mask, cache, position):
        where = tuple(layer.self.k.data_ptr() for layer in cache)
        self.calls.append((tokens.shape[0], where, int(position)))
        return self.step_fn(model, tokens, memory, pad_mask, cache, position)


def test_the_static_buffers_stay_in_place_while_the_batch_keeps_its_shape(tiny_run):
    """What a CUDA graph needs: at every step of one batch shape the same buffers, the step's
    position a tensor that advances (so one graph serves every step)."""
    t = Translator.load(tiny_run, "cpu")
    src, mask = _batch(t, 37, seed=5)
    rec = _Recorder(decoder_step)
    beam_nbest_on_device(t.model, src, mask, 4, 1, 1.0, 1.5, 5, compiled=_Static(rec))
    assert [p for _, _, p in rec.calls] == list(range(1, len(rec.calls) + 1))
    by_rows: dict = {}
    for rows, where, _ in rec.calls:
        by_rows.setdefault(rows, set()).add(where)
    assert len(by_rows) >= 2  # sentences left the batch: more than one shape
    assert all(len(places) == 1 for places in by_rows.values()), by_rows
    # greedy too: its step 0 runs eagerly and takes the buffers (no allocation in a graph)
    rec.calls.clear()
    greedy(t.model, src, mask, pace=ON_DEVICE, compiled=_Static(rec))
    assert [p for _, _, p in rec.calls] == list(range(1, len(rec.calls) + 1))


def test_the_compiled_step_is_one_graph_for_every_step_and_gives_the_same_hypotheses(tiny_run):
    """torch.compile (aot_eager here, CUDA graphs on a GPU) of the decoder step, fullgraph:
    no graph break, and the graphs counted are per batch shape at most, never per step."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    t = Translator.load(tiny_run, "cpu")
    src, mask = _batch(t, 37, seed=5)
    torch._dynamo.reset()
    counters.clear()
    rec = _Recorder(CompiledStep(t.device, backend="aot_eager"))
    args = (t.model, src, mask, 4, 2, 1.0, 1.5, 5)
    _same(beam_nbest_on_device(*args, compiled=_Static(rec)), beam_nbest(*args))
    shapes = {rows for rows, _, _ in rec.calls}
    steps = len(rec.calls)
    graphs = counters["stats"]["unique_graphs"]
    assert steps > 3 * len(shapes) and 1 <= graphs <= min(2, len(shapes)), (graphs, shapes)
    assert not counters["graph_break"]


def test_translate_with_the_compiled_step_gives_the_same_translations(tiny_run):
    lines, _ = generate(25, seed=8)
    host = Translator.load(tiny_run, "cpu")
    update = {"device_search": "always", "compile_step": "always"}
    device = Translator(host.model, host.tokenizer, host.cfg.model_copy(update=update), host.device)
    assert device.compiles_step
    device._compiled = CompiledStep(device.device, backend="aot_eager")  # inductor: slow here
    for beam in (1, 4):
        assert device.translate(lines, beam=beam) == host.translate(lines, beam=beam)
    auto = host.cfg.model_copy(update={"device_search": "always"})
    assert not Translator(host.model, host.tokenizer, auto, host.device).compiles_step  # a CPU


def test_the_host_reads_a_static_search_no_more_often(tiny_run):
    t = Translator.load(tiny_run, "cpu")
    src, mask = _batch(t, 60, seed=3)
    steps = int(max_lengths(mask, 1.5, 5, t.model.max_positions - 1).max())
    with HostSyncs() as syncs:
        beam_nbest_on_device(t.model, src, mask, 5, 1, 1.0, 1.5, 5, compiled=_Static())
    assert syncs.count <= 1 + math.ceil(steps / CHECK_EVERY) + 4, syncs.where


def test_batches_of_one_shape_share_their_buffers_and_graphs(tiny_run):
    """A translator keeps its static buffers from batch to batch (a CUDA graph replays only on
    the buffers it was recorded with): the second batch of a shape writes into the first's,
    compiles nothing new, and what the first left there does not leak into its hypotheses."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    t = Translator.load(tiny_run, "cpu")
    pool = BufferPool()
    torch._dynamo.reset()
    counters.clear()
    rec = _Recorder(CompiledStep(t.device, backend="aot_eager"))
    places, graphs = [], []
    for seed in (11, 12):
        src, mask = _batch(t, 16, seed=seed)
        args = (t.model, src, mask, 3, 1, 1.0, 1.5, 5)
        rec.calls.clear()
        _same(beam_nbest_on_device(*args, compiled=_Static(rec, pool)), beam_nbest(*args))
        places.append({(rows, where) for rows, where, _ in rec.calls})
        graphs.append(counters["stats"]["unique_graphs"])
    shared = {rows for rows, _ in places[0]} & {rows for rows, _ in places[1]}
    assert shared  # the two batches met a shape in common
    for rows in shared:
        assert {w for r, w in places[0] if r == rows} == {w for r, w in places[1] if r == rows}
    assert graphs[1] == graphs[0]  # the second batch compiled nothing new


def test_a_compiled_step_that_fails_falls_back_to_the_eager_step_once(tiny_run):
    calls, said = [], []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("no graph for you\nsecond line")

    t = Translator.load(tiny_run, "cpu")
    step = CompiledStep(t.device, backend="aot_eager", warn=said.append)
    step.fn = broken
    src, mask = _batch(t, 12, seed=9)
    args = (t.model, src, mask, 3, 1, 1.0, 1.5, 5)
    _same(beam_nbest_on_device(*args, compiled=step), beam_nbest(*args))
    assert len(calls) == 1 and len(said) == 1 and "no graph for you" in said[0]
    assert "second line" not in said[0]

    with pytest.raises(AttributeError):  # the eager step's own errors are not swallowed
        step(t.model, None, None, None, None, None)


def test_the_hosts_count_of_decoding_steps_is_the_searchs():
    """decoding_steps (what a compile and a server's admission weigh before the search) gives
    max_lengths' limit for every source length, with and without a forced prefix."""
    from mt.decode.options import DecodeOptions
    from mt.decode.search import decoding_steps

    opts = DecodeOptions(beam=4, max_len_a=1.5, max_len_b=10)
    for n in range(0, 300, 7):
        for forced in (0, 30, 400):
            mask = torch.zeros(1, n + 1, dtype=torch.bool)  # n subwords and EOS
            want = int(max_lengths(mask, 1.5, 10, 255, forced)[0])
            assert decoding_steps(n, opts, forced, 255) == want, (n, forced)


# -- what users do with the search: n-best, sampling, ensembles, a prefix ---------------


def test_nbest_first_is_the_beam_output_and_scores_are_sorted():
    model = make_model()
    src = make_src([7, 4, 9, 5])
    for beam in (2, 5):
        best = beam_search(model, src, src == 0, beam, 1.0)
        lists = beam_nbest(model, src, src == 0, beam, beam, 1.0)
        assert [hyps[0][0] for hyps in lists] == best
        for hyps in lists:
            assert 1 <= len(hyps) <= beam
            scores = [s for _, s in hyps]
            assert scores == sorted(scores, reverse=True)
            assert len({tuple(ids) for ids, _ in hyps}) == len(hyps)  # distinct


def test_sampling_with_top_k_one_or_a_tiny_nucleus_is_greedy():
    model = make_model()
    src = make_src([7, 4, 9, 5])
    expected = greedy(model, src, src == 0)
    g = torch.Generator().manual_seed(0)
    assert greedy(model, src, src == 0, sampling=Sampling(topk=1), generator=g) == expected
    assert greedy(model, src, src == 0, sampling=Sampling(topp=1e-6), generator=g) == expected
    assert (
        greedy(model, src, src == 0, sampling=Sampling(temperature=1e-4), generator=g) == expected
    )


def test_sampler_draws_from_the_renormalised_top_k_and_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    lprobs = probs.log().expand(20000, 4).contiguous()
    g = torch.Generator().manual_seed(1)
    drawn = sampler(topk=2, generator=g)(lprobs)
    freq = torch.bincount(drawn, minlength=4).float() / len(drawn)
    assert freq[2] == freq[3] == 0
    assert abs(float(freq[0]) - 0.5 / 0.8) < 0.02
    drawn = sampler(topp=0.9, generator=g)(lprobs)  # 0.5 + 0.3 + 0.15 >= 0.9
    freq = torch.bincount(drawn, minlength=4).float() / len(drawn)
    assert freq[3] == 0 and abs(float(freq[2]) - 0.15 / 0.95) < 0.02
    hot = sampler(temperature=0.5, generator=g)(lprobs)  # sharper: p^2 renormalised
    freq = torch.bincount(hot, minlength=4).float() / len(hot)
    assert abs(float(freq[0]) - 0.25 / (0.25 + 0.09 + 0.0225 + 0.0025)) < 0.02


def test_an_ensemble_of_one_is_the_model_and_of_two_copies_too():
    model = make_model()
    src = make_src([7, 4, 9, 5])
    for ens in (Ensemble([model]), Ensemble([model, make_model()])):
        ens.eval()
        assert greedy(ens, src, src == 0) == greedy(model, src, src == 0)
        assert beam_search(ens, src, src == 0, 4, 1.0) == beam_search(model, src, src == 0, 4, 1.0)
        for (a, sa), (b, sb) in zip(
            beam_nbest(ens, src, src == 0, 3, 3)[0],
            beam_nbest(model, src, src == 0, 3, 3)[0],
            strict=True,
        ):
            assert a == b and abs(sa - sb) < 1e-5


def test_an_ensemble_of_two_different_models_averages_their_log_probabilities():
    a, b = make_model(seed=0), make_model(seed=1)
    ens = Ensemble([a, b]).eval()
    src = make_src([6, 3])
    tgt = torch.randint(4, V, (2, 4))
    with torch.no_grad():
        h = ens.decode(tgt, ens.encode(src, src == 0), src == 0)
        mean = (
            torch.log_softmax(a(src, tgt, src == 0), -1)
            + torch.log_softmax(b(src, tgt, src == 0), -1)
        ) / 2
        torch.testing.assert_close(ens.project(h), mean, rtol=1e-5, atol=1e-5)


def test_api_nbest_sampling_prefix_and_ensemble_on_a_trained_run(tiny_run):
    t = Translator.load(tiny_run, "cpu")
    src, _ = generate(12, seed=3)
    lines = [*src[:6], "", *src[6:]]
    best = t.translate(lines, beam=4)
    nbest = t.translate_nbest(lines, 3, beam=4)
    assert [hyps[0][0] if hyps else "" for hyps in nbest] == best
    assert nbest[6] == [] and all(len(h) == 3 for i, h in enumerate(nbest) if i != 6)
    seeded = t.translate(lines, sampling=Sampling(temperature=1.5, seed=7))
    assert seeded == t.translate(lines, sampling=Sampling(temperature=1.5, seed=7))
    assert t.translate(lines, sampling=Sampling(topk=1, seed=1)) == t.translate(lines, beam=1)
    first = best[0].split()[0]
    prefixed = t.translate(lines, beam=4, prefix=first + " " + first)
    assert all(p.startswith(f"{first} {first}") for i, p in enumerate(prefixed) if i != 6)
    ensemble = Translator.load([tiny_run, tiny_run / "last.pt"], "cpu")
    assert len(ensemble.translate(lines, beam=4)) == len(lines)


def test_translate_cli_nbest_sampling_ensemble_and_bad_flags(tiny_run, tmp_path):
    src, _ = generate(5, seed=4)
    (tmp_path / "in").write_text("\n".join(src) + "\n")
    proc = run_mt("translate", tiny_run, "-i", tmp_path / "in", "--nbest", "3", "--beam", "4")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [int(r[0]) for r in rows] == [i for i in range(5) for _ in range(3)]
    for i in range(5):
        scores = [float(r[1]) for r in rows if int(r[0]) == i]
        assert scores == sorted(scores, reverse=True)
    single = run_mt("translate", tiny_run, "-i", tmp_path / "in", "--beam", "4").stdout.splitlines()
    assert [r[2] for r in rows[::3]] == single
    pair = run_mt("translate", tiny_run, tiny_run, "-i", tmp_path / "in", "--beam", "4")
    assert pair.returncode == 0 and pair.stdout.splitlines() == single
    assert "ensemble of 2 models" in pair.stderr
    sampled = run_mt(
        "translate", tiny_run, "-i", tmp_path / "in", "--sample", "--seed", "3", "--topp", "0.8"
    )
    assert sampled.returncode == 0 and len(sampled.stdout.splitlines()) == 5
    assert_user_error(
        run_mt("translate", tiny_run, "--nbest", "9", "--beam", "2", input="a\n"), "--nbest 9"
    )
    assert_user_error(run_mt("translate", tiny_run, "--topk", "3", input="a\n"), "--sample only")
    assert_user_error(
        run_mt("translate", tiny_run, "--sample", "--beam", "3", input="a\n"), "leave out --beam"
    )
    assert_user_error(
        run_mt("translate", tiny_run, "--sample", "--topp", "0", input="a\n"), "--topp"
    )


def test_an_ensemble_needs_one_tokenizer(tiny_run, tmp_path):
    ckpt = checkpoint.load(tiny_run / "last.pt")
    ckpt["spm"]["src"] = ckpt["spm"]["src"].clone()
    ckpt["spm"]["src"][-1] ^= 1  # another BPE model
    checkpoint.atomic_save(ckpt, tmp_path / "other.pt")
    assert_user_error(
        run_mt("translate", tiny_run, tmp_path / "other.pt", input="a\n"),
        "another BPE model",
        "share one tokenizer",
    )


def test_attention_labels_show_words_not_sentencepiece_marks():
    from mt.decode.alignment import readable_pieces

    assert readable_pieces(["\u2581Ein", "\u2581Hund", "e", "\u2581", "</s>"]) == [
        "Ein",
        "Hund",
        "##e",
        "\u2423",
        "</s>",
    ]


def test_overlong_input_is_truncated_with_warning_and_keeps_line_count(tiny_run):
    long_line = " ".join(["lo ka mi"] * 200)  # > max_positions subwords
    proc = run_mt("translate", tiny_run, "--greedy", input=f"mi\n{long_line}\n\ntu\n")
    assert proc.returncode == 0, proc.stderr
    assert "1 input line(s) longer than" in proc.stderr and "truncated" in proc.stderr
    assert len(proc.stdout.split("\n")[:-1]) == 4


def test_sampling_seeds_decide_the_draws_from_the_cli(tiny_run, tmp_path):
    """The same --seed gives the same samples, another seed (or none) other samples: a fixed
    seed in place of the user's would fail here."""
    src, _ = generate(20, seed=5)
    (tmp_path / "in").write_text("\n".join(src) + "\n")

    def sample(*seed):
        flags = ("--sample", "--temperature", "3", *seed)
        proc = run_mt("translate", tiny_run, "-i", tmp_path / "in", *flags)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    three = sample("--seed", "3")
    assert three == sample("--seed", "3")
    assert len({three, sample("--seed", "4"), sample("--seed", "0")}) == 3
    assert sample() != sample()


def test_an_ensemble_of_two_real_checkpoints_decodes_with_the_mean_log_probability(tiny_run):
    """Two snapshots of a trained run: the ensemble's greedy output equals a greedy search
    written out here, each step the argmax of the mean of the members' log-probabilities from
    a full forward pass (no cache), and its n-best scores are that mean's sums."""
    from mt.artifacts import checkpoint
    from mt.tokens import BOS, EOS

    paths = [tiny_run / "step_30.pt", tiny_run / "step_60.pt"]
    members = [checkpoint.open_trained(p).model.eval() for p in paths]
    ens = Translator.load(paths, "cpu")
    src_lines, _ = generate(8, seed=11)
    got = ens.search(src_lines, beam=1)
    for line, (ids, ((out, _),)) in zip(src_lines, got, strict=True):
        src = torch.tensor([[*ids, EOS]])
        tgt = [BOS]
        with torch.no_grad():
            limit = int((len(ids) + 1) * 1.5 + 5)  # tiny.yaml's max_len_a, max_len_b
            while len(tgt) - 1 < limit:
                lp = sum(
                    torch.log_softmax(m(src, torch.tensor([tgt]), src == 0)[0, -1].float(), -1)
                    for m in members
                ) / len(members)
                nxt = int(lp.argmax())
                if nxt == EOS:
                    break
                tgt.append(nxt)
        assert list(out) == tgt[1:], line
        # each step's distribution, decoded with the cache as the search does, is the mean
        model, memory_mask = ens.model, src == 0
        with torch.no_grad():
            memory, cache = model.encode(src, memory_mask), DecodeCache(model.cache_layers)
            for t in range(len(tgt)):
                h = model.decode(torch.tensor([tgt[t : t + 1]]), memory, memory_mask, cache, t)
                mean = sum(
                    torch.log_softmax(m(src, torch.tensor([tgt[: t + 1]]), memory_mask), -1)
                    for m in members
                )[0, -1] / len(members)
                torch.testing.assert_close(model.project(h[:, -1])[0], mean, atol=1e-5, rtol=0)
    single = [Translator.load(p, "cpu").translate(src_lines, beam=1) for p in paths]
    assert single[0] != single[1]  # the members differ, so the mean is not one of them
