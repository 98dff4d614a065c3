"""Giving back the memory of connections that have ended.

A closed connection leaves reference cycles behind (mitmproxy's layers, contexts and flows point at
one another), which only a collection of the older generations frees; with the young generation's
threshold raised for speed and start-up's objects frozen (proxy/process/master.py), those
collections came so rarely that 20,000 new TLS connections took a worker from 90 to 200 MiB, none
of it returned. Every request leaves such cycles too (an HTTP stream is in its own context's layer
list), and a keep-alive connection closes rarely. So after every few hundred closed connections, or
a few seconds in which a connection or a request ended, a full collection runs, and, once no
request is in flight, the C allocator is asked to give the freed pages back to the system (glibc's
malloc_trim).

A full collection's cost is set by what is alive (it walks every object not frozen), not by the
garbage it frees: about 80 ms for a worker's heap here, whether it freed 9,000 objects or
42,000. At 600 new connections a second, one every 500 closed ones took a tenth of the worker's
CPU. So collections are also spaced by their own cost: the next waits at least _SPACING times
as long as the last took (at most 2 % of the time in collections), and never longer than
_MOST_SECONDS. Garbage waits longer under a flood of connections, a few thousand connections'
cycles (some MiB), and the same collection frees it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import time
from collections.abc import Callable

_EVERY_CLOSED = 500
_EVERY_SECONDS = 5.0
_SPACING = 50  # times the last collection's duration before the next
_MOST_SECONDS = 10.0  # the longest that spacing may be


def _trimmer() -> Callable[[], None]:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:  # not glibc: nothing to ask
        return lambda: None
    return lambda: trim(0)


class Reclaimer:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic,
        trim: Callable[[], None] | None = None,
    ) -> None:
        self.clock = clock
        self._closed = 0
        self._finished = 0
        self._last = clock()
        self._trim = trim or _trimmer()
        self._untrimmed = False
        self._spacing = 0.0  # seconds the next collection waits at least, from the last's cost

    def closed(self) -> None:
        self._closed += 1

    def finished(self) -> None:
        """A request ended (its audit line was written)."""
        self._finished += 1

    def tick(self, *, idle: bool) -> None:
        """Called about once a second; `idle` when no request is in flight."""
        now = self.clock()
        ended = self._closed or self._finished
        due = self._closed >= _EVERY_CLOSED or (ended and now - self._last >= _EVERY_SECONDS)
        if due and now - self._last >= self._spacing:
            gc.collect()
            took = self.clock() - now
            self._spacing = min(took * _SPACING, _MOST_SECONDS)
            self._closed, self._finished, self._last, self._untrimmed = 0, 0, now, True
        if idle and self._untrimmed:
            self._trim()
            self._untrimmed = False


def resident() -> int:
    """This process's resident memory, in bytes."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


_PAGE = os.sysconf("SC_PAGE_SIZE")
