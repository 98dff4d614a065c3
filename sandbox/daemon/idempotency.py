"""Creates remembered by their Idempotency-Key, so that a retry after a lost answer gets the
sandbox the first try made, never a second one: for `_KEY_SECONDS`, at most `_KEYS_KEPT` of
them, the oldest forgotten first. A create that failed is forgotten at once (its retry tries
again); one under way is joined, not repeated.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
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
