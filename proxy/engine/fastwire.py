"""HTTP/1 on the wire for the fast path (fastpath.py): a message head read within bounds, a body
read by the very readers mitmproxy's HTTP/1 layers frame it with, and a body written framed as
mitmproxy's HTTP/1 connections write it.

Framing is where two HTTP engines in one proxy could disagree (a request one of them reads as
two is a smuggled request), so nothing here parses: the head's lines are cut by h11's receive
buffer and read by mitmproxy's `read_request_head`/`read_response_head`, and a body's end found
by h11's readers through mitmproxy's `make_body_reader`, each exactly as in mitmproxy's
`_http1` module.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final

import h11
from h11._receivebuffer import ReceiveBuffer
from mitmproxy.proxy.layers.http import _http1

from ..errors import ProxyError

CHUNK: Final = 65536


class WireError(ProxyError):
    """The peer broke the message off, or framed it so that it cannot be read."""


class HeadTooLarge(WireError):
    """A head still incomplete past its bound; what was read is still in the buffer."""


class Wire:
    """One side of a connection: its reader and writer, and what was read but not yet used."""

    __slots__ = ("buf", "idle", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: Any, idle: float) -> None:
        self.reader = reader
        self.writer = writer
        self.idle = idle  # the longest wait for a body's next bytes
        self.buf = ReceiveBuffer()

    def head_now(self, limit: int) -> tuple[bytes, list[bytes]] | None:
        """The next message head if the buffer holds all of it, as it came and as its lines
        (the blank line not included); else None, or HeadTooLarge past `limit` bytes."""
        raw = bytes(self.buf)
        if (lines := self.buf.maybe_extract_lines()) is not None:
            return raw[:len(raw) - len(self.buf)], [bytes(line) for line in lines]
        if len(raw) > limit:
            raise HeadTooLarge(f"a message head over {limit} bytes")
        return None

    async def head(self, limit: int) -> tuple[bytes, list[bytes]] | None:
        """The next message head (`head_now`), read until it is whole; None if the connection
        ended before a byte of one came. Raises WireError when it ends part way. The caller
        bounds the time it may take."""
        while (head := self.head_now(limit)) is None:
            data = await self.reader.read(CHUNK)
            if not data:
                if len(self.buf):
                    raise WireError("the connection ended inside a message head")
                return None
            self.buf += data
        return head

    async def more(self) -> bool:
        """Read once more into the buffer, waiting `idle` seconds at most; False at the
        connection's end."""
        try:
            async with asyncio.timeout(self.idle):
                data = await self.reader.read(CHUNK)
        except TimeoutError:
            raise WireError(f"nothing came for {self.idle:g} s") from None
        if data:
            self.buf += data
        return bool(data)

    async def drain(self) -> None:
        """Wait until what was written can be sent, `idle` seconds at most: a peer that does
        not read is one that left (TimeoutError, an OSError, as a reset is). Nothing to wait
        for when nothing is left unsent."""
        if self.writer.transport.get_write_buffer_size():
            async with asyncio.timeout(self.idle):
                await self.writer.drain()

    def unread(self) -> bytes:
        """Everything read and not used, taken out of the buffer."""
        data, self.buf = bytes(self.buf), ReceiveBuffer()
        return data


async def body(wire: Wire, expected: int | None) -> AsyncIterator[bytes]:
    """A message's body as it comes, `expected` being mitmproxy's `expected_http_body_size`
    (None: chunked, -1: until the connection ends). Raises WireError when the peer ends it
    early or frames it wrongly; trailers, which mitmproxy's HTTP/1 layers do not handle either,
    are such an error."""
    if expected == 0:
        return
    reader = _http1.make_body_reader(expected)
    while True:
        try:
            event = reader(wire.buf)
            if event is None:
                if await wire.more():
                    continue
                event = reader.read_eof()
        except h11.ProtocolError as exc:
            raise WireError(f"HTTP/1 protocol error: {exc}") from None
        if isinstance(event, h11.Data):
            if event.data:
                yield bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            if event.headers:
                raise WireError("HTTP/1 trailers")
            return


def framed(chunk: bytes, chunked: bool) -> bytes:
    """`chunk` as one piece of a body sent chunked or as it is (mitmproxy's `send`)."""
    return b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked and chunk else chunk


def chunked(headers: Any) -> bool:
    """Whether a message with these headers is written chunked (mitmproxy's test)."""
    return "chunked" in headers.get("transfer-encoding", "").lower()
