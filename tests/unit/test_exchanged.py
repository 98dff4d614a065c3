"""The cache of obtained credentials (proxy/credentials/exchanged.py) on a clock the test moves:
fresh, refreshed ahead in the background, waited for when unusable, one call per key however
many wait, failures remembered (no pile-up), a bounded wait, invalidation by value."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from sealgate.proxy.credentials.exchanged import Exchanged, ExchangeError, Obtained


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Endpoint:
    """Counts calls; each answers a numbered token living `life` seconds, after `delay`."""

    def __init__(self, clock: Clock, life: float = 3600) -> None:
        self.clock, self.life, self.calls, self.delay = clock, life, 0, 0.0
        self.fail: str | None = None

    def __call__(self) -> Callable[[], Awaitable[Obtained]]:
        async def obtain() -> Obtained:
            self.calls += 1
            await asyncio.sleep(self.delay)
            if self.fail:
                raise ExchangeError(self.fail)
            return Obtained(f"t{self.calls}", self.clock.now + self.life, "s")
        return obtain


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout=10))


def test_cached_refreshed_ahead_and_waited_for_once_expired() -> None:
    clock = Clock()
    cache: Exchanged[str] = Exchanged(clock=clock)
    endpoint = Endpoint(clock)

    async def body() -> None:
        assert await cache.get("k", "s", endpoint()) == "t1"
        assert cache.fresh("k", "s") == "t1"
        clock.now += 3600 - 301  # not yet in the last 5 minutes
        assert await cache.get("k", "s", endpoint()) == "t1" and endpoint.calls == 1
        clock.now += 2  # within them: the held token at once, a refresh behind it
        assert cache.fresh("k", "s") is None
        assert await cache.get("k", "s", endpoint()) == "t1"
        await asyncio.sleep(0.01)
        assert endpoint.calls == 2 and await cache.get("k", "s", endpoint()) == "t2"
        clock.now += 3600 - 29  # t2 within 30 s of expiry: not sent, waited for
        assert await cache.get("k", "s", endpoint()) == "t3"
        assert await cache.get("k", "other source", endpoint()) == "t4"  # the secret changed

    run(body)


def test_concurrent_waiters_share_one_call_and_give_up_in_time() -> None:
    clock = Clock()
    cache: Exchanged[str] = Exchanged(clock=clock, wait=0.2)
    endpoint = Endpoint(clock)
    endpoint.delay = 0.5

    async def body() -> None:
        results = await asyncio.gather(*(cache.get("k", "s", endpoint()) for _ in range(20)),
                                       return_exceptions=True)
        assert endpoint.calls == 1
        assert all(isinstance(r, ExchangeError) and "within 0.2 s" in str(r) for r in results)
        await asyncio.sleep(0.4)  # the one call ends and its token is held
        assert await cache.get("k", "s", endpoint()) == "t1" and endpoint.calls == 1

    run(body)


def test_a_failure_is_remembered_then_retried() -> None:
    clock = Clock()
    cache: Exchanged[str] = Exchanged(clock=clock)
    endpoint = Endpoint(clock)
    endpoint.fail = "the token endpoint answered 503 temporarily_unavailable"

    async def body() -> None:
        for _ in range(10):
            with pytest.raises(ExchangeError, match="503"):
                await cache.get("k", "s", endpoint())
        assert endpoint.calls == 1
        clock.now += 5
        endpoint.fail = None
        assert await cache.get("k", "s", endpoint()) == "t2"

    run(body)


def test_a_failed_refresh_keeps_the_usable_token_and_invalidate_drops_only_its_value() -> None:
    clock = Clock()
    cache: Exchanged[str] = Exchanged(clock=clock)
    endpoint = Endpoint(clock)

    async def body() -> None:
        assert await cache.get("k", "s", endpoint()) == "t1"
        clock.now += 3600 - 100
        endpoint.fail = "down"
        for _ in range(5):
            assert await cache.get("k", "s", endpoint()) == "t1"
            await asyncio.sleep(0.01)
        assert endpoint.calls == 2  # one refresh, its failure remembered
        endpoint.fail = None
        clock.now += 5
        cache.invalidate("k", "an older token")
        assert await cache.get("k", "s", endpoint()) == "t1"  # (refresh started behind it)
        await asyncio.sleep(0.01)
        cache.invalidate("k", "t3")
        assert cache.fresh("k", "s") is None
        assert await cache.get("k", "s", endpoint()) == "t4"

    run(body)


def test_invalidation_at_most_once_per_retry_interval() -> None:
    """An upstream refusing every token does not make every request a call."""
    clock = Clock()
    cache: Exchanged[str] = Exchanged(clock=clock)
    endpoint = Endpoint(clock)

    async def body() -> None:
        assert await cache.get("k", "s", endpoint()) == "t1"
        cache.invalidate("k", "t1")
        assert await cache.get("k", "s", endpoint()) == "t2"
        cache.invalidate("k", "t2")  # again within 5 s: kept
        assert await cache.get("k", "s", endpoint()) == "t2" and endpoint.calls == 2
        clock.now += 5
        cache.invalidate("k", "t2")
        assert await cache.get("k", "s", endpoint()) == "t3"

    run(body)


def test_when_the_endpoint_fails_a_token_not_yet_expired_is_used_then_none() -> None:
    clock = Clock()
    cache: Exchanged[str] = Exchanged(clock=clock)
    endpoint = Endpoint(clock)

    async def body() -> None:
        assert await cache.get("k", "s", endpoint()) == "t1"
        endpoint.fail = "down"
        clock.now += 3600 - 10  # in its last 30 s: waited for a new one, which fails
        assert await cache.get("k", "s", endpoint()) == "t1"
        assert await cache.get("k", "s", endpoint()) == "t1" and endpoint.calls == 2
        clock.now += 10  # expired: nothing to send
        with pytest.raises(ExchangeError, match="down"):
            await cache.get("k", "s", endpoint())

    run(body)


def test_at_most_max_keys_are_remembered_the_oldest_forgotten() -> None:
    """A sandbox minting sealed tokens chooses the keys: held tokens and failures alike stay
    bounded, and a key used again is the newest."""
    clock = Clock()
    endpoint = Endpoint(clock)
    cache: Exchanged[str] = Exchanged(clock=clock, max_keys=3)

    async def body() -> None:
        for key in ("a", "b", "c"):
            await cache.get(key, "s", endpoint())
        cache.invalidate("a", "t1")
        await cache.get("a", "s", endpoint())  # obtained again: now the newest
        await cache.get("d", "s", endpoint())  # past 3: "b", the oldest, goes
        assert [cache.fresh(k, "s") is not None for k in "abcd"] == [True, False, True, True]
        endpoint.fail = "down"
        for key in ("e", "f", "g", "h"):
            with pytest.raises(ExchangeError):
                await cache.get(key, "s", endpoint())
        calls = endpoint.calls
        with pytest.raises(ExchangeError):
            await cache.get("e", "s", endpoint())  # its failure forgotten: asked again
        assert endpoint.calls == calls + 1
        with pytest.raises(ExchangeError):
            await cache.get("h", "s", endpoint())  # remembered: not asked
        assert endpoint.calls == calls + 1

    run(body)
