"""Per-secret cache in front of a store: TTL, refresh ahead, bounded stale-if-error.

At most one backend fetch per secret is outstanding at any time: concurrent misses,
refresh-ahead and callers that gave up waiting (fetch_timeout) all share it, so a slow
backend sees one request per secret, not one per proxied request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from sealgate.credentials.errors import SecretConfigError, SecretError, SecretUnavailable
from sealgate.credentials.secretref import SecretRef

from .base import Secret, SecretStore

log = logging.getLogger(__name__)

# A secret the store says does not exist, or may not be read, is asked for again only after
# this long: every request would otherwise cost a backend round trip and a warning line.
REFUSED_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class _Entry:
    secret: Secret
    refresh_at: float
    expires: float


class SecretCache:
    """Cache for one store.

    - A value is served for min(ttl, the store's suggested ttl) seconds.
    - In the last `refresh_ahead` fraction of that, a get triggers a background refresh
      and still returns the cached value at once.
    - After expiry a get waits (at most fetch_timeout) for a fresh value. If the backend
      is unavailable (SecretUnavailable or timeout) the old value is served for up to
      `stale_grace` seconds past expiry; after that the get raises SecretUnavailable.
    - Not-found, denied and config errors evict the entry: a revoked secret or permission
      is never papered over by a stale copy.
    """

    def __init__(
        self,
        store: SecretStore,
        *,
        ttl: float = 300,
        refresh_ahead: float = 0.2,
        stale_grace: float = 30,
        fetch_timeout: float = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not ttl > 0:
            raise ValueError("ttl must be positive")
        if not 0 <= refresh_ahead < 1:
            raise ValueError("refresh_ahead must be a fraction in [0, 1)")
        if not stale_grace >= 0:
            raise ValueError("stale_grace must not be negative")
        if not fetch_timeout > 0:
            raise ValueError("fetch_timeout must be positive")
        self.store = store
        self._ttl = ttl
        self._refresh_ahead = refresh_ahead
        self._stale_grace = stale_grace
        self._fetch_timeout = fetch_timeout
        self._clock = clock
        self._entries: dict[SecretRef, _Entry] = {}
        self._refused: dict[SecretRef, tuple[SecretError, float]] = {}
        self._inflight: dict[SecretRef, asyncio.Task[Secret]] = {}
        # The store failed a caller past its grace, and has not answered since: the proxy's
        # readiness says so (an outage is not a missing or refused secret, which is config).
        self.unavailable = False
        # For the metrics: lookups served from the cache (`fresh`, the request path's: an int,
        # the cheapest count), the others by how they went (miss, stale, refused,
        # unavailable), the store's fetches by outcome (ok, refused, unavailable), their time.
        self.hits = 0
        self.lookups: Counter[str] = Counter()
        self.fetches: Counter[str] = Counter()
        self.fetch_seconds = 0.0

    @property
    def scheme(self) -> str:
        return self.store.scheme

    def fresh(self, ref: SecretRef) -> Secret | None:
        """The cached value while it is fresh (starting the refresh ahead of expiry, as `get`
        does); None when `get` would have to wait. The hit path without a coroutine."""
        entry = self._entries.get(ref)
        now = self._clock()
        if entry is None or now >= entry.expires:
            return None
        if now >= entry.refresh_at:
            self._flight(ref)
        self.hits += 1
        return entry.secret

    async def get(self, ref: SecretRef) -> Secret:
        if (secret := self.fresh(ref)) is not None:
            return secret
        refused = self._refused.get(ref)
        if refused is not None:
            if self._clock() < refused[1]:
                self.lookups["refused"] += 1
                raise refused[0]
            del self._refused[ref]
        try:
            secret = await self._wait(ref)
        except SecretUnavailable as exc:
            entry = self._entries.get(ref)
            if entry is not None and self._clock() < entry.expires + self._stale_grace:
                log.warning("secret store unavailable; serving the cached value within its "
                            "grace", extra={"ref": str(ref), "error": str(exc)})
                self.lookups["stale"] += 1
                return entry.secret
            self.unavailable = True
            self.lookups["unavailable"] += 1
            raise
        except SecretError:
            self.lookups["refused"] += 1
            raise
        self.lookups["miss"] += 1
        return secret

    async def write(self, ref: SecretRef, value: str) -> None:
        """Write `value` to the store, if it can be written (SecretError otherwise), and serve
        it from now on."""
        write = getattr(self.store, "write", None)
        if write is None:
            raise SecretConfigError(f"the {self.scheme} store cannot be written")
        await write(ref, value)
        entry = self._entries.get(ref)
        if entry is not None:
            self._entries[ref] = _Entry(Secret(value), entry.refresh_at, entry.expires)

    async def close(self) -> None:
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._entries.clear()
        self._refused.clear()
        await self.store.close()

    async def _wait(self, ref: SecretRef) -> Secret:
        task = self._flight(ref)
        try:
            # shield: a caller timing out must not cancel the fetch others are sharing.
            return await asyncio.wait_for(asyncio.shield(task), self._fetch_timeout)
        except TimeoutError:
            raise SecretUnavailable(
                f"secret {ref}: {self.scheme} store did not answer within {self._fetch_timeout}s"
            ) from None

    def _flight(self, ref: SecretRef) -> asyncio.Task[Secret]:
        task = self._inflight.get(ref)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch(ref))
            self._inflight[ref] = task
            task.add_done_callback(lambda done: self._landed(ref, done))
        return task

    async def _fetch(self, ref: SecretRef) -> Secret:
        began = time.monotonic()
        outcome = "unavailable"
        try:
            secret, suggested = await self.store.fetch(ref)
            outcome = "ok"
        except SecretUnavailable:
            raise
        except SecretError as exc:
            # Not found, denied, misconfigured: never papered over by a stale copy.
            outcome = "refused"
            self._entries.pop(ref, None)
            self._refused[ref] = (exc, self._clock() + REFUSED_SECONDS)
            raise
        except Exception as exc:
            # An unexpected failure is treated as an outage, named by type only: its
            # text is not ours and might quote what it was handling.
            raise SecretUnavailable(
                f"secret {ref}: {self.scheme} store failed with {type(exc).__name__}"
            ) from None
        finally:
            self.fetches[outcome] += 1
            self.fetch_seconds += time.monotonic() - began
        self.unavailable = False
        ttl = min(self._ttl, suggested) if suggested > 0 and not math.isnan(suggested) else 0.0
        fetched = self._clock()
        self._entries[ref] = _Entry(
            secret, fetched + ttl * (1 - self._refresh_ahead), fetched + ttl
        )
        return secret

    def _landed(self, ref: SecretRef, task: asyncio.Task[Secret]) -> None:
        if self._inflight.get(ref) is task:
            del self._inflight[ref]
        # Retrieve the outcome so a background refresh nobody awaited still gets logged.
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("secret fetch failed", extra={
                "ref": str(ref), "store": ref.store, "error_type": type(exc).__name__,
                "error": str(exc)})
