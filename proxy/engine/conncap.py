"""How many client connections a worker holds, in all and per source address.

A sandbox's `max_connections` budget counts only connections it has identified itself on, after
mitmproxy has set them up; a flood of connections that never identify (or a client outside any
sandbox) was unbounded, each holding a descriptor and its buffers. These caps apply the moment a
connection is accepted, before any protocol layer or TLS: over one, the connection is closed at
once, which costs next to nothing. Refusals are counted and written as one audit line per reason
per second (a flood must not become a flood of log lines).
"""

from __future__ import annotations

import resource
from collections import Counter
from dataclasses import dataclass

from sealgate.reasons import Reason

_HEADROOM = 256  # descriptors kept for listeners, logs, the resolver, the control API
# Each client connection may hold an upstream connection too.
_PER_CONNECTION = 2


def default_total() -> int:
    """What this process's descriptor limit leaves room for."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 100_000
    return max(64, (soft - _HEADROOM) // _PER_CONNECTION)


@dataclass
class ConnectionGate:
    total: int
    per_source: int

    def __post_init__(self) -> None:
        self.open = 0
        self.by_source: Counter[str] = Counter()
        self.refused: Counter[Reason] = Counter()
        # Connections counted already and handed on (fastpath.py to mitmproxy's handler or to
        # the pipeline's client_connected), by their peer address: their next admission keeps
        # the count as it is, with no moment in between at which they count for nothing.
        self.passed: set[object] = set()

    def admit(self, source: str, peer: object = None) -> Reason | None:
        """Count a new connection from `source`; the reason it is refused, or None."""
        if peer is not None and peer in self.passed:
            self.passed.discard(peer)
            return None
        if self.open >= self.total:
            reason = Reason.PROXY_AT_CAPACITY
        elif self.by_source[source] >= self.per_source:
            reason = Reason.SOURCE_AT_CAPACITY
        else:
            self.open += 1
            self.by_source[source] += 1
            return None
        self.refused[reason] += 1
        return reason

    def hold(self, source: str) -> None:
        """Count one more connection from `source`, over the caps: one already open that is
        about to be released once and counted on (a hand-over in the middle of it)."""
        self.open += 1
        self.by_source[source] += 1

    def pass_on(self, peer: object) -> None:
        """The connection from `peer`, counted, goes to whoever admits it next."""
        self.passed.add(peer)

    def release(self, source: str) -> None:
        self.open -= 1
        if self.by_source[source] <= 1:
            del self.by_source[source]
        else:
            self.by_source[source] -= 1

    def take_refused(self) -> Counter[Reason]:
        """The refusals counted since the last call."""
        refused, self.refused = self.refused, Counter()
        return refused
