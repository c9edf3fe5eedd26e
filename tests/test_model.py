import pytest
import torch

from mt.decode.cache import DecodeCache
from mt.tokens import EOS, PAD
from tests.conftest import V, beam_search, greedy, make_model, make_src


def test_padding_does_not_change_outputs():
    """A padded batch gives each sentence the same logits as running it alone."""
    model = make_model()
    src = make_src([7, 3, 5])
    tgt = torch.randint(4, V, (3, 6))
    batched = model(src, tgt, src == PAD)
    for i, n in enumerate([7, 3, 5]):
        alone = model(src[i : i + 1, :n], tgt[i : i + 1], src[i : i + 1, :n] == PAD)
        torch.testing.assert_close(batched[i : i + 1], alone, atol=1e-5, rtol=1e-5)
    # and target padding does not change earlier target positions
    tgt_padded = torch.cat([tgt[:, :4], torch.full((3, 2), PAD)], 1)
    torch.testing.assert_close(model(src, tgt_padded, src == PAD)[:, :4], batched[:, :4])


@pytest.mark.parametrize("pre_norm,tie", [(False, "all"), (True, "none"), (False, "decoder")])
def test_cached_decoding_equals_uncached(pre_norm, tie):
    model = make_model(pre_norm, tie)
    src = make_src([6, 4, 8])
    mask = src == PAD
    memory = model.encode(src, mask)
    tgt = torch.randint(4, V, (3, 7))
    full = model.project(model.decode(tgt, memory, mask))  # (B, T, V)
    cache = DecodeCache(model.cache_layers)
    steps = [
        model.project(model.decode(tgt[:, t : t + 1], memory, mask, cache=cache, start=t))
        for t in range(tgt.shape[1])
    ]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    for b in (1, 4):  # the search loops give the same hypotheses with and without the cache
        assert beam_search(model, src, mask, b) == beam_search(model, src, mask, b, use_cache=False)
    assert greedy(model, src, mask) == greedy(model, src, mask, use_cache=False)


@torch.no_grad()
def test_reordered_cache_continues_the_selected_rows():
    """Search reorders and shrinks the cache (lazily for self-attention); the next step must
    then equal an uncached decode of exactly the selected prefixes."""
    model = make_model()
    src = make_src([6, 4, 8, 5])
    mask = src == PAD
    memory = model.encode(src, mask)
    tgt = torch.randint(4, V, (4, 4))
    cache = DecodeCache(model.cache_layers)
    for t in range(3):
        model.decode(tgt[:, t : t + 1], memory, mask, cache=cache, start=t)
    first, then = torch.tensor([2, 0, 0, 3]), torch.tensor([3, 1, 0])  # beam reorder, then drop
    cache.keep(first, first)
    cache.keep(then, then)
    rows = first[then]
    step = model.decode(tgt[rows, 3:4], memory[rows], mask[rows], cache=cache, start=3)
    full = model.decode(tgt[rows], memory[rows], mask[rows])[:, -1:]
    torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_beam_one_equals_greedy(seed, beam_of_one):
    model = make_model(seed=seed)
    src = make_src([9, 3, 6, 6, 2], seed=seed)
    mask = src == PAD
    assert beam_search(model, src, mask, beam=1) == greedy(model, src, mask)


def test_search_respects_max_length_and_batch_independence():
    model = make_model()
    src = make_src([5, 9, 3])
    mask = src == PAD
    out = beam_search(model, src, mask, beam=3, max_len_a=1.0, max_len_b=2)
    for hyp, n in zip(out, [5, 9, 3], strict=True):
        assert len(hyp) + 1 <= n + 2  # EOS included in the limit
        assert EOS not in hyp
    alone = [
        beam_search(
            model, src[i : i + 1, :n], mask[i : i + 1, :n], beam=3, max_len_a=1.0, max_len_b=2
        )[0]
        for i, n in enumerate([5, 9, 3])
    ]
    assert out == alone


def test_beam_finds_at_least_the_greedy_score():
    model = make_model(seed=3)
    src = make_src([6, 6, 6, 6], seed=5)
    mask = src == PAD

    @torch.no_grad()
    def logp(i, hyp):
        tgt = torch.tensor([[2, *hyp]])
        lp = torch.log_softmax(model(src[i : i + 1], tgt, mask[i : i + 1]), -1)[0]
        ids = [*hyp, EOS]
        return float(sum(lp[t, ids[t]] for t in range(len(ids))))

    g = greedy(model, src, mask, max_len_a=0, max_len_b=12)
    b = beam_search(model, src, mask, beam=8, length_penalty=0.0, max_len_a=0, max_len_b=12)
    for i in range(4):
        assert logp(i, b[i]) >= logp(i, g[i]) - 1e-4


@pytest.mark.parametrize("length", [40_000, 40_003, 50])
def test_block_topk_equals_topk(length):
    """Beam search's top-2K over K * V candidates per sentence goes through block maxima; it
    returns what topk returns: with the best values crowded into one block, in the ragged tail
    after the last whole block, and with rows that are mostly -inf (forced EOS)."""
    from mt.decode.search import _topk_rows

    g = torch.Generator().manual_seed(length)
    x = torch.randn(6, length, generator=g)
    x[0, 20:30] = 50.0 + torch.arange(10.0)  # all of the top 10 in one block
    x[1, -3:] = 40.0 + torch.arange(3.0)  # in the tail (when there is one)
    x[2] = -float("inf")
    x[2, 7] = 0.0
    values, index = _topk_rows(x, 10)
    expected = x.topk(10, dim=1)
    torch.testing.assert_close(values, expected.values)
    torch.testing.assert_close(x.gather(1, index), values)  # indices point at those values
    assert bool((index[:2] == expected.indices[:2]).all())


def test_tied_embeddings_share_one_matrix():
    m = make_model(tie="all")
    assert m.src_embed.weight is m.tgt_embed.weight and m.output is None
    n_all = sum(p.numel() for p in m.parameters())
    n_none = sum(p.numel() for p in make_model(tie="none").parameters())
    assert n_none - n_all == 2 * V * 32


def test_attention_weights_path_equals_sdpa_path():
    model = make_model()
    src = make_src([6, 4])
    mask = src == PAD
    memory = model.encode(src, mask)
    tgt = torch.randint(4, V, (2, 5))
    weights = []
    with_w = model.decode(tgt, memory, mask, weights=weights)
    torch.testing.assert_close(with_w, model.decode(tgt, memory, mask), atol=1e-5, rtol=1e-5)
    assert len(weights) == 2 and weights[0].shape == (2, 4, 5, 6)
    assert float(weights[0][1, :, :, 4:].detach().abs().max()) == 0.0  # padding: no attention


def test_cross_cache_per_sentence_equals_one_copy_per_hypothesis():
    """Beam search keeps the memory keys/values once per sentence; the queries of a sentence's
    K hypotheses then attend together. States and attention weights equal those computed
    with K copies of the cross cache."""
    model = make_model(seed=2)
    src = make_src([6, 4, 8])
    mask = src == PAD
    k = 3
    rows = torch.arange(3).repeat_interleave(k)
    memory = model.encode(src, mask)
    bos = torch.full((3, 1), 2)
    nxt = torch.randint(4, V, (3 * k, 1))
    outs = []
    for per_sentence in (True, False):
        cache = DecodeCache(model.cache_layers, per_sentence=per_sentence)
        model.decode(bos, memory, mask, cache=cache, start=0)
        cache.keep(rows, None)
        assert cache[0].cross.values[0].shape[0] == (3 if per_sentence else 3 * k)
        weights = []
        h = model.decode(nxt, memory[rows], mask[rows], cache=cache, start=1, weights=weights)
        outs.append((h, weights))
    (h_a, w_a), (h_b, w_b) = outs
    torch.testing.assert_close(h_a, h_b)
    for a, b in zip(w_a, w_b, strict=True):
        assert a.shape == (3 * k, 4, 1, 8)
        torch.testing.assert_close(a, b)
