"""The connections of `mt serve`: uvicorn's HTTP/1.1 protocol (h11) with the limits uvicorn
leaves open, so that careless or hostile clients cannot hold the server.

- A connection finishes its request headers within `header_timeout` of opening, or of its
  previous answer (an idle keep-alive connection, or one that sent half its headers, too).
- It sends its body within `body_timeout` of the headers, and reads its answer: a client that
  stops reading is dropped after `body_timeout` with its answer unwritten.
- At most `max_connections` are open. One more closes the connection that has waited longest
  for its first request's headers (stalled), else the one idle longest between requests (a
  client that has been answered before, and may be about to send again, goes last); when every
  connection is busy with a request, the new one is answered 503 and closed. (uvicorn's
  limit_concurrency counts stalled sockets with the rest and answers 503 to everyone else.)

Timed-out and dropped connections are closed without a log line: a flood of them must not fill
the log. A request h11 cannot parse (answered 400 by uvicorn) and a connection refused at the
cap are told to `refused` (mt.serve.observe.Door: counted, and logged as requests are)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the limits above (class attributes: see `guarded`)."""

    header_timeout = 10.0
    body_timeout = 30.0
    max_connections = 1000

    @staticmethod
    def refused(client: tuple[str, int] | None, status: int, reason: str) -> None:
        """Told of each refusal before a request reached the app (see `guarded`)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._seen: Any = None  # the last request whose headers arrived
        self.answered = False  # a request of it has been answered
        self.waiting_since: float | None = self.loop.time()  # for its headers; None: a request
        if len(self.connections) > self.max_connections and not self._evict_one():
            self._refuse()
            return
        self._arm(self.header_timeout, self._headers_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._write_timer is not None:
            self._write_timer.cancel()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle is not self._seen:  # new request headers
            self._seen, self.waiting_since = self.cycle, None
            self._disarm()
            if self.conn.their_state is h11.SEND_BODY:
                self._arm(self.body_timeout, self._body_late)
        elif self.waiting_since is None and self.conn.their_state is not h11.SEND_BODY:
            self._disarm()  # the body of the request under way is in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        idle = self.cycle is None or self.cycle.response_complete  # (no pipelined request)
        self.answered = True
        if idle and not self.transport.is_closing():
            self.waiting_since = self.loop.time()
            self._arm(self.header_timeout, self._headers_late)

    def send_400_response(self, msg: str) -> None:  # h11 could not parse the request
        self.refused(self.client, 400, "malformed_request")
        super().send_400_response(msg)

    def pause_writing(self) -> None:  # the client does not read what it asked for
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.body_timeout, self._drop)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    # -- the timers ---------------------------------------------------------------------------

    def _arm(self, seconds: float, then: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, then)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_late(self) -> None:
        if self.waiting_since is not None:
            self._drop()

    def _body_late(self) -> None:
        if self.conn.their_state is h11.SEND_BODY:
            self._drop()  # (the app's read of the body ends: the client is gone)

    def _drop(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    # -- the cap ------------------------------------------------------------------------------

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for its first request's headers, else
        the one idle longest; False when every other connection is busy with a request."""
        waiting = [
            c
            for c in self.connections
            if c is not self
            and isinstance(c, GuardedH11Protocol)
            and c.waiting_since is not None
            and not c.transport.is_closing()
        ]
        if not waiting:
            return False
        min(waiting, key=lambda c: (c.answered, c.waiting_since or 0.0))._drop()
        return True

    def _refuse(self) -> None:
        error = (
            f"the server has {self.max_connections} connections busy with requests "
            f"(--max-connections); try again shortly"
        )
        body = json.dumps({"error": error}).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
        )
        self.waiting_since = None
        self.refused(self.client, 503, "max_connections")
        self.transport.write(head.encode() + body)
        self.transport.close()


def guarded(
    header_timeout: float,
    body_timeout: float,
    max_connections: int,
    refused: Callable[[tuple[str, int] | None, int, str], None] | None = None,
) -> type[GuardedH11Protocol]:
    """The protocol class for uvicorn.Config(http=...), with these limits; refused(client,
    status, reason): told of each connection refused before the app saw a request."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "max_connections": max_connections,
            **({"refused": staticmethod(refused)} if refused is not None else {}),
        },
    )
