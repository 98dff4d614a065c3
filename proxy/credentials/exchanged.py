"""A credential the proxy obtains and caches: a token from a token endpoint, held until shortly
before it expires.

- Fresh until `refresh_at` (the last 5 minutes of its life, or its second half if it lives less
  than 10): returned at once.
- From then on a refresh starts in the background, one call per key at a time, and the held
  token is still returned, until `usable_until` (30 s before expiry, or the last quarter of a
  short life): a token about to expire is not sent on a request that may take a while.
- Past that, or with nothing held, a request waits for the one call (however many wait), at
  most `wait` seconds, then fails (`ExchangeError`), unless the held token has not expired yet:
  close to expiry, it is still better than none.
- A failed call is not repeated for `retry_after` seconds: requests in between fail at once
  (or use the token not yet expired), so an endpoint that is down sees one call per key every few
  seconds, never one per request.
- `invalidate` drops a token an upstream refused (401), so the next request asks again; at
  most once per `retry_after` seconds per key, so an upstream that refuses every token (a
  scope it will never grant) does not turn each request into a call to the token endpoint.

At most `max_keys` keys are remembered (held tokens, failures, invalidations each), the least
recently obtained forgotten first: a sandbox that may send sealed tokens chooses how many keys
there are (anyone with the proxy's public key can mint).

Keys are whatever names one credential (its processor, its secret's reference, the policy's
networks it is dialed under); `source` is what it was obtained from, and a held token obtained
from another source (the operator changed the secret) is not used.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from ..errors import ProxyError

__all__ = ["ExchangeError", "Exchanged", "Obtained"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

REFRESH_AHEAD: Final = 300.0
USABLE_MARGIN: Final = 30.0
WAIT: Final = 5.0
RETRY_AFTER: Final = 5.0
MAX_KEYS: Final = 16384


class ExchangeError(ProxyError):
    """The credential could not be obtained; the message names the failure, never a value."""


@dataclass(frozen=True, slots=True)
class Obtained:
    value: str
    expires: float  # wall clock
    source: str  # what it was obtained from (a digest, never the secret)


@dataclass(frozen=True, slots=True)
class _Held:
    obtained: Obtained
    refresh_at: float
    usable_until: float


def _held(obtained: Obtained, now: float) -> _Held:
    life = max(obtained.expires - now, 0.0)
    return _Held(obtained, obtained.expires - min(REFRESH_AHEAD, life / 2),
                 obtained.expires - min(USABLE_MARGIN, life / 4))


class Exchanged(Generic[K]):
    def __init__(self, *, clock: Callable[[], float] = time.time, wait: float = WAIT,
                 retry_after: float = RETRY_AFTER, max_keys: int = MAX_KEYS) -> None:
        self.clock = clock
        self.wait = wait
        self.retry_after = retry_after
        self.max_keys = max_keys
        self._held: dict[K, _Held] = {}
        self._flights: dict[K, asyncio.Task[Obtained]] = {}
        self._failed: dict[K, tuple[ExchangeError, float]] = {}  # the error, until when
        self._invalidated: dict[K, float] = {}  # when a token of the key was last dropped
        self.calls = 0  # obtain calls started, for tests and the curious

    def fresh(self, key: K, source: str) -> str | None:
        """The held token while it needs no call, without a coroutine: the request path's
        hit."""
        held = self._held.get(key)
        if held is None or held.obtained.source != source or self.clock() >= held.refresh_at:
            return None
        return held.obtained.value

    async def get(self, key: K, source: str, obtain: Callable[[], Awaitable[Obtained]]) -> str:
        now = self.clock()
        held = self._held.get(key)
        if held is not None and held.obtained.source != source:
            held = None
        if held is not None and now < held.refresh_at:
            return held.obtained.value
        failed = self._failed.get(key)
        if failed is not None and now >= failed[1]:
            del self._failed[key]
            failed = None
        if failed is not None:
            if held is not None and now < held.obtained.expires:
                return held.obtained.value  # close to expiry, but better than no token
            raise failed[0]
        flight = self._flight(key, obtain)
        if held is not None and now < held.usable_until:
            return held.obtained.value
        try:
            # Shielded: one waiting request that gives up (or is cancelled) must not cancel
            # the call the others wait on.
            async with asyncio.timeout(self.wait):
                found = await asyncio.shield(flight)
        except (TimeoutError, ExchangeError) as exc:
            if held is not None and self.clock() < held.obtained.expires:
                return held.obtained.value
            if isinstance(exc, ExchangeError):
                raise
            raise ExchangeError(f"no answer from the token endpoint within {self.wait:g} s"
                                ) from None
        # Its source may differ from `source`: a rotated refresh token is a new secret.
        return found.value

    def _flight(self, key: K, obtain: Callable[[], Awaitable[Obtained]]) -> asyncio.Task[Obtained]:
        flight = self._flights.get(key)
        if flight is None:
            self.calls += 1
            flight = self._flights[key] = asyncio.ensure_future(self._call(key, obtain))
            # Retrieved here: a refresh in the background may fail with nobody waiting.
            flight.add_done_callback(lambda done: done.cancelled() or done.exception())
        return flight

    async def _call(self, key: K, obtain: Callable[[], Awaitable[Obtained]]) -> Obtained:
        try:
            found = await obtain()
        except ExchangeError as exc:
            self._keep(self._failed, key, (exc, self.clock() + self.retry_after))
            raise
        finally:
            self._flights.pop(key, None)
        self._keep(self._held, key, _held(found, self.clock()))
        self._failed.pop(key, None)
        return found

    def _keep(self, entries: dict[K, V], key: K, value: V) -> None:
        """Set `key` as the newest entry, forgetting the oldest past `max_keys`."""
        entries.pop(key, None)
        entries[key] = value
        while len(entries) > self.max_keys:
            del entries[next(iter(entries))]

    def invalidate(self, key: K, value: str) -> None:
        """Forget `value` if it is still what `key` holds (a 401 for an older token leaves a
        newer one alone)."""
        held = self._held.get(key)
        now = self.clock()
        if held is not None and held.obtained.value == value and \
                now >= self._invalidated.get(key, -self.retry_after) + self.retry_after:
            del self._held[key]
            self._keep(self._invalidated, key, now)

    async def close(self) -> None:
        flights = list(self._flights.values())
        for flight in flights:
            flight.cancel()
        await asyncio.gather(*flights, return_exceptions=True)
        self._held.clear()
