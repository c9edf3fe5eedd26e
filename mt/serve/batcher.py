"""Dynamic batching: requests that arrive together are decoded together, by one worker thread,
so the event loop keeps answering while the model works.

A request waits in a bounded queue (a full queue is refused at once, never piled up). The worker
takes the oldest request, then every queued request with the same decoding settings, up to a
token budget, waiting at most `max_wait` for more to arrive, and decodes them as one call of
the translator. Requests with other settings wait for their turn in arrival order. A sampled
request with a seed is never merged with another: its draws are then those of `mt translate
--seed` on its sentences alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

# decode(jobs' sentences concatenated, their shared settings) -> one result per sentence
Decode = Callable[[list[str], Any], list[Any]]


class QueueFull(Exception):
    """The queue holds as many requests as it may."""


@dataclass
class _Job:
    key: Hashable
    sentences: list[str]
    settings: Any
    tokens: int
    future: asyncio.Future[list[Any]]
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """Collects requests into batches for one worker thread that calls `decode`.

    max_tokens: the source tokens one batch may hold (a single request larger than this is
    decoded alone); max_wait: seconds the worker waits for more requests with the oldest one's
    settings once it has it; max_queue: requests waiting at most; batching False decodes every
    request alone (batches of one request), for comparison."""

    def __init__(
        self,
        decode: Decode,
        max_tokens: int = 4000,
        max_wait: float = 0.005,
        max_queue: int = 256,
        batching: bool = True,
    ) -> None:
        self.decode, self.max_tokens, self.max_wait = decode, max_tokens, max_wait
        self.max_queue, self.batching = max_queue, batching
        self._jobs: list[_Job] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._unique = itertools.count()
        self.batches = 0  # decode calls made, for the statistics of /health
        self.decoded = 0  # requests decoded
        self._thread = threading.Thread(target=self._work, name="mt-decode", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._jobs)

    def submit(
        self, sentences: list[str], settings: Hashable, tokens: int, alone: bool = False
    ) -> asyncio.Future[list[Any]]:
        """Queue a request (from the event loop); its future gets one result per sentence, or
        the exception `decode` raised. alone: never merged with another request."""
        loop = asyncio.get_running_loop()
        key = (settings, next(self._unique)) if alone or not self.batching else settings
        job = _Job(key, sentences, settings, tokens, loop.create_future(), loop)
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if len(self._jobs) >= self.max_queue:
                raise QueueFull(f"{len(self._jobs)} requests are already waiting")
            self._jobs.append(job)
            self._cond.notify()
        return job.future

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
            live = [job for job in batch if not job.future.done()]  # timed out: skip
            if not live:
                continue
            sentences = [s for job in live for s in job.sentences]
            try:
                results = self.decode(sentences, live[0].settings)
            except BaseException as e:  # the error is each request's answer, not the worker's end
                for job in live:
                    _resolve(job, error=e)
                continue
            self.batches += 1
            self.decoded += len(live)
            start = 0
            for job in live:
                _resolve(job, results[start : start + len(job.sentences)])
                start += len(job.sentences)

    def _next_batch(self) -> list[_Job] | None:
        with self._cond:
            while not self._jobs:
                if self._stopping:
                    return None
                self._cond.wait()
            first = self._jobs[0]
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
            return batch

    def _take(self, key: Hashable) -> list[_Job]:
        """The oldest jobs with this key that fit the token budget (the first one always)."""
        batch: list[_Job] = []
        tokens = 0
        for job in self._jobs:
            if job.key != key:
                continue
            if batch and tokens + job.tokens > self.max_tokens:
                break
            batch.append(job)
            tokens += job.tokens
        return batch


def _resolve(
    job: _Job, result: list[Any] | None = None, error: BaseException | None = None
) -> None:
    def settle() -> None:
        if job.future.done():  # its request timed out meanwhile
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result or [])

    with contextlib.suppress(RuntimeError):  # a closed event loop: nobody waits for it
        job.loop.call_soon_threadsafe(settle)
