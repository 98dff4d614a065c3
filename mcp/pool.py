"""Upstream connections kept between tool calls, so that a call does not pay a TCP and TLS
handshake each time, and so that no call rides a connection it must not.

A connection is kept under a key of everything that made it what it is (`PoolKey`): the
address the guard pinned for the call that opened it (it was dialed there and nowhere else),
the host's name (TLS's SNI, the name its certificate was checked for, the Host header), the
port, the scheme, the TLS settings, and whom the call was made for (the sandbox and its
policy). A call takes a connection of its own key only, and its key holds the address its own
guard check pinned, this time: the guard decides and pins every call before it gets here
(calls.py), the pool skips nothing. A DNS answer that changed is another key, so the old
connection is not used for it; one sandbox's calls never ride a connection another's opened.

Each key's connections belong to an aiohttp connector of its own, whose resolver is the pinned
address alone (`Pinned`), without a cookie jar (nothing of one call's answer goes into the next
call's request). Bounded: at most `per_key` connections a key (a call that finds them all busy
gets a connection of its own, closed after it), at most `keys` keys (the least recently used
idle key is closed to make room; with none idle the call gets a connection of its own): so at
most `keys` x `per_key` connections are kept. A connection idle for `idle` seconds is closed, and
a key unused for as long. `close()`, when the service stops, closes them all; after it, every
call gets a connection of its own.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from sealgate.proxy.calls import Pinned

__all__ = ["Pool", "PoolKey"]

PER_KEY: Final = 4
KEYS: Final = 256
IDLE: Final = 15.0  # seconds; below the keep-alive of common servers (nginx 75 s, uvicorn 5 s)


@dataclass(frozen=True, slots=True)
class PoolKey:
    """Everything a kept connection is bound to. `tls` compares by identity (one context, one
    set of settings); None for plain HTTP."""

    sandbox: str | None
    policy: str
    scheme: str
    host: str
    port: int
    address: str
    tls: ssl.SSLContext | None


@dataclass
class _Entry:
    session: aiohttp.ClientSession
    busy: int = 0
    used: float = 0.0


class Pool:
    def __init__(self, *, per_key: int = PER_KEY, keys: int = KEYS, idle: float = IDLE) -> None:
        if per_key < 1 or keys < 1 or idle <= 0:
            raise ValueError("a pool needs per_key >= 1, keys >= 1 and idle > 0")
        self.per_key, self.keys, self.idle = per_key, keys, idle
        self._entries: OrderedDict[PoolKey, _Entry] = OrderedDict()
        self._closed = False
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def kept(self) -> int:
        """How many keys have connections kept (or being made)."""
        return len(self._entries)

    @asynccontextmanager
    async def session(self, key: PoolKey) -> AsyncIterator[aiohttp.ClientSession]:
        """A session whose connections are `key`'s only: a kept one, or one for this call
        alone when the pool is full or closed."""
        entry, closing = self._take(key, time.monotonic())
        for old in closing:  # in the background: this call does not wait for them
            task = asyncio.create_task(old.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        if entry is None:
            async with _session(key, keep=False) as alone:
                yield alone
            return
        try:
            yield entry.session
        finally:
            entry.busy -= 1
            entry.used = time.monotonic()

    def _take(self, key: PoolKey, now: float) -> tuple[_Entry | None, list[aiohttp.ClientSession]]:
        """The key's entry, marked busy (None: this call gets a connection of its own), and the
        sessions taken out of the pool, to close. Synchronous: no other call runs meanwhile."""
        if self._closed:
            return None, []
        closing = [self._entries.pop(k).session for k, e in list(self._entries.items())
                   if e.busy == 0 and now - e.used > self.idle]
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self.keys:
                oldest = next((k for k, e in self._entries.items() if e.busy == 0), None)
                if oldest is None:
                    return None, closing
                closing.append(self._entries.pop(oldest).session)
            entry = self._entries[key] = _Entry(_session(key, keep=True, per_key=self.per_key,
                                                         idle=self.idle))
        elif entry.busy >= self.per_key:
            return None, closing
        self._entries.move_to_end(key)
        entry.busy += 1
        entry.used = now
        return entry, closing

    async def close(self) -> None:
        self._closed = True
        entries = list(self._entries.values())
        self._entries.clear()
        for entry in entries:
            await entry.session.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _session(key: PoolKey, *, keep: bool, per_key: int = 1, idle: float = IDLE
             ) -> aiohttp.ClientSession:
    options: dict[str, Any] = {"keepalive_timeout": idle, "limit": per_key} if keep else {
        "force_close": True, "limit": 1}
    tls: ssl.SSLContext | bool = False
    if key.scheme == "https":
        if key.tls is None:
            raise ValueError("an https key needs its TLS context")  # never unverified
        tls = key.tls
    connector = aiohttp.TCPConnector(
        ssl=tls, resolver=Pinned(key.address),
        use_dns_cache=False, limit_per_host=0, **options)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                 skip_auto_headers=("User-Agent",),
                                 cookie_jar=aiohttp.DummyCookieJar())
