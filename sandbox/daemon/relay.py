"""Streams through a sandbox's port once they are no longer HTTP: the bytes of an upgraded
connection (a WebSocket the sandbox's server accepted, relayed as they are, frames and masks
untouched), and a raw TCP stream carried in a WebSocket's binary messages (`/tcp/{port}`).

Each direction is a loop of one read and one write that waits for the write to drain, so
neither side can make the daemon hold more than a buffer's worth (`LIMIT`) for the other.
The client's end of sending is passed on as a half-close (the server may still answer); the
relay ends when the server's side ends, either side fails, or the sandbox ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.abc import AbstractStreamWriter

READ = 256 << 10  # bytes taken from one side at a time: one WebSocket message at most
LIMIT = 1 << 20  # the most held for a side that does not read
MAX_MESSAGE = 1 << 20  # a binary message of the TCP route's: bigger is closed with 1009


class _Feed:
    """What aiohttp's connection hands an upgraded request (`set_parser`): the client's bytes,
    queued up to LIMIT, the connection's reading paused past it."""

    def __init__(self, request: web.BaseRequest) -> None:
        self._protocol = request.protocol
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self._held = 0
        self._paused = False

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self._chunks.put_nowait(bytes(data))
        self._held += len(data)
        if self._held >= LIMIT and not self._paused:
            self._paused = True
            self._protocol.pause_reading()
        return False, b""

    def feed_eof(self) -> None:
        self._chunks.put_nowait(b"")

    async def read(self) -> bytes:
        """The next bytes; b"" at the client's end."""
        data = await self._chunks.get()
        self._held -= len(data)
        if self._paused and self._held < LIMIT:
            self._paused = False
            self._protocol.resume_reading()
        return data


async def upgraded(request: web.Request, client: AbstractStreamWriter, early: bytes,
                   stream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                   ended: asyncio.Event) -> None:
    """Relay the client's connection (its answer already sent: `client`) and the sandbox's
    (`stream`; `early` what it sent after its 101)."""
    reader, writer = stream
    feed = _Feed(request)
    request.protocol.set_parser(feed)  # type: ignore[arg-type]  # it takes any feed_data/eof

    async def inbound() -> None:
        while data := await feed.read():
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # the client is done sending; the server may still answer

    async def outbound() -> None:
        if early:
            await client.write(early)
        while data := await reader.read(READ):
            await client.write(data)
        await client.drain()

    await _both(inbound(), outbound(), ended, inbound_ends=False)


async def tcp(ws: web.WebSocketResponse, reader: asyncio.StreamReader,
              writer: asyncio.StreamWriter, ended: asyncio.Event) -> None:
    """A TCP connection carried in `ws`'s binary messages; an empty message is the client's
    end of sending (the connection's write half shut). The server's end closes `ws` (1000)."""

    async def inbound() -> None:
        async for message in ws:
            if message.type is WSMsgType.TEXT:
                await ws.close(code=WSCloseCode.UNSUPPORTED_DATA,
                               message=b"binary messages only: they are the TCP stream")
                return
            if message.type is not WSMsgType.BINARY:  # an error aiohttp closed with its code
                return
            if not message.data:
                if writer.can_write_eof():
                    writer.write_eof()
                continue
            writer.write(message.data)
            await writer.drain()

    async def outbound() -> None:
        while data := await reader.read(READ):
            await ws.send_bytes(data)
        await ws.close(code=WSCloseCode.OK, message=b"the server closed the connection")

    await _both(inbound(), outbound(), ended, inbound_ends=True)


async def _both(inbound: Awaitable[None], outbound: Awaitable[None], ended: asyncio.Event,
                *, inbound_ends: bool) -> None:
    """Until the server's direction (`outbound`) ends, either fails, or the sandbox ends. The
    client's end of sending ends it only where nothing can follow (`inbound_ends`: a closed
    WebSocket); else the server may still answer a half-closed connection."""
    into, out = asyncio.ensure_future(inbound), asyncio.ensure_future(outbound)
    gone = asyncio.ensure_future(ended.wait())
    waiting: set[asyncio.Future[Any]] = {into, out, gone}
    try:
        while out in waiting and gone in waiting:
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if into in done and (inbound_ends or into.exception() is not None):
                break
    finally:
        for task in (into, out, gone):
            task.cancel()
        for task in (into, out, gone):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
