"""Beam search whose bookkeeping stays on the device: the host looks at the search every
`check_every` steps, not at every step and never per sentence.

mt/decode/search.py's beam search asks the host at every step which candidates ended (a
`nonzero`, a Python loop over them, the finished lists) and which sentences are done: on a GPU
each of those waits for the device, so the step's launches never run ahead of its arithmetic.
Here a step is tensor operations only:

- finished hypotheses go into preallocated (B, K) scores and lengths and (B, K, max_len)
  tokens, each sentence's next free slot computed from a running count (finishing is the same
  rule: the EOS candidates among a sentence's top K, until it has K);
- a sentence that is done stays in the batch, frozen (it finishes nothing more), until the
  next check, where one read of the done flags ends the search or drops done sentences, down
  to a power-of-two batch (bucketed_keep: few shapes for a compiled or captured step);
- the scores are length-normalised on the host at the end, as search.py does, so both return
  the same hypotheses with the same scores.

The decoder step and its cache are the model's, as in search.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from mt.decode.search import (
    _beam_start,
    _best_live,
    _first_step_lprobs,
    _force_prefix,
    _step_lprobs,
    _until_eos,
    candidates,
    keep_sentences,
    max_lengths,
)
from mt.model import Seq2Seq, reorder_cache
from mt.model.cache import BufferPool, make_static
from mt.tokens import BOS, EOS

CHECK_EVERY = 8  # steps between the host's looks at the search (one sync each)
ROOM = 32  # a static cache's positions: the longest output rounded up to a multiple of this


def decoder_step(model, tokens, memory, pad_mask, cache, step):
    """One cached decoder step: the next token's log-probabilities (N, V) after `tokens`
    (N, 1) at position `step` (a (1,) tensor with a static cache). With a static cache every
    call of a search sees the same shapes and addresses between its checks, so this is the
    function a search compiles and captures (`step_fn`)."""
    return _step_lprobs(model, tokens, memory, pad_mask, cache, step, None)


def compiled_step(device: torch.device, backend: str | None = None):
    """decoder_step under torch.compile, one graph without breaks: on a GPU with CUDA graphs
    (mode reduce-overhead), so a step is one replay instead of a few hundred launches. The
    first batch shape compiles a static graph; a second makes Dynamo compile one for dynamic
    batch sizes, and each size then records its own CUDA graph. backend: another backend
    (tests use aot_eager on the CPU)."""
    if backend is not None:
        return torch.compile(decoder_step, fullgraph=True, backend=backend)
    mode = "reduce-overhead" if device.type == "cuda" else None
    return torch.compile(decoder_step, fullgraph=True, mode=mode)


def with_fallback(
    step_fn: Callable[..., torch.Tensor], warn: Callable[[str], None]
) -> Callable[..., torch.Tensor]:
    """`step_fn` (a compiled decoder step) until it fails, then decoder_step itself, said once
    through warn(message): a compiler or a GPU that cannot take the graph makes decoding
    slower, never impossible. The failed step is run again eagerly (its cache write at the
    same position is the same write)."""
    state = {"fn": step_fn}

    def step(*args: object) -> torch.Tensor:
        try:
            return state["fn"](*args)
        except Exception as e:  # Dynamo's, Inductor's and CUDA graphs' errors alike
            if state["fn"] is decoder_step:
                raise
            warn(
                f"warning: the compiled decoder step failed ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}); decoding without it "
                f"(decode.compile_step: never skips the attempt)"
            )
            state["fn"] = decoder_step
            return decoder_step(*args)

    return step


class StaticSteps:
    """The static cache's position, one (1,) tensor the search advances in place, and the
    step function it calls: `decoder_step` itself, or a compiled one (torch.compile with CUDA
    graphs on a GPU: one graph per batch shape, replayed at every step of that shape)."""

    def __init__(self, model, cache, steps: int, dev: torch.device, step_fn=None, pool=None):
        self.position = torch.zeros(1, dtype=torch.long, device=dev)
        # room for the longest output, rounded up so that batches of similar lengths share
        # their buffers' shapes (and their CUDA graphs)
        room = min(-(-steps // ROOM) * ROOM, model.max_positions)
        make_static(cache, room, self.position, pool)
        self.step_fn = step_fn or decoder_step

    def __call__(self, model, tokens, memory, pad_mask, cache, step: int):
        self.position.fill_(step)
        # a contiguous (N, 1): beam search's last column of a growing tensor changes its
        # strides every step, and a compiled graph would be specialised to each
        tokens = tokens.contiguous()
        return self.step_fn(model, tokens, memory, pad_mask, cache, self.position)


def _constrain(
    lprobs: torch.Tensor, step: int, min_len: int, at_limit: torch.Tensor, forced: Sequence[int]
) -> torch.Tensor:
    """search.py's constraints without reading a value on the host: no EOS before `min_len`
    tokens, only EOS in the rows at their length limit (at_limit (N,) bool: a select over all
    rows, where search.py finds those rows with `nonzero`), the forced prefix while it lasts.
    Returns the constrained (N, V)."""
    if step < min_len:
        lprobs[:, EOS] = -float("inf")
    eos_only = torch.full_like(lprobs[:1], -float("inf"))
    eos_only[:, EOS] = 0.0
    lprobs = torch.where(at_limit[:, None], eos_only, lprobs)
    _force_prefix(lprobs, step, forced)
    return lprobs


class Finished:
    """Each sentence's finished hypotheses, on the device: raw scores (B, K), lengths (B, K)
    and tokens (B, K, max_len), filled in the order search.py appends them; slot K of each
    sentence takes the writes that are not kept (so no write needs a host-side index)."""

    def __init__(self, b: int, k: int, max_len: int, dev: torch.device):
        self.k = k
        self.raw = torch.full((b, k + 1), -float("inf"), device=dev)
        self.length = torch.zeros((b, k + 1), dtype=torch.long, device=dev)
        self.tokens = torch.zeros((b, k + 1, max(max_len, 1)), dtype=torch.long, device=dev)
        self.count = torch.zeros(b, dtype=torch.long, device=dev)

    def add(self, step, alive, frozen, hyps, top_scores, top_beam, top_tok) -> None:
        """The EOS candidates among each live sentence's top K (best first), up to K per
        sentence; `frozen` (n,) sentences add nothing. hyps: (n * K, step + 1), BOS first."""
        k = self.k
        n = alive.shape[0]
        is_eos = (top_tok[:, :k] == EOS) & (top_scores[:, :k] > -float("inf")) & ~frozen[:, None]
        slot = self.count[alive][:, None] + is_eos.long().cumsum(1) - 1  # (n, K)
        keep = is_eos & (slot < k)
        slot = torch.where(keep, slot, k)  # the spare slot
        sent = alive[:, None].expand(n, k)
        self.raw[sent, slot] = top_scores[:, :k]
        self.length[sent, slot] = step
        if step:
            rows = torch.arange(n, device=alive.device)[:, None] * k + top_beam[:, :k]
            self.tokens[sent, slot, :step] = hyps[rows.reshape(-1), 1:].view(n, k, step)
        self.count.index_add_(0, alive, keep.sum(1))

    def best(self, nbest: int, length_penalty: float) -> list[list[tuple[list[int], float]]]:
        """Per sentence its `nbest` (ids, score), best first: four reads of the device."""
        raw, length = self.raw.tolist(), self.length.tolist()
        tokens, count = self.tokens.tolist(), self.count.tolist()
        out = []
        for s, n in enumerate(count):
            found = [
                (raw[s][j] / (length[s][j] + 1) ** length_penalty, tokens[s][j][: length[s][j]])
                for j in range(n)
            ]
            found.sort(key=lambda x: -x[0])  # stable: as search.py's sorted()
            out.append([(ids, score) for score, ids in found[:nbest]])
        return out


@torch.no_grad()
def beam_nbest_on_device(
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
    check_every: int = CHECK_EVERY,
    static: bool | BufferPool = False,
    step_fn=None,
) -> list[list[tuple[list[int], float]]]:
    """search.beam_nbest's results (the same rule: of each step's top 2K extensions, the EOS
    ones among the top K finish, the best K others stay live), with the host reading the
    search once every `check_every` steps (see the module's docstring). static: the
    self-attention cache preallocated and written in place (where model.static_cache; a
    BufferPool: its buffers, kept for the next search), each step after the first through
    `step_fn` (default: decoder_step; a compiled one on a GPU)."""
    b, k, dev = src.shape[0], beam, src.device
    memory_once = model.encode(src, src_pad_mask)  # (B, S, D)
    per_sentence = use_cache and model.cross_cache_per_sentence
    memory = memory_once if per_sentence else memory_once.repeat_interleave(k, 0)
    pad_mask = src_pad_mask.repeat_interleave(k, 0)
    limits = max_lengths(src_pad_mask, max_len_a, max_len_b, model.max_positions - 1, len(forced))
    steps = int(limits.max())
    scores, hyps, alive = _beam_start(b, k, dev)
    finished = Finished(b, k, steps, dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)  # (n,): frozen until the next check
    cache = model.new_cache() if use_cache else None
    stepper = _stepper(model, cache, steps, dev, static, step_fn)
    for step in range(steps):
        if step == 0 and use_cache:
            lprobs = _first_step_lprobs(model, memory_once, src_pad_mask, cache, k, per_sentence)
        elif stepper is not None:
            lprobs = stepper(model, hyps[:, -1:], memory, pad_mask, cache, step)
        else:
            prefix = None if use_cache else hyps
            lprobs = _step_lprobs(model, hyps[:, -1:], memory, pad_mask, cache, step, prefix)
        at_limit = (step + 1 >= limits[alive]).repeat_interleave(k)
        lprobs = _constrain(lprobs, step, min_len, at_limit, forced)
        top_scores, top_beam, top_tok = candidates(lprobs, scores, k)
        finished.add(step, alive, done, hyps, top_scores, top_beam, top_tok)
        scores, src_rows, new_tok = _best_live(top_scores, top_beam, top_tok, k)
        hyps = torch.cat([hyps.index_select(0, src_rows), new_tok], dim=1)
        done = (finished.count[alive] >= k) | (step + 1 >= limits[alive])
        last = step + 1 == steps
        if cache is not None and not last:
            reorder_cache(cache, src_rows, cross=False)
        if last or (step + 1) % check_every:
            continue
        flags = done.tolist()  # the one read of the check
        keep = bucketed_keep(flags)
        if not keep:
            break
        if len(keep) < len(flags):  # drop done sentences, down to a bucket size
            kept = torch.tensor(keep, device=dev)
            alive, scores, hyps, pad_mask, memory = keep_sentences(
                kept, k, per_sentence, cache, alive, scores, hyps, pad_mask, memory
            )
            done = done[kept]
    return finished.best(nbest, length_penalty)


def _stepper(model, cache, steps: int, dev, static, step_fn) -> StaticSteps | None:
    """The static cache's stepper where asked for (static: True, or a BufferPool to take the
    buffers from) and the model takes one, else None."""
    if static is False or cache is None or not getattr(model, "static_cache", False):
        return None
    return StaticSteps(model, cache, steps, dev, step_fn, None if static is True else static)


def bucketed_keep(done: list[bool]) -> list[int]:
    """The rows to keep at a check: every sentence still searched, and as many done ones
    (frozen) as fill the batch up to the next power of two, so that a GPU meets only a few
    batch shapes (each one compiled or captured once) rather than one per count; [] when all
    are done. In order, so that the kept rows stay sorted."""
    live = [i for i, d in enumerate(done) if not d]
    if not live:
        return []
    size = min(len(done), 1 << (len(live) - 1).bit_length())
    filler = [i for i, d in enumerate(done) if d][: size - len(live)]
    return sorted(live + filler)


@torch.no_grad()
def greedy_on_device(
    model: Seq2Seq,
    src: torch.Tensor,
    src_pad_mask: torch.Tensor,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    use_cache: bool = True,
    min_len: int = 0,
    pick=None,
    forced: Sequence[int] = (),
    check_every: int = CHECK_EVERY,
    static: bool | BufferPool = False,
    step_fn=None,
) -> list[list[int]]:
    """search.greedy's outputs (pick: argmax, or a `sampler` that draws) with the host reading
    the search once every `check_every` steps: a sentence that ended keeps its place, frozen
    (its later tokens are not written), until a check drops the ended ones down to a
    power-of-two batch. A sampler draws for the frozen rows too, so its draws differ from
    search.greedy's for the same seed (as they differ between a CPU and a GPU anyway).
    static, step_fn: as for beam_nbest_on_device."""
    b, dev = src.shape[0], src.device
    pick = pick or (lambda lprobs: lprobs.argmax(-1))
    memory = model.encode(src, src_pad_mask)
    limits = max_lengths(src_pad_mask, max_len_a, max_len_b, model.max_positions - 1, len(forced))
    steps = int(limits.max())
    out = torch.full((b, steps), EOS, dtype=torch.long, device=dev)
    alive = torch.arange(b, device=dev)
    ended = torch.zeros(b, dtype=torch.bool, device=dev)  # (n,)
    tokens = prefix = torch.full((b, 1), BOS, dtype=torch.long, device=dev)
    cache = model.new_cache() if use_cache else None
    stepper = _stepper(model, cache, steps, dev, static, step_fn)
    for step in range(steps):
        if stepper is not None:
            lprobs = stepper(model, tokens, memory, src_pad_mask, cache, step)
        else:
            lprobs = _step_lprobs(
                model, tokens, memory, src_pad_mask, cache, step, None if use_cache else prefix
            )
        lprobs = _constrain(lprobs, step, min_len, step + 1 >= limits[alive], forced)
        nxt = torch.where(ended, EOS, pick(lprobs))  # (n,)
        out[alive, step] = nxt
        ended = ended | (nxt == EOS)
        tokens = nxt[:, None]
        if not use_cache:
            prefix = torch.cat([prefix, tokens], dim=1)
        if step + 1 == steps or (step + 1) % check_every:
            continue
        keep = bucketed_keep(ended.tolist())  # the one read of the check
        if not keep:
            break
        if len(keep) < len(ended):
            k = torch.tensor(keep, device=dev)
            alive, ended, tokens, prefix = alive[k], ended[k], tokens[k], prefix[k]
            memory, src_pad_mask = memory[k], src_pad_mask[k]
            if cache is not None:
                reorder_cache(cache, k)
    return [_until_eos(row) for row in out.tolist()]
