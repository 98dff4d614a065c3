"""The pool's bounds (mcp/pool.py), against a plain HTTP server on loopback that counts the
connections it accepts and which of them are still open: a key's cap (a call past it gets a
connection of its own, closed after it), the cap on keys (the least recently used idle key is
closed), idle keys closed, and everything closed on close()."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from sealgate.mcp.pool import Pool, PoolKey

Body = Callable[["Counter", Pool], Awaitable[None]]


class Counter:
    """An HTTP/1.1 server answering every request `ok`, optionally after `delay` seconds."""

    def __init__(self) -> None:
        self.accepted = 0
        self.open = 0
        self.delay = 0.0
        self.port = 0
        self.heads: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        try:
            for _ in range(100):  # requests on one connection
                head = await reader.readuntil(b"\r\n\r\n")
                if not head:
                    break
                self.heads.append(head)
                await asyncio.sleep(self.delay)
                writer.write(b"HTTP/1.1 200 OK\r\nSet-Cookie: session=from-the-api; Path=/\r\n"
                             b"Content-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


def key(sandbox: str, port: int) -> PoolKey:
    return PoolKey(sandbox, "ci", "http", "origin.test", port, "127.0.0.1", None)


async def get(pool: Pool, sandbox: str, port: int) -> None:
    async with pool.session(key(sandbox, port)) as session, session.get(
            f"http://origin.test:{port}/", headers={"Host": "origin.test"}) as answer:
        assert await answer.read() == b"ok"


async def settle(condition: Callable[[], bool]) -> None:
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0.02)


def run(body: Body, pool: Pool) -> None:
    async def main() -> None:
        counter = Counter()
        server = await asyncio.start_server(counter.handle, "127.0.0.1", 0)
        counter.port = server.sockets[0].getsockname()[1]
        try:
            await asyncio.wait_for(body(counter, pool), 20)
        finally:
            await pool.close()
            server.close()
    asyncio.run(main())


def test_calls_past_a_keys_cap_get_connections_of_their_own() -> None:
    async def body(counter: Counter, pool: Pool) -> None:
        counter.delay = 0.2
        await asyncio.gather(*(get(pool, "bot-1", counter.port) for _ in range(3)))
        assert counter.accepted == 3
        await settle(lambda: counter.open == 1)
        assert counter.open == 1  # the cap's one kept, the other two closed after their call
        counter.delay = 0
        await get(pool, "bot-1", counter.port)
        assert counter.accepted == 3  # and the kept one ridden again

    run(body, Pool(per_key=1))


def test_past_the_cap_on_keys_the_least_recently_used_is_closed() -> None:
    async def body(counter: Counter, pool: Pool) -> None:
        await get(pool, "bot-1", counter.port)
        await get(pool, "bot-2", counter.port)
        await get(pool, "bot-1", counter.port)  # bot-2 is now the least recently used
        await get(pool, "bot-3", counter.port)
        assert pool.kept == 2
        await settle(lambda: counter.open == 2)
        assert (counter.accepted, counter.open) == (3, 2)
        await get(pool, "bot-1", counter.port)
        assert counter.accepted == 3  # bot-1's was kept
        await get(pool, "bot-2", counter.port)
        assert counter.accepted == 4  # bot-2's was not

    run(body, Pool(keys=2))


def test_idle_keys_are_closed_and_close_closes_everything() -> None:
    async def body(counter: Counter, pool: Pool) -> None:
        await get(pool, "bot-1", counter.port)
        await asyncio.sleep(0.4)
        await get(pool, "bot-2", counter.port)  # bot-1's key idled out on the way
        assert pool.kept == 1
        await settle(lambda: counter.open == 1)
        assert counter.open == 1
        await pool.close()
        await settle(lambda: counter.open == 0)
        assert (pool.kept, counter.open) == (0, 0)
        await get(pool, "bot-1", counter.port)  # after close: a connection of its own
        await settle(lambda: counter.open == 0)
        assert (pool.kept, counter.open, counter.accepted) == (0, 0, 3)

    run(body, Pool(idle=0.3))


def test_an_https_key_without_tls_settings_is_refused() -> None:
    async def body(counter: Counter, pool: Pool) -> None:
        bare = PoolKey("bot-1", "ci", "https", "origin.test", counter.port, "127.0.0.1", None)
        with pytest.raises(ValueError, match="TLS"):
            async with pool.session(bare):
                pass

    run(body, Pool())


def test_nothing_of_one_answer_rides_into_the_next_request() -> None:
    # A kept session has no cookie jar: an API's Set-Cookie to one call is not sent with the
    # next call on the same connection (the calls a tool makes carry what the rules put in).
    async def body(counter: Counter, pool: Pool) -> None:
        await get(pool, "bot-1", counter.port)
        await get(pool, "bot-1", counter.port)
        assert counter.accepted == 1 and len(counter.heads) == 2
        assert b"cookie" not in counter.heads[1].lower()

    run(body, Pool())

