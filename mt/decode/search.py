"""The search: one batched loop over decoder steps for beam search, greedy search and sampling
(Mask-Predict, which fills whole targets at once, keeps its own loop: mask_predict.py).

At each step the decoder gives every live hypothesis its next token's log-probabilities, the
constraints apply (length limits, a forced prefix), and a rule extends the hypotheses: `Beam`
keeps the best K of each sentence's K x V extensions and finishes those that end, `Pick` takes
one token per sentence (the most likely: greedy search, which beam 1 is; or a draw: sampling).
The rule's bookkeeping stays on the device: finished hypotheses go into preallocated tensors.

The host looks at the search as often as its `Pace` says: at every step on a CPU, where a look
costs nothing and dropping each finished sentence at once saves work; every few steps on a GPU,
where each look waits for the device, so a finished sentence stays in the batch, frozen, until
the next look drops it, down to a power-of-two batch (few shapes for a compiled step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mt.decode.options import DecodeOptions
from mt.decode.step import CompiledStep, Decoder
from mt.model import Seq2Seq
from mt.tokens import BOS, EOS

# one line's outputs: [(token ids, score; None from a Pick rule), ...], best first
Found = list[tuple[list[int], float | None]]


@dataclass(frozen=True)
class Pace:
    """How often the host looks at the search (one sync each) and how the batch shrinks."""

    check_every: int = 1  # steps between looks
    buckets: bool = False  # keep frozen sentences to fill a power-of-two batch
    smallest: int = 1  # with buckets: the fewest sentences a batch shrinks to

    def keep(self, done: list[bool]) -> list[int]:
        """The sentences kept at a look: every one still searched, and with buckets as many
        done ones (frozen) as fill the batch up to the next power of two, and to `smallest`;
        [] when all are done. In order, so that the kept rows stay sorted."""
        live = [i for i, d in enumerate(done) if not d]
        if not live or not self.buckets:
            return live
        size = min(len(done), max(self.smallest, 1 << (len(live) - 1).bit_length()))
        filler = [i for i, d in enumerate(done) if d][: size - len(live)]
        return sorted(live + filler)


EVERY_STEP = Pace()
# (a batch of one sentence would be a shape of its own to a compiled step: size 1 broadcasts)
ON_DEVICE = Pace(check_every=8, buckets=True, smallest=8)


def max_lengths(
    src_pad_mask: torch.Tensor, a: float, b: int, limit: int, forced: int = 0
) -> torch.Tensor:
    """Per sentence: at most a * src_len + b output tokens (EOS included), and room for a
    forced prefix of `forced` tokens and EOS, within `limit`."""
    src_len = (~src_pad_mask).sum(1)
    return (src_len.float() * a + b).long().clamp(min=forced + 1).clamp(1, limit)


def decoding_steps(n: int, opts: DecodeOptions, forced: int, max_steps: int) -> int:
    """max_lengths for one source of n subwords, on the host: the most decoder steps the search
    may take for it (what a compile or a server's admission weighs before the search)."""
    return min(max(int(opts.max_len_a * (n + 1) + opts.max_len_b), forced + 1), max_steps)


@torch.no_grad()
def search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_pad_mask: torch.Tensor,
    opts: DecodeOptions,
    forced: Sequence[int] = (),
    generator: torch.Generator | None = None,
    pace: Pace = EVERY_STEP,
    compiled: CompiledStep | None = None,
    on_step: Callable[[int], None] | None = None,
    banned: int | None = None,
) -> list[Found]:
    """src: (B, S) ids. Per sentence its outputs (ids without BOS/EOS, score), best first:
    `opts.nbest` of a beam, one of a Pick. forced: a prefix every output starts with; compiled:
    a step over a static cache; on_step(step) after each step (it may raise); banned: an id."""
    memory = model.encode(src, src_pad_mask)  # (B, S, D)
    limits = max_lengths(
        src_pad_mask, opts.max_len_a, opts.max_len_b, model.max_positions - 1, len(forced)
    )
    steps = int(limits.max())
    rule = _rule(opts, src.shape[0], steps, src.device, generator)
    k = rule.k
    per_sentence = k > 1 and opts.use_cache and model.cross_cache_per_sentence
    decoder = Decoder(model, steps, opts.use_cache, per_sentence, compiled, src.device)
    live = Live(memory, src_pad_mask, limits, k, per_sentence)
    for step in range(steps):
        if step == 0 and k > 1 and opts.use_cache:
            lprobs = decoder.first(memory, src_pad_mask, k)
        else:
            lprobs = decoder(rule.hyps, live.memory, live.pad_mask, step)
        at_limit = live.at_limit(step)  # (n,)
        rows_at_limit = at_limit.repeat_interleave(k) if k > 1 else at_limit
        lprobs = _constrain(lprobs, step, opts.min_len, rows_at_limit, forced, pace, banned)
        rows = rule.advance(step, lprobs, live.alive, live.done, at_limit)
        if on_step is not None:
            on_step(step)
        live.done = rule.done(live.alive) | at_limit
        if step + 1 == steps:
            break
        if rows is not None and decoder.cache is not None:
            decoder.cache.reorder_beams(rows)
        if (step + 1) % pace.check_every:
            continue
        keep = pace.keep(live.done.tolist())  # the look: one read of the device
        if not keep:
            break
        if len(keep) < live.alive.shape[0]:  # drop done sentences
            kept = torch.tensor(keep, device=src.device)
            rule.keep(kept, live.keep(kept, decoder.cache))
    return rule.results(opts.nbest, opts.length_penalty)


class Live:
    """The rows of the sentences still in the batch: their original index (`alive`), memory,
    padding mask, and which are done (frozen until the host's next look)."""

    def __init__(self, memory, src_pad_mask, limits, k: int, per_sentence: bool):
        b, dev = memory.shape[0], memory.device
        self.k, self.per_sentence, self.limits = k, per_sentence, limits
        # (copies, not repeat_interleave's views: a compiled step guards a view's base, which
        # the rows kept at a look no longer have)
        rows = torch.arange(b, device=dev).repeat_interleave(k)
        self.memory = memory if per_sentence or k == 1 else memory[rows]
        self.pad_mask = src_pad_mask if k == 1 else src_pad_mask[rows]
        self.alive = torch.arange(b, device=dev)  # (n,)
        self.done = torch.zeros(b, dtype=torch.bool, device=dev)  # (n,)

    def at_limit(self, step: int) -> torch.Tensor:
        """(n,) bool: the sentences whose next token is the last they may have."""
        return step + 1 >= self.limits[self.alive]

    def keep(self, kept: torch.Tensor, cache) -> torch.Tensor:
        """Keep the sentences `kept` (indices among the live ones), their cache rows too;
        returns their hypothesis rows."""
        rows = (kept[:, None] * self.k + torch.arange(self.k, device=kept.device)).view(-1)
        self.memory = self.memory[kept] if self.per_sentence else self.memory[rows]
        self.pad_mask, self.alive, self.done = (
            self.pad_mask[rows],
            self.alive[kept],
            self.done[kept],
        )
        if cache is not None:
            cache.keep(rows, kept)
        return rows


def _constrain(
    lprobs, step: int, min_len: int, at_limit, forced: Sequence[int], pace: Pace, banned=None
):
    """No EOS before `min_len` tokens, only EOS in the rows at their length limit (at_limit
    (N,) bool), the forced prefix while it lasts (its token the only choice, its log-prob kept
    so that scores stay comparable), never the id `banned`. Returns the constrained (N, V)."""
    if banned is not None:
        lprobs[:, banned].fill_(-float("inf"))  # (a fill: no number copied from the host)
    if step < min_len:
        lprobs[:, EOS].fill_(-float("inf"))  # (a fill: no number copied from the host)
    if pace.check_every == 1:  # the host looks anyway: touch the rows at their limit only
        idx = at_limit.nonzero().squeeze(1)
        if len(idx):
            lprobs[idx] = -float("inf")
            lprobs[idx, EOS] = 0.0
    else:  # a select over all rows, without a read of the device
        eos_only = torch.full_like(lprobs[:1], -float("inf"))
        eos_only[:, EOS].fill_(0.0)
        lprobs = torch.where(at_limit[:, None], eos_only, lprobs)
    if step < len(forced):
        keep = lprobs[:, forced[step]].clone()
        lprobs.fill_(-float("inf"))
        lprobs[:, forced[step]] = keep
    return lprobs


def _rule(opts: DecodeOptions, b: int, steps: int, dev, generator) -> Beam | Pick:
    if not opts.greedy:
        return Beam(b, opts.beam, steps, dev)
    return Pick(b, steps, dev, None if opts.sampling is None else opts.sampling.pick(generator))


class Pick:
    """One token per sentence and step: the most likely (greedy search), or `pick(lprobs)`'s
    (a sampler's draw). A sentence that ended stays frozen until the host drops it: its later
    tokens are not written (a sampler still draws for it, so the draws depend on the pace)."""

    k = 1

    def __init__(self, b: int, steps: int, dev, pick=None):
        self.pick = pick or (lambda lprobs: lprobs.argmax(-1))
        self.out = torch.full((b, steps), EOS, dtype=torch.long, device=dev)
        self.hyps = torch.full((b, 1), BOS, dtype=torch.long, device=dev)  # (n, t + 1)
        self.ended = torch.zeros(b, dtype=torch.bool, device=dev)

    def advance(self, step: int, lprobs, alive, frozen, cut) -> None:  # (cut: Beam's)
        nxt = torch.where(self.ended, EOS, self.pick(lprobs))  # (n,)
        self.out[alive, step] = nxt
        self.ended = self.ended | (nxt == EOS)
        self.hyps = torch.cat([self.hyps, nxt[:, None]], dim=1)

    def done(self, alive) -> torch.Tensor:
        return self.ended

    def keep(self, kept, rows) -> None:
        self.hyps, self.ended = self.hyps[rows], self.ended[kept]

    def results(self, nbest: int, length_penalty: float) -> list[Found]:
        return [[(_until_eos(row), None)] for row in self.out.tolist()]


def _until_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS)] if EOS in ids else ids


class Beam:
    """Beam search with K hypotheses per sentence: of each step's top 2K extensions, those
    ending in EOS among the top K finish (as fairseq does; score logp / len^length_penalty,
    len counting EOS where the model produced it: a hypothesis cut at the length limit counts
    its tokens alone, as CTranslate2 does), the best K others stay live; a sentence is done at
    K finished or at its length limit."""

    def __init__(self, b: int, k: int, steps: int, dev):
        self.k = k
        self.scores = torch.full((b, k), -float("inf"), device=dev)  # (n, K)
        self.scores[:, 0].fill_(0.0)  # one live hypothesis per sentence at first
        self.hyps = torch.full((b * k, 1), BOS, dtype=torch.long, device=dev)  # (n * K, t + 1)
        self.finished = Finished(b, k, steps, dev)

    def advance(self, step: int, lprobs, alive, frozen, cut) -> torch.Tensor:
        """Returns the rows of hyps the new hypotheses extend (the cache follows them). cut:
        (n,) the sentences at their length limit, whose EOS is forced, not produced."""
        top_scores, top_beam, top_tok = candidates(lprobs, self.scores, self.k)
        self.finished.add(step, alive, frozen, cut, self.hyps, top_scores, top_beam, top_tok)
        self.scores, rows, new_tok = _best_live(top_scores, top_beam, top_tok, self.k)
        self.hyps = torch.cat([self.hyps.index_select(0, rows), new_tok], dim=1)
        return rows

    def done(self, alive) -> torch.Tensor:
        return self.finished.count[alive] >= self.k

    def keep(self, kept, rows) -> None:
        self.scores, self.hyps = self.scores[kept], self.hyps[rows]

    def results(self, nbest: int, length_penalty: float) -> list[Found]:
        return self.finished.best(nbest, length_penalty)


def candidates(
    lprobs: torch.Tensor, scores: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A beam step's candidates: each of the n sentences' K hypotheses (scores (n, K)) extended
    by every token (lprobs (n * K, V), added to in place), and of those K * V the best 2K:
    their scores, the hypothesis each extends (0..K-1) and its token, (n, 2K) each, best
    first."""
    v = lprobs.shape[-1]
    cand = lprobs.view(-1, k, v).add_(scores[:, :, None]).view(-1, k * v)  # (n, KV)
    top_scores, top_idx = _topk_rows(cand, min(2 * k, k * v))
    return top_scores, top_idx // v, top_idx % v


def _topk_rows(x: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x.topk(m, dim=1) for long rows (K * vocabulary candidates per sentence), through block
    maxima: cut each row into blocks of about sqrt(length), and the m largest values lie in the
    m blocks with the largest maxima. A max per block and two small top-m make fewer passes
    than one top-m over the whole row on CPU (docs/performance.md). On GPU one topk kernel is
    faster than the several small ones this takes."""
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


class Finished:
    """Each sentence's finished hypotheses, on the device: raw scores (B, K), lengths (B, K)
    and the lengths their scores are normalised by (B, K: the tokens, and EOS where it was
    produced, not forced at the length limit), and tokens (B, K, max_len), filled best
    candidate first; slot K of each sentence takes the writes that are not kept (so no write
    needs a host-side index)."""

    def __init__(self, b: int, k: int, max_len: int, dev: torch.device):
        self.k = k
        self.raw = torch.full((b, k + 1), -float("inf"), device=dev)
        self.length = torch.zeros((b, k + 1), dtype=torch.long, device=dev)
        self.norm = torch.ones((b, k + 1), dtype=torch.long, device=dev)
        self.tokens = torch.zeros((b, k + 1, max(max_len, 1)), dtype=torch.long, device=dev)
        self.count = torch.zeros(b, dtype=torch.long, device=dev)

    def add(self, step, alive, frozen, cut, hyps, top_scores, top_beam, top_tok) -> None:
        """The EOS candidates among each live sentence's top K (best first), up to K per
        sentence; `frozen` (n,) sentences add nothing; `cut` (n,) sentences end at their
        length limit (their EOS forced). hyps: (n * K, step + 1), BOS first."""
        k = self.k
        n = alive.shape[0]
        is_eos = (top_tok[:, :k] == EOS) & (top_scores[:, :k] > -float("inf")) & ~frozen[:, None]
        slot = self.count[alive][:, None] + is_eos.long().cumsum(1) - 1  # (n, K)
        keep = is_eos & (slot < k)
        slot = torch.where(keep, slot, k)  # the spare slot
        sent = alive[:, None].expand(n, k)
        self.raw[sent, slot] = top_scores[:, :k]
        self.length[sent, slot] = step
        self.norm[sent, slot] = (step + 1 - cut.long()).clamp(min=1)[:, None].expand(n, k)
        if step:
            rows = torch.arange(n, device=alive.device)[:, None] * k + top_beam[:, :k]
            self.tokens[sent, slot, :step] = hyps[rows.reshape(-1), 1:].view(n, k, step)
        self.count.index_add_(0, alive, keep.sum(1))

    def best(self, nbest: int, length_penalty: float) -> list[Found]:
        """Per sentence its `nbest` (ids, score), best first: five reads of the device. The
        scores are length-normalised here, on the host."""
        raw, length, norm = self.raw.tolist(), self.length.tolist(), self.norm.tolist()
        tokens, count = self.tokens.tolist(), self.count.tolist()
        out: list[Found] = []
        for s, n in enumerate(count):
            found = [
                (
                    *normalised_score(raw[s][j], norm[s][j], length_penalty),
                    tokens[s][j][: length[s][j]],
                )
                for j in range(n)
            ]
            found.sort(key=lambda x: (-x[0], x[1]))  # stable: equal scores keep their order
            out.append([(ids, score) for score, _, ids in found[:nbest]])
        return out


def normalised_score(raw: float, length: int, length_penalty: float) -> tuple[float, float]:
    """(raw / length ** length_penalty, the log of its magnitude): where the power is beyond a
    float (a penalty of 1000 on 3 tokens) the score underflows to 0 and the log, computed in
    log space, still ranks the hypotheses (smaller: better)."""
    log = math.log(-raw) - length_penalty * math.log(length) if raw < 0 else -math.inf
    try:
        return raw / length**length_penalty, log
    except OverflowError:
        return -0.0, log
