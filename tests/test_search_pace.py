"""The one search at the pace of a GPU (ON_DEVICE: the host looks every 8 steps, finished
sentences stay frozen in the batch until then and leave it in power-of-two steps) gives the
hypotheses and scores it gives at the pace of a CPU (EVERY_STEP: finished sentences leave at
once), and reads the device at most once per look; its static cache and compiled step too."""

import math

import numpy as np
import pytest
import torch

from mt.data.batching import pad_sources
from mt.data.synthetic import generate
from mt.decode.cache import BufferPool
from mt.decode.sampling import Sampling
from mt.decode.search import ON_DEVICE, Pace, max_lengths
from mt.decode.step import CompiledStep, decoder_step
from mt.decode.translator import Translator
from mt.runtime.host_syncs import HostSyncs
from mt.tokens import EOS, PAD
from tests.conftest import beam_nbest, greedy
from tests.test_search import ScriptedModel, _table

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
