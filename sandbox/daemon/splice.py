"""A body of a known length moved from the sandbox's server to the caller by splice(2), through a
pipe, never through the daemon's memory: past the head there is nothing to parse, and copying
each byte into Python and out again made the port route a quarter of a direct connection's
speed (docs/performance-sandbox-api.md).

Only where both ends are plain sockets: a caller over TLS gets the copying path (`ports`).
The caller's connection is aiohttp's; its transport has nothing buffered when this starts (it
is drained first), so the bytes written here follow the head in order, and its writability
is waited for here on a descriptor of our own (asyncio refuses to watch a transport's).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

PIPE = 1 << 20  # the pipe's size: what one splice moves at most
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_F_SETPIPE_SZ = 1031


def usable(request: web.Request) -> bool:
    """Whether the caller's connection is a plain socket splice can write to."""
    transport = request.transport
    return (transport is not None and transport.get_extra_info("sslcontext") is None
            and transport.get_extra_info("socket") is not None)


async def body(server: socket.socket, request: web.Request, writer: AbstractStreamWriter,
               length: int, timeout: float) -> int:
    """`length` bytes from `server` to the caller (whose answer's `writer` has sent its head),
    `timeout` the most a wait may take. The number moved: fewer when the server closed early
    (the caller sees a cut body)."""
    transport = request.transport
    assert transport is not None
    # Whatever the transport still queues goes first: with its high-water mark at 0 the
    # writer's drain waits until nothing is queued (the mark is put back after).
    low, high = transport.get_write_buffer_limits()
    transport.set_write_buffer_limits(high=0)
    try:
        await writer.drain()
    finally:
        transport.set_write_buffer_limits(high=high, low=low)
    # A descriptor of our own for the caller's socket: asyncio watches none of a transport's.
    client = os.dup(transport.get_extra_info("socket").fileno())
    out, into = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        with contextlib.suppress(OSError):  # a smaller pipe (the system's cap) only costs speed
            fcntl.fcntl(into, _F_SETPIPE_SZ, PIPE)
        taken = held = 0  # bytes taken from the server; of them, still in the pipe
        eof = False
        while True:
            wanted = 0 if eof else min(PIPE - held, length - taken)
            if wanted:
                try:
                    got = os.splice(server.fileno(), into, wanted, flags=_FLAGS)
                    eof = got == 0
                    taken += got
                    held += got
                except BlockingIOError:
                    if not held:
                        await _ready(server.fileno(), timeout, write=False)
                        continue
            if not held:
                if eof or taken == length:
                    return taken
                continue
            try:
                held -= os.splice(out, client, held, flags=_FLAGS)
            except BlockingIOError:
                await _ready(client, timeout, write=True)
    finally:
        for fd in (out, into, client):
            os.close(fd)


async def _ready(fd: int, timeout: float, *, write: bool) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await asyncio.wait_for(ready, timeout)
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)
