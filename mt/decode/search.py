"""Batched greedy and beam search over any `Seq2Seq` model with its decoding cache.

Both loops drop finished sentences from the batch (and from the cache), so the work per step
shrinks as sentences end. Beam search with beam 1 returns exactly what greedy returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from mt.model import Seq2Seq, reorder_cache
from mt.tokens import BOS, EOS, PAD, UNK

BANNED = [PAD, BOS, UNK]


def max_lengths(
    src_pad_mask: torch.Tensor, a: float, b: int, limit: int, forced: int = 0
) -> torch.Tensor:
    """Per sentence: at most a * src_len + b output tokens (EOS included), and room for a
    forced prefix of `forced` tokens and EOS, within `limit`."""
    src_len = (~src_pad_mask).sum(1)
    return (src_len.float() * a + b).long().clamp(min=forced + 1).clamp(1, limit)


def _force_prefix(lprobs: torch.Tensor, step: int, forced: Sequence[int]) -> None:
    """While the forced prefix lasts, its token is the only choice (its log-prob kept, so
    scores stay comparable)."""
    if step < len(forced):
        keep = lprobs[:, forced[step]].clone()
        lprobs.fill_(-float("inf"))
        lprobs[:, forced[step]] = keep


def sampler(
    temperature: float = 1.0,
    topk: int = 0,
    topp: float = 1.0,
    generator: torch.Generator | None = None,
):
    """pick() for `greedy` that draws the next token: from softmax(logits / temperature),
    restricted to the `topk` most likely tokens (0: all) and to the smallest set whose
    probability reaches `topp` (nucleus sampling, Holtzman et al. 2020; 1: all)."""

    def pick(lprobs: torch.Tensor) -> torch.Tensor:
        logits = lprobs / temperature  # (N, V)
        if topk > 0:
            kth = logits.topk(min(topk, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -float("inf"))
        if topp < 1.0:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(-1)
            # drop a token when the more likely ones already reach topp (the first never)
            drop = (probs.cumsum(-1) - probs) >= topp
            logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, -float("inf")))
        return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)

    return pick


def _step_lprobs(model, tokens, memory, src_pad_mask, cache, step, uncached_prefix):
    if uncached_prefix is None:
        h = model.decode(tokens, memory, src_pad_mask, cache=cache, start=step)
    else:  # reference path: recompute the whole prefix every step
        h = model.decode(uncached_prefix, memory, src_pad_mask)[:, -1:]
    # The output layer and log-softmax run in fp32 even under autocast: bf16 logits (8 bits of
    # mantissa) make close candidates tie or swap, so GPU and CPU would pick different words.
    with torch.autocast(h.device.type, enabled=False):
        logits = model.project(h[:, -1].float())  # (N, V), a new tensor
    lprobs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: no new (N, V)
    # Never emit padding, BOS or <unk> (fairseq bans pad and bos too): an <unk> detokenizes to
    # " ⁇ " in the user's output, and the others end a sentence in nonsense.
    lprobs[:, BANNED] = -float("inf")
    return lprobs


@torch.no_grad()
def greedy(
    model: Seq2Seq,
    src: torch.Tensor,
    src_pad_mask: torch.Tensor,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    use_cache: bool = True,
    min_len: int = 0,
    pick=None,
    forced: Sequence[int] = (),
) -> list[list[int]]:
    """src: (B, S). Returns B token-id lists (without BOS/EOS). EOS is not allowed before
    `min_len` tokens (benchmarks use it to force equal output lengths). pick(lprobs (N, V))
    -> (N,) next tokens: the most likely by default (a `sampler` draws instead). forced: a
    target prefix every output starts with."""
    b = src.shape[0]
    pick = pick or (lambda lprobs: lprobs.argmax(-1))
    memory = model.encode(src, src_pad_mask)
    limits = max_lengths(src_pad_mask, max_len_a, max_len_b, model.max_positions - 1, len(forced))
    alive = torch.arange(b, device=src.device)  # original row of each live row
    out = torch.full((b, int(limits.max())), EOS, dtype=torch.long, device=src.device)
    tokens = torch.full((b, 1), BOS, dtype=torch.long, device=src.device)
    prefix = tokens
    cache = model.new_cache() if use_cache else None
    for step in range(int(limits.max())):
        lprobs = _step_lprobs(
            model, tokens, memory, src_pad_mask, cache, step, None if use_cache else prefix
        )
        if step < min_len:
            lprobs[:, EOS] = -float("inf")
        _force_eos(lprobs, step + 1 >= limits[alive])  # out of room: must end here
        _force_prefix(lprobs, step, forced)
        nxt = pick(lprobs)  # (N,)
        out[alive, step] = nxt
        going = nxt != EOS
        if not going.any():
            break
        if not going.all():  # shrink the batch
            keep = going.nonzero().squeeze(1)
            alive, nxt, memory = alive[keep], nxt[keep], memory[keep]
            src_pad_mask, prefix = src_pad_mask[keep], prefix[keep]
            if cache is not None:
                reorder_cache(cache, keep)
        tokens = nxt[:, None]
        prefix = torch.cat([prefix, tokens], dim=1)
    return [_until_eos(row) for row in out.tolist()]


def _force_eos(lprobs: torch.Tensor, rows: torch.Tensor) -> None:
    """Rows marked in the bool vector `rows` may only end: EOS gets log-prob 0, all else -inf.
    Touches those rows only (a masked fill over the whole (N, V) matrix costs a full pass)."""
    idx = rows.nonzero().squeeze(1)
    if len(idx):
        lprobs[idx] = -float("inf")
        lprobs[idx, EOS] = 0.0


def _topk_rows(x: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x.topk(m, dim=1) for long rows (beam search: K * vocabulary candidates per sentence),
    through block maxima: cut each row into blocks of about sqrt(length), and the m largest
    values lie in the m blocks with the largest maxima. A max per block and two small top-m
    make fewer passes than one top-m over the whole row on CPU (docs/performance.md). On GPU
    one topk kernel is faster than the several small ones this takes."""
    n, length = x.shape
    size = math.isqrt(length)
    blocks = length // size
    if x.is_cuda or blocks < 2 * m:
        return x.topk(m, dim=1)
    body = x[:, : blocks * size].view(n, blocks, size)
    _, best = body.amax(dim=2).topk(m, dim=1)  # (n, m) blocks
    picked = body.gather(1, best[:, :, None].expand(n, m, size)).view(n, m * size)
    values, j = torch.cat([picked, x[:, blocks * size :]], dim=1).topk(m, dim=1)
    in_body = j < m * size
    index = torch.where(
        in_body,
        best.gather(1, (j // size).clamp(max=m - 1)) * size + j % size,
        j - m * size + blocks * size,
    )
    return values, index


def _until_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS)] if EOS in ids else ids


def _drop_done(done, k: int, per_sentence: bool, cache, alive, scores, hyps, pad_mask, memory):
    """The live sentences' rows of the search state (and cache), the done ones dropped."""
    keep_sent = (~done).nonzero().squeeze(1)
    return keep_sentences(keep_sent, k, per_sentence, cache, alive, scores, hyps, pad_mask, memory)


def keep_sentences(
    keep_sent, k: int, per_sentence: bool, cache, alive, scores, hyps, pad_mask, memory
):
    """The search state (and cache) of the sentences `keep_sent` (indices among the live ones):
    (alive, scores, hyps, pad_mask, memory)."""
    keep_rows = (keep_sent[:, None] * k + torch.arange(k, device=keep_sent.device)).view(-1)
    memory = memory[keep_sent] if per_sentence else memory[keep_rows]
    if cache is not None:
        reorder_cache(cache, keep_rows, cross=keep_sent if per_sentence else True)
    return alive[keep_sent], scores[keep_sent], hyps[keep_rows], pad_mask[keep_rows], memory


def _finish(
    finished: list[list[tuple[float, list[int]]]],
    alive: torch.Tensor,
    hyps: torch.Tensor,
    top_scores: torch.Tensor,
    top_beam: torch.Tensor,
    top_tok: torch.Tensor,
    k: int,
    length_penalty: float,
) -> None:
    """Finish the EOS candidates among each sentence's top K (as fairseq does): append
    (logp / len^length_penalty, ids) to `finished` of its sentence, up to K per sentence.
    top_*: (n, 2K) candidates of the n live sentences, best first; hyps: (n * K, t) with BOS."""
    is_eos = (top_tok[:, :k] == EOS) & (top_scores[:, :k] > -float("inf"))
    rows, cols = is_eos.nonzero(as_tuple=True)
    for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
        sent = int(alive[r])
        if len(finished[sent]) < k:
            ids = hyps[int(r * k + top_beam[r, c]), 1:].tolist()
            score = float(top_scores[r, c]) / (len(ids) + 1) ** length_penalty
            finished[sent].append((score, ids))


def candidates(
    lprobs: torch.Tensor, scores: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A beam step's candidates: each of the n sentences' K hypotheses (scores (n, K)) extended
    by every token (lprobs (n * K, V), added to in place), and of those K * V the best 2K:
    their scores, the hypothesis each extends (0..K-1) and its token, (n, 2K) each, best
    first. The same step for both searches (this module's and mt/decode/device_search.py)."""
    v = lprobs.shape[-1]
    cand = lprobs.view(-1, k, v).add_(scores[:, :, None]).view(-1, k * v)  # (n, KV)
    top_scores, top_idx = _topk_rows(cand, min(2 * k, k * v))
    return top_scores, top_idx // v, top_idx % v


def _best_live(
    top_scores: torch.Tensor, top_beam: torch.Tensor, top_tok: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The best K non-EOS candidates of each sentence (there are always K among 2K): their
    scores (n, K), the rows of hyps they extend (n * K,) and their tokens (n * K, 1)."""
    n, dev = top_tok.shape[0], top_tok.device
    live_rank = torch.where(
        top_tok == EOS, float("inf"), torch.arange(top_tok.shape[1], device=dev, dtype=torch.float)
    )
    sel = live_rank.argsort(dim=1)[:, :k]  # (n, K)
    src_rows = (torch.arange(n, device=dev)[:, None] * k + top_beam.gather(1, sel)).view(-1)
    return top_scores.gather(1, sel), src_rows, top_tok.gather(1, sel).view(-1, 1)


def _first_step_lprobs(
    model, memory: torch.Tensor, src_pad_mask: torch.Tensor, cache, k: int, per_sentence: bool
) -> torch.Tensor:
    """Step 0 of a cached beam search: the K hypotheses of a sentence are all BOS, so each
    sentence is decoded once (its cross-attention keys/values computed here too) and its
    log-probabilities and self-attention cache copied to K rows; the cross-attention cache
    stays one row per sentence where the model allows (`per_sentence`). (B * K, V)"""
    b, dev = memory.shape[0], memory.device
    bos = torch.full((b, 1), BOS, dtype=torch.long, device=dev)
    lprobs = _step_lprobs(model, bos, memory, src_pad_mask, cache, 0, None)
    reorder_cache(cache, torch.arange(b, device=dev).repeat_interleave(k), cross=not per_sentence)
    return lprobs.repeat_interleave(k, 0)


def _sentences_done(finished: list[list], alive: torch.Tensor, k: int) -> torch.Tensor:
    """(n,) bool: which live sentences have K finished hypotheses."""
    return torch.tensor([len(finished[s]) >= k for s in alive.tolist()], device=alive.device)


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_pad_mask: torch.Tensor,
    beam: int,
    length_penalty: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    use_cache: bool = True,
    min_len: int = 0,
    forced: Sequence[int] = (),
) -> list[list[int]]:
    """The best hypothesis of each sentence (token ids without BOS/EOS); see beam_nbest."""
    return [
        hyps[0][0] if hyps else []
        for hyps in beam_nbest(
            model,
            src,
            src_pad_mask,
            beam,
            1,
            length_penalty,
            max_len_a,
            max_len_b,
            use_cache,
            min_len,
            forced,
        )
    ]


@torch.no_grad()
def _constrain(
    lprobs: torch.Tensor, step: int, min_len: int, at_limit: torch.Tensor, forced: Sequence[int]
) -> None:
    """In place: no EOS before `min_len` tokens, EOS only in the rows at their length limit,
    and the forced prefix while it lasts."""
    if step < min_len:
        lprobs[:, EOS] = -float("inf")
    _force_eos(lprobs, at_limit)
    _force_prefix(lprobs, step, forced)


def _beam_start(b: int, k: int, dev: torch.device):
    """(scores (B, K): one live hypothesis per sentence at first, hyps (B*K, 1): BOS, the
    rows of the sentences still searched)."""
    scores = torch.full((b, k), -float("inf"), device=dev)
    scores[:, 0] = 0.0
    hyps = torch.full((b * k, 1), BOS, dtype=torch.long, device=dev)
    return scores, hyps, torch.arange(b, device=dev)


@torch.no_grad()
def beam_nbest(
    model: Seq2Seq,
    src: torch.Tensor,
    src_pad_mask: torch.Tensor,
    beam: int,
    nbest: int,
    length_penalty: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    use_cache: bool = True,
    min_len: int = 0,
    forced: Sequence[int] = (),
) -> list[list[tuple[list[int], float]]]:
    """Of each step's top 2*beam extensions, those ending in EOS among the top `beam` finish
    (score logp / len^length_penalty, len counting EOS), the best `beam` others stay live; a
    sentence leaves at `beam` finished or its limit. Each: `nbest` (ids, score), best first."""
    b, k, dev = src.shape[0], beam, src.device
    memory_once = model.encode(src, src_pad_mask)  # (B, S, D)
    # a cross-attention cache of one row per sentence, shared by its K hypotheses' queries
    per_sentence = use_cache and model.cross_cache_per_sentence
    memory = memory_once if per_sentence else memory_once.repeat_interleave(k, 0)
    pad_mask = src_pad_mask.repeat_interleave(k, 0)
    limits = max_lengths(src_pad_mask, max_len_a, max_len_b, model.max_positions - 1, len(forced))
    scores, hyps, alive = _beam_start(b, k, dev)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]  # (score, ids)
    cache = model.new_cache() if use_cache else None
    for step in range(int(limits.max())):
        if step == 0 and use_cache:
            lprobs = _first_step_lprobs(model, memory_once, src_pad_mask, cache, k, per_sentence)
        else:
            prefix = None if use_cache else hyps
            lprobs = _step_lprobs(model, hyps[:, -1:], memory, pad_mask, cache, step, prefix)
        _constrain(lprobs, step, min_len, (step + 1 >= limits[alive]).repeat_interleave(k), forced)
        top_scores, top_beam, top_tok = candidates(lprobs, scores, k)
        _finish(finished, alive, hyps, top_scores, top_beam, top_tok, k, length_penalty)
        scores, src_rows, new_tok = _best_live(top_scores, top_beam, top_tok, k)
        hyps = torch.cat([hyps.index_select(0, src_rows), new_tok], dim=1)
        done = _sentences_done(finished, alive, k) | (step + 1 >= limits[alive])
        if done.all():
            break
        if cache is not None:
            reorder_cache(cache, src_rows, cross=False)
        if done.any():  # shrink the batch
            alive, scores, hyps, pad_mask, memory = _drop_done(
                done, k, per_sentence, cache, alive, scores, hyps, pad_mask, memory
            )
    return [[(ids, s) for s, ids in sorted(f, key=lambda x: -x[0])[:nbest]] for f in finished]
