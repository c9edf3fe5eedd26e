"""Dynamic batching: requests that arrive together are decoded together, by one worker thread,
so the event loop keeps answering while the model works.

A request waits in a bounded queue (a full queue is refused at once, never piled up). The worker
takes the oldest request, then every queued request with the same decoding settings, up to a
token budget, waiting at most `max_wait` for more to arrive, and decodes them as one call of
the translator. Requests with other settings wait for their turn in arrival order. A sampled
request with a seed is never merged with another: its draws are then those of `mt translate
--seed` on its sentences alone.

A batch that fails is decoded again one request (chunk) at a time, so that only the request
at fault gets the error. `decode` is handed a `stopped()` that says when every request of its
batch has gone (timed out, or its client left), or when the batch reaches its oldest request's
deadline: it stops there, at its next decoder step, and the worker is free for the others. A
request that joined the batch later ends with it (TimedOut; the oldest with
asyncio.TimeoutError, as at its own timeout), so that a client's timeout is the
longest any batch holds the worker, whatever was merged into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

# decode(jobs' sentences concatenated, their shared settings, stopped) -> one result per
# sentence; stopped(): True once nobody waits for the batch any more (decode may raise Stopped)
Decode = Callable[[list[str], Any, Callable[[], bool]], list[Any]]


class QueueFull(Exception):
    """The queue holds as many requests as it may."""


class Stopped(Exception):
    """Raised by a decode whose batch nobody waits for any more."""


class TimedOut(Exception):
    """A request's answer when its batch was stopped at an older request's deadline."""


class _Request:
    """One request: its future, and its chunks' results as they come."""

    def __init__(
        self, n_chunks: int, loop: asyncio.AbstractEventLoop, timing: dict, deadline: float
    ) -> None:
        self.loop, self.future, self.timing = loop, loop.create_future(), timing
        self.deadline = deadline  # (monotonic) when its client stops waiting
        self.results: list[list[Any] | None] = [None] * n_chunks
        self.remaining = n_chunks
        self.turns = 0  # batches that took a chunk of it

    def done(self) -> bool:
        return self.future.done()

    def chunk_done(self, index: int, results: list[Any]) -> bool:
        """Store a chunk's results (worker thread); True when it was the last one."""
        self.results[index] = results
        self.remaining -= 1
        return self.remaining == 0

    def settle(self, error: BaseException | None = None) -> None:
        """Answer the request (from the worker thread, through its event loop)."""

        def set_() -> None:
            if self.future.done():  # it timed out meanwhile
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result([r for part in self.results for r in part or []])

        with contextlib.suppress(RuntimeError):  # a closed event loop: nobody waits for it
            self.loop.call_soon_threadsafe(set_)


@dataclass
class _Job:
    """A request's chunk: at most a batch's token budget of its sentences."""

    key: Hashable
    sentences: list[str]
    settings: Any
    tokens: int
    request: _Request
    index: int
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """Collects requests into batches for one worker thread that calls `decode`.

    max_tokens: the source tokens one batch may hold; a request larger than that is decoded
    in chunks of at most that, one chunk per batch, so that the requests after it are not held
    until it is all done; max_wait: seconds the worker waits for more requests with the oldest
    one's settings once it has it; max_queue: requests waiting at most; batching False decodes
    every request alone, whole (batches of one request), for comparison; timeout: the seconds
    a request waits for its answer at most (None: no limit), which also ends its batch."""

    def __init__(
        self,
        decode: Decode,
        max_tokens: int = 4000,
        max_wait: float = 0.005,
        max_queue: int = 256,
        batching: bool = True,
        on_batch: Callable[[int, float], None] | None = None,
        timeout: float | None = None,
    ) -> None:
        self.decode, self.max_tokens, self.max_wait = decode, max_tokens, max_wait
        self.timeout = math.inf if timeout is None else timeout
        # (sentences, seconds) after each batch, one stopped part-way included: the metrics
        self.on_batch = on_batch
        self.max_queue, self.batching = max_queue, batching
        self._jobs: list[_Job] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._unique = itertools.count()
        self.batches = 0  # decode calls made, for the statistics of /health
        self.decoded = 0  # requests answered
        self.busy_since: float | None = None  # when the decode under way began (monotonic)
        self._thread = threading.Thread(target=self._work, name="mt-decode", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Requests queued or part-way decoded."""
        with self._cond:
            return self._waiting_locked()

    def busy_for(self) -> float:
        """Seconds the decode under way has taken so far (0 when idle)."""
        since = self.busy_since
        return 0.0 if since is None else time.monotonic() - since

    def submit(
        self,
        sentences: list[str],
        settings: Hashable,
        tokens: list[int],
        alone: bool = False,
        timing: dict | None = None,
    ) -> asyncio.Future[list[Any]]:
        """Queue a request (from the event loop); its future gets one result per sentence, in
        order, or the exception `decode` raised. tokens: each sentence's source tokens (an
        estimate will do). alone: never merged with another request nor cut into chunks (a
        seeded sample then draws what `mt translate --seed` draws for the same lines).
        timing: a dict whose "decode_seconds" the worker adds the request's batches' decoding
        time to, and its "decoding_since" the start of the batch decoding it now (see
        `decode_seconds`)."""
        loop = asyncio.get_running_loop()
        whole = alone or not self.batching
        key = (settings, next(self._unique)) if whole else settings
        chunks = (
            [(sentences, sum(tokens))] if whole else _chunks(sentences, tokens, self.max_tokens)
        )
        deadline = time.monotonic() + self.timeout
        request = _Request(len(chunks), loop, timing if timing is not None else {}, deadline)
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if self._waiting_locked() >= self.max_queue:
                raise QueueFull(f"{self._waiting_locked()} requests are already waiting")
            for i, (part, n) in enumerate(chunks):
                self._jobs.append(_Job(key, part, settings, n, request, i))
            self._cond.notify()
        return request.future

    def _waiting_locked(self) -> int:
        return len({id(job.request) for job in self._jobs})

    def close(self, timeout: float | None = None) -> None:
        """Stop taking requests, finish the queued ones, and end the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    # -- the worker thread --------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run(batch)

    def _run(self, batch: list[_Job]) -> None:
        """Decode a batch and answer its requests; a batch of several that fails is decoded
        again one job at a time (the error is the answer of the one at fault alone). The
        batch stops when nobody waits for it, or at its oldest request's deadline."""
        live = [job for job in batch if not job.request.done()]  # timed out or left: skip
        if not live:
            return
        sentences = [s for job in live for s in job.sentences]
        deadline = min(job.request.deadline for job in live)

        def stopped() -> bool:
            return _all_done(live) or time.monotonic() >= deadline

        self.busy_since = started = time.monotonic()
        for job in live:
            job.request.timing["decoding_since"] = started
        try:
            results = self.decode(sentences, live[0].settings, stopped)
        except Stopped:  # the work it did until then still counts
            self._decoded(live, len(sentences), started)
            now = time.monotonic()
            for job in live:  # (a request answered or gone meanwhile is left as it is)
                job.request.settle(
                    error=asyncio.TimeoutError()  # its own deadline
                    if now >= job.request.deadline
                    else TimedOut("its batch reached an older request's timeout")
                )
            return
        except BaseException as e:  # the error is a request's answer, not the worker's end
            self._decoded(live, 0, started)
            if len(live) == 1:
                live[0].request.settle(error=e)
            else:
                for job in live:
                    self._run([job])
            return
        finally:
            self.busy_since = None
        self.batches += 1
        self._decoded(live, len(sentences), started)
        start = 0
        for job in live:
            if job.request.chunk_done(job.index, results[start : start + len(job.sentences)]):
                self.decoded += 1
                job.request.settle()
            start += len(job.sentences)

    def _decoded(self, jobs: list[_Job], sentences: int, started: float) -> None:
        """A batch's decoding time: each request's share (its timing), and the metrics'."""
        seconds = time.monotonic() - started
        for job in jobs:
            timing = job.request.timing
            timing["decode_seconds"] = timing.get("decode_seconds", 0.0) + seconds
            timing.pop("decoding_since", None)
        if sentences and self.on_batch is not None:
            self.on_batch(sentences, seconds)

    def _next_batch(self) -> list[_Job] | None:
        with self._cond:
            while not self._jobs:
                if self._stopping:
                    return None
                self._cond.wait()
            # the oldest job of the requests served least so far: a chunked request's rest
            # takes turns with the requests that came after it (each waits for one chunk of
            # it, not for all of them)
            first = min(self._jobs, key=lambda job: job.request.turns)
            deadline = first.arrived + self.max_wait
            while True:  # more of the same settings may arrive within max_wait of the first
                batch = self._take(first.key)
                remaining = deadline - time.monotonic()
                full = sum(job.tokens for job in batch) >= self.max_tokens
                if full or remaining <= 0 or self._stopping or not self.batching:
                    break
                self._cond.wait(remaining)
            for job in batch:
                self._jobs.remove(job)
                job.request.turns += 1
            return batch

    def _take(self, key: Hashable) -> list[_Job]:
        """The oldest jobs with this key that fit the token budget (the first one always), one
        chunk of a request per batch."""
        batch: list[_Job] = []
        tokens, requests = 0, set()
        for job in sorted(self._jobs, key=lambda job: job.request.turns):  # stable: arrival order
            if job.key != key or id(job.request) in requests:
                continue
            if batch and tokens + job.tokens > self.max_tokens:
                break
            batch.append(job)
            tokens += job.tokens
            requests.add(id(job.request))
        return batch


def decode_seconds(timing: dict) -> float:
    """A request's decoding time so far: its batches' time, the one under way included (a
    request that timed out or left is told what its batch had decoded by then)."""
    since = timing.get("decoding_since")
    running = 0.0 if since is None else time.monotonic() - since
    return timing.get("decode_seconds", 0.0) + running


def _all_done(jobs: list[_Job]) -> bool:
    return all(job.request.done() for job in jobs)


def _chunks(sentences: list[str], tokens: list[int], budget: int) -> list[tuple[list[str], int]]:
    """The sentences in order, cut into runs of at most `budget` tokens (a longer sentence
    alone); each with its token count."""
    out: list[tuple[list[str], int]] = []
    part: list[str] = []
    count = 0
    for sentence, n in zip(sentences, tokens, strict=True):
        if part and count + n > budget:
            out.append((part, count))
            part, count = [], 0
        part.append(sentence)
        count += n
    out.append((part, count))
    return out
