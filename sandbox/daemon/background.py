"""Commands in the background: started by an exec that returns at once with a handle, their
output kept by the daemon in a bounded ring for whoever reads it, from any offset, as often as
they like.

A background process is an ordinary exec of the session's (`Session.run`: the same agent
request, limits and confinement) whose events a task of the daemon's takes instead of an HTTP
caller. Its output is one sequence of bytes (stdout and stderr interleaved as they came, each
chunk saying which) numbered from 0; the last `RING` bytes of it are kept. A reader asks from an
offset: what fell out of the ring before it is reported (`{"lost": n}`), never skipped in
silence, and a reader that follows is woken as output comes, until the process ends (its
status is the last event). Its stdin stays open for writes until closed. It holds one of the
sandbox's request places while it runs (so the sandbox is never idle meanwhile), ends with the
sandbox, and before it only when killed. Once ended, its output is kept within a sandbox-wide
budget for ended processes (`ENDED_OUTPUT`), the latest ended first: otherwise 64 ended ones
would hold a full ring each beyond the 32 running (~96 MiB per sandbox, found by review).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..guest.protocol import SIGNALS, Op

RING = 1 << 20  # bytes of output kept per process (daemon memory: at most 32 per sandbox)
_PIECES = 4096  # chunks kept per process: tiny writes must not cost far more than their bytes
_COALESCE = 64 << 10  # a chunk grows by the next of its stream up to this
STDIN_WRITE = 1 << 20  # the most one write to a background process's stdin may carry
STDIN_QUEUED = 16  # writes waiting for the command to read them, at most
MAX_PROCESSES = 32  # in the background at once per sandbox
_ENDED_KEPT = 64  # ended ones still listed (their status readable, and what output is kept)
ENDED_OUTPUT = 4 << 20  # bytes of output kept for a sandbox's ended processes, all together


@dataclass(frozen=True)
class _Chunk:
    offset: int  # of its first byte in the process's output
    stream: str  # "stdout" | "stderr"
    data: bytes


Events = AsyncGenerator[tuple[str, Any], None]


class Control(Protocol):
    """A request to the agent about this process's exec (`Session.control`)."""

    def __call__(self, op: Op, **fields: Any) -> None: ...


class Background:
    """One process in the background and what it has written."""

    def __init__(self, pid: int, argv: list[str], events: Events,
                 stdin: asyncio.Queue[bytes | None], control: Control, *,
                 ring: int = RING,
                 ended: Callable[[Background], None] | None = None) -> None:
        self.pid = pid
        self.argv = argv
        self._control = control
        self.stdin_closed = False
        self.started = time.time()
        self.stdin = stdin
        self.status: dict[str, Any] | None = None
        self._ring = ring
        self._chunks: collections.deque[_Chunk] = collections.deque()
        self._start = 0  # the first offset still kept
        self._end = 0  # the offset the next byte will have
        self._changed = asyncio.Condition()
        self._events = events
        self._ended = ended  # told once its status is set, before any waiter is woken
        self.task = asyncio.create_task(self._collect())

    async def _collect(self) -> None:
        try:
            async for name, data in self._events:
                if name == "exit":
                    self.status = data
                else:
                    self._append(name, data)
                async with self._changed:
                    self._changed.notify_all()
        finally:
            await self._events.aclose()
            if self.status is None:
                self.status = {"exit": None, "ending": "lost",
                               "error": "the sandbox ended before the process"}
            if self._ended is not None:
                self._ended(self)
            async with self._changed:
                self._changed.notify_all()

    def _append(self, stream: str, data: bytes) -> None:
        last = self._chunks[-1] if self._chunks else None
        if last is not None and last.stream == stream \
                and len(last.data) + len(data) <= _COALESCE:
            self._chunks[-1] = _Chunk(last.offset, stream, last.data + data)
        else:
            self._chunks.append(_Chunk(self._end, stream, data))
        self._end += len(data)
        while len(self._chunks) > _PIECES:  # stdout and stderr in turn, a byte each
            dropped = self._chunks.popleft()
            self._start = dropped.offset + len(dropped.data)
        self.keep(self._ring)

    @property
    def held(self) -> int:
        """Bytes of its output kept (the chunks run from `_start` to `_end` without a gap)."""
        return self._end - self._start

    def keep(self, limit: int) -> None:
        """Only the last `limit` bytes of its output kept; readers are told the rest is lost."""
        limit = max(0, limit)
        while self._end - self._start > limit:
            first = self._chunks[0]
            over = self._end - limit - first.offset
            if over >= len(first.data):
                self._chunks.popleft()
                self._start = first.offset + len(first.data)
            else:  # keep the tail of the oldest chunk (a copy: the rest of it is freed)
                self._chunks[0] = _Chunk(first.offset + over, first.stream, first.data[over:])
                self._start = first.offset + over

    def signal(self, name: str) -> None:
        """`name` (of `SIGNALS`) to its process group, inside the sandbox: the agent there
        sends it (the daemon never signals a process id of the sandbox's). KILL is the kill
        op, after which its status says killed."""
        if self.running:
            if name == "KILL":
                self._control(Op.KILL)
            else:
                self._control(Op.SIGNAL, signal=SIGNALS[name])

    @property
    def running(self) -> bool:
        return self.status is None

    def info(self) -> dict[str, Any]:
        return {"pid": self.pid, "argv": self.argv, "started": round(self.started, 3),
                "state": "running" if self.running else "exited", "status": self.status,
                "output": {"start": self._start, "end": self._end}}

    async def output(self, offset: int, follow: bool) -> AsyncIterator[dict[str, Any]]:
        """Events from `offset` on: `{"lost": n, "offset": o}` first if the ring no longer
        holds what was asked, `{"stdout"|"stderr": base64, "offset": o}` for each piece, and
        at the end `{"exit": status...}` if the process has ended, else (not following)
        `{"offset": o, "running": true}`: where to ask from next time."""
        offset = max(0, offset)
        if offset < self._start:
            yield {"lost": self._start - offset, "offset": self._start}
            offset = self._start
        while True:
            for chunk in list(self._chunks):
                if chunk.offset + len(chunk.data) <= offset:
                    continue
                piece = chunk.data[max(0, offset - chunk.offset):]
                yield {chunk.stream: base64.b64encode(piece).decode(), "offset": offset}
                offset += len(piece)
            if offset < self._start:  # the ring moved on while the reader was slow
                yield {"lost": self._start - offset, "offset": self._start}
                offset = self._start
                continue
            if self.status is not None and offset >= self._end:
                yield {**self.status, "offset": offset}
                return
            if not follow:
                yield {"offset": offset, "running": self.status is None}
                return
            async with self._changed:
                if offset >= self._end and self.status is None:
                    await self._changed.wait()

    async def wait(self) -> dict[str, Any]:
        async with self._changed:
            await self._changed.wait_for(lambda: self.status is not None)
        assert self.status is not None
        return self.status

    def write(self, data: bytes, close: bool) -> None:
        """Bytes for its stdin (queued: the pipe's pace is the command's), then maybe its
        end. Raises ValueError once it was closed, asyncio.QueueFull while the command has not
        read what was written before."""
        if self.stdin_closed:
            raise ValueError("its stdin is closed")
        if data:
            if self.stdin.qsize() >= STDIN_QUEUED:  # the last place is kept for the end
                raise asyncio.QueueFull
            self.stdin.put_nowait(data)
        if close:
            self.stdin.put_nowait(None)
            self.stdin_closed = True

    async def cancel(self) -> None:
        """End it with its sandbox: its exec's generator kills the command on the way out."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class Processes:
    """A sandbox's background processes, by the pid the daemon gave them (1, 2, ...: not the
    sandbox's own process ids)."""

    def __init__(self) -> None:
        self.table: dict[int, Background] = {}
        self._next = 1
        self._ended: list[Background] = []  # still listed, in the order they ended

    def running(self) -> int:
        return sum(1 for p in self.table.values() if p.running)

    def add(self, argv: list[str], events: Events, stdin: asyncio.Queue[bytes | None],
            control: Control) -> Background:
        made = Background(self._next, argv, events, stdin, control, ended=self._on_end)
        self.table[made.pid] = made
        self._next += 1
        ended = [p for p in self.table.values() if not p.running]
        for old in ended[:max(0, len(ended) - _ENDED_KEPT)]:
            del self.table[old.pid]
            # An Idempotency-Key may still hold it (Session._keys): none of its output can be
            # read any more, so none is kept.
            old.keep(0)
        return made

    def _on_end(self, process: Background) -> None:
        """Ended processes' output within `ENDED_OUTPUT` in all, the latest ended keeping
        theirs: the oldest lose theirs first (said lost to a reader, their status kept)."""
        self._ended = [p for p in self._ended if self.table.get(p.pid) is p] + [process]
        room = ENDED_OUTPUT
        for ended in reversed(self._ended):
            ended.keep(room)
            room -= ended.held

    async def close(self) -> None:
        await asyncio.gather(*(p.cancel() for p in self.table.values()))
