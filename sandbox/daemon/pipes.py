"""Pipes on the event loop: the daemon's ends of the descriptors each request hands the agent.

A reader is closed on the way out whatever happened (a cancelled request must not leak its
descriptor, nor close it twice); writes wait for the pipe rather than buffer, so a command that
does not read its stdin costs the daemon nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

LINE_MAX = 1 << 16  # the longest line a reader takes (a status line)
CHUNK = 1 << 16


@contextlib.asynccontextmanager
async def open_pipe(fd: int) -> AsyncIterator[asyncio.StreamReader]:
    """A reader of pipe `fd`, which is closed on the way out whatever happened."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_MAX)
    pipe = os.fdopen(fd, "rb", buffering=0)  # owns the descriptor from here on
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe)
    except BaseException:
        # Through the file object, never os.close(fd): a transport made before a cancel
        # closes it too, and a second close of the bare number could hit a descriptor that
        # has since been given to another request.
        pipe.close()
        raise
    try:
        yield reader
    finally:
        transport.close()


async def read_all(fd: int, cap: int) -> bytes:
    async with open_pipe(fd) as reader:
        data = b""
        while len(data) <= cap and (chunk := await reader.read(cap + 1 - len(data))):
            data += chunk
        return data[:cap]


async def pump(fd: int, name: str, queue: asyncio.Queue[tuple[str, bytes]]) -> None:
    async with open_pipe(fd) as reader:
        with contextlib.suppress(OSError):
            while chunk := await reader.read(CHUNK):
                await queue.put((name, chunk))
    await queue.put((name, b""))


async def feed(fd: int, data: bytes) -> None:
    writer = Writer(fd)
    try:
        await writer.write(data)
    finally:
        writer.close()


async def feed_from(fd: int, chunks: asyncio.Queue[bytes | None]) -> None:
    """What is put on `chunks`, as it comes, until None (or the reader goes): a background
    command's stdin."""
    writer = Writer(fd)
    try:
        while (data := await chunks.get()) is not None:
            if not await writer.write(data):
                break
    finally:
        writer.close()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Writer:
    """Non-blocking writes to a pipe on the loop; a closed reader ends them quietly."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        os.set_blocking(fd, False)

    async def write(self, data: bytes) -> bool:
        """False once the other end is gone."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view):]
            except BlockingIOError:
                ready = self._loop.create_future()
                self._loop.add_writer(self._fd, _settle, ready)
                try:
                    await ready
                finally:
                    self._loop.remove_writer(self._fd)
            except OSError:
                return False
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
