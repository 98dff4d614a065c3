"""Creates remembered by their Idempotency-Key, so that a retry after a lost answer gets the
sandbox the first try made, never a second one: for `_KEY_SECONDS`, at most `_KEYS_KEPT` of
them, the oldest forgotten first. A create that failed is forgotten at once (its retry tries
again); one under way is joined, not repeated.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any

from sealgate.reasons import Reason

from .session import Options, Session, SessionError

_KEY_SECONDS = 600.0  # how long a create's Idempotency-Key is remembered
_KEYS_KEPT = 4096


class Keys:
    def __init__(self) -> None:
        self._keys: OrderedDict[str, tuple[float, Options, asyncio.Task[Session[Any]]]] = \
            OrderedDict()

    def known(self, key: str, options: Options) -> asyncio.Task[Session[Any]] | None:
        """The create remembered for `key`, if any. Raises SessionError (bad_request) for a key
        a create of other options used."""
        now = time.monotonic()
        while self._keys and (len(self._keys) > _KEYS_KEPT
                              or now - next(iter(self._keys.values()))[0] > _KEY_SECONDS):
            self._keys.popitem(last=False)
        if (known := self._keys.get(key)) is None:
            return None
        if known[1] != options:
            raise SessionError("Idempotency-Key already used for another create",
                               reason=Reason.BAD_REQUEST)
        return known[2]

    def remember(self, key: str, options: Options, work: asyncio.Task[Session[Any]]) -> None:
        self._keys[key] = (time.monotonic(), options, work)
        work.add_done_callback(lambda done: self._forget(key, done))

    def _forget(self, key: str, work: asyncio.Task[Session[Any]]) -> None:
        if (work.cancelled() or work.exception() is not None) and key in self._keys \
                and self._keys[key][2] is work:
            del self._keys[key]


class Creates:
    """The creates of a backend: those under way (`under_way`, which count against its
    capacity: concurrent ones all wait on a slow start) and those remembered by their key.

    A create runs to its end even when its caller leaves (aiohttp then cancels the handler, a
    client past its call_timeout among others): what is being made (a slot in a thread, a
    claim in a cluster) cannot be stopped halfway, and one cancelled there would never be
    released. What it made is handed to `abandoned` (which deletes it)."""

    def __init__(self) -> None:
        self.keys = Keys()
        self.under_way = 0

    async def once(self, options: Options, key: str | None, room: Callable[[int], None],
                   make: Callable[[], Coroutine[Any, Any, Session[Any]]],
                   abandoned: Callable[[Session[Any]], None]) -> Session[Any]:
        """The session `make` makes; with `key`, the one an earlier create with the same key
        made, if it is remembered and succeeded (a retry after a lost answer). `room(n)` raises
        SessionError when there is none beside `n` creates under way."""
        if key is not None and (known := self.keys.known(key, options)) is not None:
            return await asyncio.shield(known)
        room(self.under_way)
        self.under_way += 1
        work = asyncio.create_task(make())
        work.add_done_callback(self._done)
        if key is not None:
            self.keys.remember(key, options, work)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            work.add_done_callback(lambda done: _hand_over(done, abandoned))
            raise

    def _done(self, _: asyncio.Task[Session[Any]]) -> None:
        self.under_way -= 1


def _hand_over(work: asyncio.Task[Session[Any]], abandoned: Callable[[Session[Any]], None]
               ) -> None:
    if not work.cancelled() and work.exception() is None:
        abandoned(work.result())
