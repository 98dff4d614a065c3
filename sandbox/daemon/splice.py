"""A body of a known length moved from the sandbox's server to the caller by splice(2), through a
pipe, never through the daemon's memory: past the head there is nothing to parse, and copying
each byte into Python and out again made the port route a quarter of a direct connection's
speed (docs/performance-sandbox-api.md).

Only where both ends are plain sockets: a caller over TLS gets the copying path (`ports`).
The caller's connection is aiohttp's; its transport has nothing buffered when this starts (it
is drained first), so the bytes written here follow the head in order. The splicing runs in
a thread of its own on descriptors of its own (`body`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import socket
import threading

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
    # Descriptors of our own for both sockets, which the thread closes at its end: the
    # caller's own closes (a cancelled request: the caller gone) never take a number from
    # under it, and asyncio watches none of a transport's.
    client = os.dup(transport.get_extra_info("socket").fileno())
    try:
        source = os.dup(server.fileno())
    except OSError:
        os.close(client)
        raise
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    def run() -> None:
        try:
            moved = _move(source, client, length, timeout)
        except BaseException as exc:  # said to the request, whatever it is
            loop.call_soon_threadsafe(_settle, done, 0, exc)
        else:
            loop.call_soon_threadsafe(_settle, done, moved, None)
        finally:
            os.close(source)
            os.close(client)

    # A thread of its own, waiting in poll(2) between splices: on the event loop every piece
    # the server writes took a turn (a reader or writer added and removed, a future), which
    # made the daemon, not the copy, the limit; and not the loop's executor, whose few threads
    # a long transfer would take from the sandboxes' set-up.
    thread = threading.Thread(target=run, name="sealgate-splice", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no thread to be had: the caller's answer is cut
        os.close(source)
        os.close(client)
        raise ConnectionError("no thread for the transfer") from None
    return await done


def _settle(done: asyncio.Future[int], moved: int, error: BaseException | None) -> None:
    if done.cancelled():  # the request ended first: the thread's end is no one's
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(moved)


def _move(server: int, client: int, length: int, timeout: float) -> int:
    out, into = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    poller = select.poll()
    try:
        with contextlib.suppress(OSError):  # a smaller pipe (the system's cap) only costs speed
            fcntl.fcntl(into, _F_SETPIPE_SZ, PIPE)
        taken = held = 0  # bytes taken from the server; of them, still in the pipe
        eof = False
        while True:
            wanted = 0 if eof else min(PIPE - held, length - taken)
            if wanted:
                try:
                    got = os.splice(server, into, wanted, flags=_FLAGS)
                    eof = got == 0
                    taken += got
                    held += got
                except BlockingIOError:
                    if not held:
                        _wait(poller, server, select.POLLIN, timeout)
                        continue
            if not held:
                if eof or taken == length:
                    return taken
                continue
            try:
                held -= os.splice(out, client, held, flags=_FLAGS)
            except BlockingIOError:
                _wait(poller, client, select.POLLOUT, timeout)
    finally:
        os.close(out)
        os.close(into)


def _wait(poller: select.poll, fd: int, event: int, timeout: float) -> None:
    poller.register(fd, event)
    try:
        if not poller.poll(timeout * 1000):
            raise TimeoutError
    finally:
        poller.unregister(fd)
