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

    def closed(self) -> None:
        self._closed += 1

    def finished(self) -> None:
        """A request ended (its audit line was written)."""
        self._finished += 1

    def tick(self, *, idle: bool) -> None:
        """Called about once a second; `idle` when no request is in flight."""
        now = self.clock()
        ended = self._closed or self._finished
        if self._closed >= _EVERY_CLOSED or (ended and now - self._last >= _EVERY_SECONDS):
            gc.collect()
            self._closed, self._finished, self._last, self._untrimmed = 0, 0, now, True
        if idle and self._untrimmed:
            self._trim()
            self._untrimmed = False


def resident() -> int:
    """This process's resident memory, in bytes."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


_PAGE = os.sysconf("SC_PAGE_SIZE")
