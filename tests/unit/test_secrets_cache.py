"""SecretCache: TTL, refresh ahead, singleflight, stale-if-error grace, timeouts."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

import pytest

from sealgate.proxy.credentials.secrets import (
    Secret,
    SecretCache,
    SecretDenied,
    SecretNotFound,
    SecretRef,
    SecretUnavailable,
    parse_ref,
)
from sealgate.proxy.credentials.secrets.cache import REFUSED_SECONDS

REF = parse_ref("vault:kv/data/ci/github#token")
CANARY = "CANARY-cache-7f3a91"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedStore:
    """A backend whose answers the test sets; `gate` holds fetches until released."""

    scheme = "vault"

    def __init__(self, value: str = "v1", ttl: float = math.inf) -> None:
        self.value = value
        self.ttl = ttl
        self.error: Exception | None = None
        self.gate: asyncio.Event | None = None
        self.fetches = 0
        self.closed = False

    async def fetch(self, ref: SecretRef) -> tuple[Secret, float]:
        self.fetches += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return Secret(self.value), self.ttl

    async def close(self) -> None:
        self.closed = True


def run(make: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(make(), timeout=10))


def make_cache(store: ScriptedStore, clock: Clock, **kw: float) -> SecretCache:
    opts: dict[str, float] = {"ttl": 100, "refresh_ahead": 0.2, "stale_grace": 30}
    opts.update(kw)
    return SecretCache(store, clock=clock, **opts)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_hit_within_ttl_then_refetch_after_expiry_sees_rotation() -> None:
    async def body() -> None:
        clock, store = Clock(), ScriptedStore("old")
        cache = make_cache(store, clock)
        assert (await cache.get(REF)).reveal() == "old"
        clock.now += 50
        store.value = "new"
        assert (await cache.get(REF)).reveal() == "old"
        assert store.fetches == 1
        clock.now += 51
        assert (await cache.get(REF)).reveal() == "new"
        assert store.fetches == 2
        await cache.close()
        assert store.closed

    run(body)


def test_backend_ttl_shorter_than_cache_ttl_wins() -> None:
    async def body() -> None:
        clock, store = Clock(), ScriptedStore("a", ttl=10)
        cache = make_cache(store, clock, refresh_ahead=0)
        await cache.get(REF)
        clock.now += 11
        await cache.get(REF)
        assert store.fetches == 2
        await cache.close()

    run(body)


def test_refresh_ahead_returns_cached_value_and_refreshes_in_background() -> None:
    async def body() -> None:
        clock, store = Clock(), ScriptedStore("old")
        cache = make_cache(store, clock)
        await cache.get(REF)
        store.value = "new"
        clock.now += 85  # inside the last 20% of the 100 s TTL
        assert (await cache.get(REF)).reveal() == "old"
        await settle()
        assert store.fetches == 2
        assert (await cache.get(REF)).reveal() == "new"
        assert store.fetches == 2
        await cache.close()

    run(body)


def test_concurrent_misses_make_one_backend_call() -> None:
    async def body() -> None:
        clock, store = Clock(), ScriptedStore("v")
        store.gate = asyncio.Event()
        cache = make_cache(store, clock)
        waiters = [asyncio.create_task(cache.get(REF)) for _ in range(50)]
        await settle()
        store.gate.set()
        values = await asyncio.gather(*waiters)
        assert {s.reveal() for s in values} == {"v"}
        assert store.fetches == 1
        await cache.close()

    run(body)


def test_stale_within_grace_then_fail_closed() -> None:
    async def body() -> None:
        clock, store = Clock(), ScriptedStore(CANARY)
        cache = make_cache(store, clock, stale_grace=30)
        await cache.get(REF)
        store.error = SecretUnavailable("vault is sealed or down during the read (503)")
        clock.now += 100 + 29
        assert (await cache.get(REF)).reveal() == CANARY
        clock.now += 2
        with pytest.raises(SecretUnavailable) as err:
            await cache.get(REF)
        assert err.value.reason == "secret_unavailable"
        assert CANARY not in str(err.value)
        # The backend recovering ends the outage.
        store.error = None
        assert (await cache.get(REF)).reveal() == CANARY
        await cache.close()

    run(body)


@pytest.mark.parametrize(
    "error", [SecretDenied("vault denied the read"), SecretNotFound("vault has nothing")]
)
def test_denied_or_deleted_is_never_served_stale(error: Exception) -> None:
    async def body() -> None:
        clock, store = Clock(), ScriptedStore("v")
        cache = make_cache(store, clock)
        await cache.get(REF)
        store.error = error
        clock.now += 101
        with pytest.raises(type(error)):
            await cache.get(REF)
        # Evicted: even a later outage within what would have been grace fails closed.
        store.error = SecretUnavailable("down")
        clock.now += REFUSED_SECONDS  # past the remembered refusal: the store is asked again
        with pytest.raises(SecretUnavailable):
            await cache.get(REF)
        await cache.close()

    run(body)


def test_timeout_serves_stale_and_keeps_one_call_in_flight() -> None:
    async def body() -> None:
        clock, store = Clock(), ScriptedStore("v")
        cache = make_cache(store, clock, fetch_timeout=0.05)
        await cache.get(REF)
        store.gate = asyncio.Event()  # the backend now hangs
        clock.now += 101
        assert (await cache.get(REF)).reveal() == "v"
        assert (await cache.get(REF)).reveal() == "v"
        assert store.fetches == 2  # the second get joined the hanging fetch
        clock.now += 31
        with pytest.raises(SecretUnavailable, match=r"did not answer within 0\.05s"):
            await cache.get(REF)
        store.gate.set()
        await settle()
        assert (await cache.get(REF)).reveal() == "v"
        assert store.fetches == 2
        await cache.close()

    run(body)


def test_timeout_without_cached_value_fails_closed() -> None:
    async def body() -> None:
        clock, store = Clock(), ScriptedStore("v")
        store.gate = asyncio.Event()
        cache = make_cache(store, clock, fetch_timeout=0.05)
        with pytest.raises(SecretUnavailable):
            await cache.get(REF)
        await cache.close()  # cancels the hanging fetch

    run(body)


def test_unexpected_backend_error_is_unavailable_and_never_quoted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)

    async def body() -> None:
        clock, store = Clock(), ScriptedStore("v")
        store.error = RuntimeError(f"parser choked on {CANARY}")
        cache = make_cache(store, clock)
        with pytest.raises(SecretUnavailable, match="RuntimeError") as err:
            await cache.get(REF)
        assert CANARY not in str(err.value)
        assert err.value.__cause__ is None and err.value.__suppress_context__
        await cache.close()

    run(body)
    assert CANARY not in caplog.text


def test_failed_background_refresh_is_logged_and_value_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        clock, store = Clock(), ScriptedStore(CANARY)
        cache = make_cache(store, clock)
        await cache.get(REF)
        store.error = SecretUnavailable("vault failed the read of kv/data/ci/github")
        clock.now += 90
        assert (await cache.get(REF)).reveal() == CANARY
        await settle()
        assert (await cache.get(REF)).reveal() == CANARY
        await cache.close()

    run(body)
    # The reference is a field of the line (sealgate/oplog.py), the cause another.
    failed = [r for r in caplog.records if r.getMessage() == "secret fetch failed"]
    assert failed and all("kv/data/ci/github" in r.ref for r in failed)  # type: ignore[attr-defined]
    assert CANARY not in caplog.text + repr([vars(r) for r in caplog.records])


@pytest.mark.parametrize(
    "kw",
    [{"ttl": 0}, {"refresh_ahead": 1}, {"stale_grace": -1}, {"fetch_timeout": 0}],
)
def test_bad_settings_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        make_cache(ScriptedStore(), Clock(), **kw)


def test_a_refusal_is_remembered_briefly_not_asked_per_request() -> None:
    async def body() -> None:
        clock, store = Clock(), ScriptedStore("v")
        cache = make_cache(store, clock)
        store.error = SecretNotFound("vault has nothing")
        for _ in range(20):
            with pytest.raises(SecretNotFound):
                await cache.get(REF)
        assert store.fetches == 1
        store.error = None  # created meanwhile: seen once the refusal has aged out
        clock.now += REFUSED_SECONDS
        assert (await cache.get(REF)).reveal() == "v"
        await cache.close()

    run(body)
