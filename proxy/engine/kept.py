"""Idle upstream connections kept for the next request with the same key, within bounds: the
bookkeeping both engines' pools share (pool.py's for mitmproxy's layers, fastdial.py's for the
fast path). What a connection is and when it may be kept is theirs; here is only how many are
kept per key, per tenant and in all, for how long, and that one which hears anything while it
waits (an end, a byte: a second response to a request, say) is closed at once.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, Protocol, SupportsIndex, TypeVar


class Reader(asyncio.StreamReader):
    """A socket's reader that says whether it holds anything unread, and calls `stirred` when
    something arrives (a byte, an end, an error) while its connection waits to be taken."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=2**16, loop=loop)
        self.unread = 0
        self.ended = False
        self.reading = False
        self.stirred: Callable[[], None] | None = None

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        super().feed_data(data)
        self.unread += len(data)  # type: ignore[arg-type]  # bytes, from the protocol
        self._stir()

    def feed_eof(self) -> None:
        super().feed_eof()
        self.ended = True
        self._stir()

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        self.ended = True
        self._stir()

    async def read(self, n: int = -1) -> bytes:
        self.reading = True
        try:
            data = await super().read(n)
        finally:
            self.reading = False
        self.unread -= len(data)
        return data

    def _stir(self) -> None:
        if self.stirred is not None:
            self.stirred()


class Keyed(Protocol):
    def __hash__(self) -> int: ...
    @property
    def tenant(self) -> str: ...


class Keepable(Protocol):
    @property
    def key(self) -> Keyed: ...
    @property
    def reader(self) -> Reader: ...
    def closing(self) -> bool: ...
    def close(self) -> None: ...


K = TypeVar("K", bound=Keepable)


class Kept(Generic[K]):
    def __init__(self, *, per_key: int, per_tenant: int, total: int,
                 idle_seconds: float) -> None:
        self.per_key, self.per_tenant, self.total = per_key, per_tenant, total
        self.idle_seconds = idle_seconds
        self._idle: dict[Hashable, list[K]] = {}
        self._tenants: Counter[str] = Counter()  # idle connections per tenant
        self._order: OrderedDict[K, asyncio.TimerHandle] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._order)

    def put(self, item: K) -> bool:
        """Keep `item` until it is taken, stirred or idle too long; False (and not kept) when
        its key or tenant has its fill."""
        key = item.key
        idle = self._idle.get(key, [])
        if len(idle) >= self.per_key or self._tenants[key.tenant] >= self.per_tenant:
            return False
        self._idle[key] = idle
        idle.append(item)
        self._tenants[key.tenant] += 1
        self._order[item] = asyncio.get_running_loop().call_later(
            self.idle_seconds, self.drop, item)
        item.reader.stirred = lambda: self.drop(item)
        while len(self._order) > self.total:
            self.drop(next(iter(self._order)))
        return True

    def take(self, key: Keyed) -> K | None:
        """The most recently kept connection for `key` that heard nothing meanwhile (the least
        likely to have been closed by its origin since); those that did are closed."""
        idle = self._idle.get(key)
        while idle:
            item = idle.pop()
            self._forget(item)
            if not idle:  # emptied lists would stay, one per key ever seen
                del self._idle[key]
            reader = item.reader
            if not (reader.ended or reader.unread or item.closing()):
                return item
            item.close()
        return None

    def drop(self, item: K) -> None:
        """`item` closed, and no longer kept if it was."""
        if item in self._order:
            self._forget(item)
            idle = self._idle[item.key]
            idle.remove(item)
            if not idle:
                del self._idle[item.key]
        item.close()

    def drop_all(self, key: Keyed) -> None:
        """Every connection kept for `key` closed (one of them was found closed by its origin:
        the others, as old, are likely to be too)."""
        for item in list(self._idle.get(key, ())):
            self.drop(item)

    def flush(self) -> None:
        for item in list(self._order):
            self.drop(item)

    def _forget(self, item: K) -> None:
        self._order.pop(item).cancel()
        item.reader.stirred = None
        tenant = item.key.tenant
        self._tenants[tenant] -= 1
        if self._tenants[tenant] <= 0:
            del self._tenants[tenant]
