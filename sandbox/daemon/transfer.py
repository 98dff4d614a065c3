"""A workspace file written whole (put) or read as it is sent (get), through the sandbox's
agent: each with pipes of its own, a status line that is the sandbox's word, and no more than
`IO_STALL` seconds without progress before it fails rather than hang."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from sealgate.reasons import Reason

from ..guest.protocol import STATUS_MAX, Op
from .pipes import Writer, open_pipe, read_all
from .replies import file_reason, status
from .session import Session, SessionError, check_path, stalled

__all__ = ["Download", "get", "put"]

_CHUNK = 1 << 16


async def put(session: Session, path: str, size: int, mode: int,
              body: AsyncIterator[bytes]) -> int:
    """Write `size` bytes from `body` to `path` of the workspace (replacing, never through a
    link); the size written."""
    check_path(path)
    ident = session.begin()
    try:
        data_w, status_r = _asked(session, Op.PUT, ident, True, path=path, size=size, mode=mode)
        status_task = asyncio.create_task(read_all(status_r, STATUS_MAX))
        writer = Writer(data_w)
        try:
            async for chunk in body:
                if not await stalled(writer.write(chunk), "stopped reading the file"):
                    break
        except BaseException:
            status_task.cancel()  # the agent sees a short file and drops it
            raise
        finally:
            writer.close()
        answer = status(await stalled(status_task, "did not say how the write went"))
        if "error" in answer:
            raise SessionError(f"{path}: {answer['error']}", reason=file_reason(answer))
        # The agent's word, checked as get checks it: a size written that is not a count of at
        # most the bytes sent (a hostile agent's) is the sandbox's failure, not a bug's 500.
        written = answer.get("size")
        if type(written) is not int or not 0 <= written <= size:
            raise SessionError(f"{path}: the sandbox's agent answered a size that is not one",
                               reason=Reason.SANDBOX_FAILED)
        return written
    finally:
        session.end()


async def get(session: Session, path: str, limit: int) -> tuple[int, Download]:
    """The size of `path` of the workspace and its bytes, read as they are sent."""
    check_path(path)
    ident = session.begin()
    try:
        data_r, status_r = _asked(session, Op.GET, ident, False, path=path, limit=limit)
        async with open_pipe(status_r) as reader:
            try:
                line = await asyncio.wait_for(reader.readline(), 30.0)
            except (TimeoutError, ValueError):
                line = b""
        answer = status(line)
        if "error" in answer or "size" not in answer:
            os.close(data_r)
            raise SessionError(f"{path}: {answer.get('error', 'no answer')}",
                               reason=file_reason(answer))
        # The agent's word, checked: a size that is not a count within the limit (a hostile
        # agent's) is refused here, its pipe closed and its place given back, rather than
        # escaping as a 500 and keeping both (found by review).
        size = answer["size"]
        if type(size) is not int or not 0 <= size <= limit:
            os.close(data_r)
            raise SessionError(f"{path}: the sandbox's agent answered a size that is not one",
                               reason=Reason.SANDBOX_FAILED)
    except BaseException:
        session.end()
        raise
    return size, Download(data_r, size, session.end)


def _asked(session: Session, op: Op, ident: int, agent_reads: bool, **fields: Any
           ) -> tuple[int, int]:
    """`op` sent with a data pipe (the agent's end its read end if `agent_reads`) and a status
    pipe; our ends of both, (data, status), closed here if it could not be sent."""
    data_r, data_w = os.pipe()
    status_r, status_w = os.pipe()
    ours, theirs = (data_w, data_r) if agent_reads else (data_r, data_w)
    try:
        session.send(op, ident, [theirs, status_w], **fields)
    except SessionError:
        os.close(ours)
        os.close(status_r)
        raise
    return ours, status_r


class Download:
    """A file's bytes as the agent sends them, at most the size it announced. `aclose` ends
    it whether or not it was read (an async generator never started would not run its
    clean-up, leaving the pipe open and the sandbox counting a request forever)."""

    def __init__(self, fd: int, size: int, done: Callable[[], None]) -> None:
        self._fd = fd
        self.size = size
        self._done: Callable[[], None] | None = done
        self._chunks: AsyncGenerator[bytes, None] | None = None

    def __aiter__(self) -> AsyncGenerator[bytes, None]:
        if self._chunks is None:
            self._chunks = self._read()
        return self._chunks

    async def _read(self) -> AsyncGenerator[bytes, None]:
        fd, self._fd = self._fd, -1
        try:
            async with open_pipe(fd) as reader:
                left = self.size
                while left > 0 and (chunk := await stalled(reader.read(min(_CHUNK, left)),
                                                            "stopped sending the file")):
                    left -= len(chunk)
                    yield chunk
        finally:
            self._finish()

    async def aclose(self) -> None:
        if self._chunks is not None:
            await self._chunks.aclose()
        if self._fd >= 0:  # never started: its generator's clean-up would not run
            os.close(self._fd)
            self._fd = -1
        self._finish()

    def _finish(self) -> None:
        done, self._done = self._done, None
        if done is not None:
            done()
