"""The MCP server's HTTP connections, bounded per caller and in time (uvicorn's h11 protocol
with two checks of ours).

uvicorn counts connections only against one limit for everyone (`limit_concurrency`: past it,
every request is answered 503) and times nothing until a request's head is complete: its
keep-alive timer starts after a response. So one sandbox could open a few hundred connections
and send nothing, or half a head, and hold them: every other caller then got 503 for as long as
it liked (found by review, reproduced). Here:

- **a cap per peer address** (a caller is its address: a sandbox's own, or loopback for a local
  client): a connection past it is answered 503 and closed at once, never read, so one caller
  cannot take the room of the others;
- **a deadline for each request's head**: from the connection's start, and again from each
  response's end, a complete head must come within `HEAD_SECONDS` or the connection is closed.
  Sending a byte now and then does not hold it (the deadline is not moved by data). A body
  has its own deadline (the app's `read_body`); a call in flight is the app's to bound.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from ..options import HEAD_SECONDS, PER_PEER

__all__ = ["bounded_protocol"]

_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
         b"Content-Length: 39\r\nConnection: close\r\n\r\n"
         b"too many connections from this address\n")


def bounded_protocol(per_peer: int = PER_PEER,
                     head_seconds: float = HEAD_SECONDS) -> type[H11Protocol]:
    """A protocol class for `uvicorn.Config(http=...)`, with its own count of connections
    per peer (one per server)."""
    open_from: Counter[str] = Counter()

    class Bounded(H11Protocol):
        _peer: str | None = None
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            peer = self.client[0] if self.client else "unknown"
            if open_from[peer] >= per_peer:
                transport.write(_BUSY)
                transport.close()
                return
            open_from[peer] += 1
            self._peer = peer
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._peer is not None:
                open_from[self._peer] -= 1
                if open_from[self._peer] <= 0:
                    del open_from[self._peer]
                self._peer = None
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._peer is None:  # a connection refused above: nothing of it is read
                return
            super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._await_head()

        def _await_head(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            # The cycle now: a head that came made a new one (h11_impl's handle_events).
            self._head_timer = self.loop.call_later(head_seconds, self._head_late, self.cycle)

        def _head_late(self, cycle: Any) -> None:
            # No head since, and no request in flight (a pipelined one may have started in
            # the response's end, before the timer was armed).
            if (self.cycle is cycle and (cycle is None or cycle.response_complete)
                    and not self.transport.is_closing()):
                self.transport.close()

    return Bounded
