"""An upstream connection mitmproxy drops without closing its writer (proxy/engine/pool.py).

mitmproxy closes a server connection's writer only at the end of `handle_connection`; its
`open_connection` runs the `server_connected` hook and the layer's event between the dial and
that, so a task cancelled there (its client left while a hook awaited) or failed there (its
assertion on the peer's address) never closes it. The pool's entry for the connection, and
the socket with it, stayed for the life of the worker."""

from __future__ import annotations

import asyncio
import gc
import types
from collections.abc import Awaitable, Callable

import pytest
from mitmproxy import connection, options
from mitmproxy.proxy import commands, mode_specs, server

from sealgate.proxy.engine import pool


class _Writer:
    """The client side's writer: all a connection handler asks of it before it serves."""

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default)


class _Handler(server.LiveConnectionHandler):
    """mitmproxy's connection handler with one hook of its own: `server_connect` claims the
    dial for the pool (as the pipeline does), `server_connected` runs `connected`."""

    def __init__(self, kept: pool.Pool, connected: Callable[[], Awaitable[None]]) -> None:
        super().__init__(None, _Writer(), options.Options(),  # type: ignore[arg-type]
                         mode_specs.ProxyMode.parse("regular"))
        self.kept, self.connected = kept, connected

    async def handle_hook(self, hook: commands.StartHook) -> None:
        (data,) = hook.args()
        if hook.name == "server_connect":
            key = pool.Key(data.server.address, None, False, (), "bot-1")
            pool.claim(data.server, key)
        elif hook.name == "server_connected":
            await self.connected()


async def _origin() -> tuple[asyncio.Server, asyncio.Event]:
    """A loopback origin; its event is set when a connection to it ends."""
    ended = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        ended.set()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0), ended


async def _dropped(monkeypatch: pytest.MonkeyPatch,
                   connected: Callable[[], Awaitable[None]], *, cancel: bool) -> None:
    kept = pool.Pool(5.0)
    monkeypatch.setattr(server, "asyncio", types.SimpleNamespace(
        **{**vars(asyncio), "open_connection": kept.dial}))
    origin, ended = await _origin()
    port = origin.sockets[0].getsockname()[1]
    handler = _Handler(kept, connected)
    upstream = connection.Server(address=("127.0.0.1", port))
    task = asyncio.ensure_future(handler.open_connection(commands.OpenConnection(upstream)))
    for _ in range(500):  # until the dial is done, and so the hook reached (no await between)
        if upstream.peername is not None:
            break
        await asyncio.sleep(0.01)
    assert len(kept._live) == 1
    if cancel:  # as handle_client does when the client leaves
        task.cancel()
    await asyncio.wait([task])
    assert task.cancelled() if cancel else isinstance(task.exception(), AssertionError)
    del task, handler  # mitmproxy's handler ends with its client; the writer goes with it
    gc.collect()
    await asyncio.wait_for(ended.wait(), 5)  # the socket closed
    assert not kept._live
    origin.close()


def test_a_dial_whose_handler_is_cancelled_before_reading_is_closed_and_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def waits() -> None:
        await asyncio.Event().wait()

    asyncio.run(_dropped(monkeypatch, waits, cancel=True))


def test_a_dial_whose_handler_fails_before_reading_is_closed_and_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def fails() -> None:
        await asyncio.sleep(0)
        raise AssertionError("as mitmproxy's assertion on the peer's address")

    asyncio.run(_dropped(monkeypatch, fails, cancel=False))
