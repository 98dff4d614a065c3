"""The workspace's files beyond put and get, through a sandbox's agent: list, stat, mkdir,
remove, rename, a directory in and out as a tar stream, and watch. Each is an op its shim
serves inside the sandbox, as the sandbox's uid (`guest/fsops.py`, `tarball.py`, `watch.py`):
the daemon never touches the sandbox's files itself, it sends the request and reads the
sandbox's word, bounded like put's and get's (`session`).

A watch's events come through a bounded queue: a caller that reads more slowly than the
sandbox changes loses events, never the daemon's memory, and is told where (`overflow`, with
how many were dropped); the events after it are whole again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from sealgate.reasons import Reason

from ..guest.protocol import FIELDS, STATUS_MAX, Op
from . import replies
from .pipes import Writer, open_pipe, read_all
from .session import Session, SessionError, check_path, stalled

MAX_ENTRIES = 100_000  # a directory's, listed at once
MAX_LISTING = 32 << 20  # its JSON
MAX_UNPACKED = 1 << 30  # a tar stream's bytes, decompressed (the sandbox's tmpfs caps it too)
MAX_MEMBERS = 200_000
WATCH_QUEUE = 4096  # events held for a caller before they are dropped
# ... and their bytes: events of 60 KB paths (235 directories of 250-character names) made
# 4096 of them a quarter of a GiB per watch whose caller stopped reading (found by review).
WATCH_QUEUE_BYTES = 1 << 20
_LAST_WORD_SECONDS = 10.0  # for a tar's status after its data
_CHUNK = 1 << 16


def check_dir(path: str) -> str:
    """A directory of the workspace; "" for the workspace itself."""
    return path if path == "" else check_path(path)


def _fail(path: str, answer: dict[str, Any]) -> SessionError:
    if answer.get("refused"):
        reason = Reason.BAD_ARCHIVE
    elif answer.get("exists"):
        reason = Reason.FILE_EXISTS
    else:
        reason = replies.file_reason(answer)
    return SessionError(f"{path or '/workspace'}: {answer.get('error', 'no answer')}",
                        reason=reason)


async def _ask(session: Session, op: Op, path: str, data: int | None = None,
               **fields: Any) -> tuple[dict[str, Any], int]:
    """Send `op` with a status pipe (and `data`, the agent's end of a data pipe, if any, which
    is closed here either way); its status line and the request's id. The request stays
    counted (`Session.begin`) until the caller's `_end`."""
    async with contextlib.AsyncExitStack() as kept:
        answer, ident, _ = await _asked(kept, session, op, path, data=data, fields=fields)
        return answer, ident


async def _asked(kept: contextlib.AsyncExitStack, session: Session, op: Op, path: str, *,
                 data: int | None, fields: dict[str, Any]
                 ) -> tuple[dict[str, Any], int, asyncio.StreamReader]:
    """`_ask`, its status pipe's reader left open in `kept`, for a status after the first."""
    try:
        ident = session.begin()
    except BaseException:
        if data is not None:
            os.close(data)
        raise
    try:
        status_r, status_w = os.pipe()
        try:
            where = {"path": path} if "path" in FIELDS[op] else {}
            session.send(op, ident, [fd for fd in (data, status_w) if fd is not None],
                          **where, **fields)
        except SessionError:
            os.close(status_r)
            raise
        reader = await kept.enter_async_context(open_pipe(status_r))
        try:
            line = await stalled(reader.readline(), "did not answer")
        except ValueError:
            line = b""
        answer = replies.status(line)
        if "error" in answer:
            raise _fail(path, answer)
        return answer, ident, reader
    except BaseException:
        session.end()
        raise


async def stat(session: Session, path: str) -> dict[str, Any]:
    answer, _ = await _ask(session, Op.STAT, check_dir(path))
    session.end()
    entry: dict[str, Any] = answer.get("entry", {})
    return entry


async def mkdir(session: Session, path: str, mode: int, parents: bool) -> bool:
    answer, _ = await _ask(session, Op.MKDIR, check_path(path), mode=mode, parents=parents)
    session.end()
    return bool(answer.get("created"))


async def remove(session: Session, path: str, recursive: bool) -> None:
    await _ask(session, Op.REMOVE, check_path(path), recursive=recursive)
    session.end()


async def rename(session: Session, path: str, to: str) -> None:
    await _ask(session, Op.RENAME, check_path(path), to=check_path(to))
    session.end()


async def listing(session: Session, path: str) -> list[dict[str, Any]]:
    data_r, data_w = os.pipe()
    try:
        answer, _ = await _ask(session, Op.LIST, check_dir(path), data_w, limit=MAX_ENTRIES)
    except BaseException:
        os.close(data_r)
        raise
    try:
        size = int(answer.get("size", 0))
        if size > MAX_LISTING:
            os.close(data_r)
            raise SessionError(f"{path}: a listing over {MAX_LISTING} bytes",
                               reason=Reason.TOO_LARGE)
        raw = await stalled(read_all(data_r, size), "stopped sending the listing")
        entries = json.loads(raw or b"null")
        if not isinstance(entries, list) or len(raw) != size:
            raise SessionError(f"{path}: the sandbox's listing was cut short",
                               reason=Reason.SANDBOX_FAILED)
        return entries
    finally:
        session.end()


async def untar(session: Session, path: str, body: AsyncIterator[bytes]) -> dict[str, Any]:
    """Unpack the tar (or gzipped tar) `body` into the directory `path`, all or nothing."""
    check_dir(path)
    data_r, data_w = os.pipe()
    writer = Writer(data_w)
    asked = asyncio.create_task(_ask(session, Op.UNTAR, path, data_r, max_bytes=MAX_UNPACKED,
                                     max_entries=MAX_MEMBERS))
    try:
        async for chunk in body:
            if asked.done() or not await stalled(writer.write(chunk), "stopped reading"):
                break  # refused already: the rest of the body is not wanted
    except BaseException:
        asked.cancel()  # the agent sees a cut stream and refuses it
        raise
    finally:
        writer.close()
    answer, _ = await stalled(asked, "did not say how the unpacking went")
    session.end()
    return answer


class Stream:
    """A shim's data, read as it is sent until it ends; `aclose` ends the request whether or
    not it was read, and asks the agent to kill its shim (a watch runs until then)."""

    def __init__(self, session: Session, ident: int, fd: int,
                 status: tuple[contextlib.AsyncExitStack, asyncio.StreamReader] | None = None
                 ) -> None:
        self._session, self._ident, self._fd = session, ident, fd
        self._open = True
        self._status = status

    async def whole(self) -> bool:
        """After its data: whether the shim said it sent all of it (a tar's last status).
        Without that word the stream was cut, however it ended."""
        if self._status is None:
            return False
        try:
            line = await asyncio.wait_for(self._status[1].readline(), _LAST_WORD_SECONDS)
        except (TimeoutError, ValueError, OSError):
            return False
        return replies.status(line).get("done") is True

    def detach(self) -> int:
        """Its data's descriptor, the caller's to read and close (a thread's, say)."""
        fd, self._fd = self._fd, -1
        return fd

    async def chunks(self, stall: bool = True) -> AsyncGenerator[bytes, None]:
        fd, self._fd = self._fd, -1
        async with open_pipe(fd) as reader:
            while chunk := await (stalled(reader.read(_CHUNK), "stopped sending")
                                  if stall else reader.read(_CHUNK)):
                yield chunk

    async def aclose(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._status is not None:
            await self._status[0].aclose()
            self._status = None
        if self._open:
            self._open = False
            self._session.control(Op.KILL, self._ident)
            self._session.end()


async def tar(session: Session, path: str) -> Stream:
    """The directory as a tar stream; its `whole()` says, after it, whether it is all there
    (a file that could not be read, a tree too deep, cut it short at a member's boundary,
    which a tar reader takes for the archive's end)."""
    return await _streamed(session, Op.TAR, check_dir(path))


async def layer(session: Session) -> Stream:
    """An image's microVM sandbox's root as a layer's tar stream, made by its guest
    (`guest/tarout.layer`); `whole()` as a tar's. Untrusted: the guest is the sandbox's."""
    return await _streamed(session, Op.LAYER, "")


async def save(session: Session, fd: int) -> int:
    """A microVM's memory written into `fd` (a file's, kept open by the caller: `forking`),
    the VM continued after; the bytes written."""
    answer, _ = await _ask(session, Op.SAVE, "its memory snapshot", os.dup(fd))
    session.end()
    return int(answer.get("size", 0))


async def _streamed(session: Session, op: Op, path: str) -> Stream:
    data_r, data_w = os.pipe()
    kept = contextlib.AsyncExitStack()
    try:
        _, ident, reader = await _asked(kept, session, op, path, data=data_w, fields={})
    except BaseException:
        os.close(data_r)
        await kept.aclose()
        raise
    return Stream(session, ident, data_r, (kept, reader))


async def watch(session: Session, path: str, recursive: bool) -> tuple[int, Stream]:
    """The watch's directories in place (their count) and the stream of its events."""
    data_r, data_w = os.pipe()
    try:
        answer, ident = await _ask(session, Op.WATCH, check_dir(path), data_w,
                                   recursive=recursive)
    except BaseException:
        os.close(data_r)
        raise
    return int(answer.get("watching", 0)), Stream(session, ident, data_r)


_EVENTS = frozenset({"create", "modify", "chmod", "delete", "rename", "overflow"})
_FIELDS = {"path": str, "from": str, "detail": str, "dir": bool}


def _event(line: bytes) -> bytes | None:
    """A line of the watch shim's as the caller gets it: a known event with only its known
    fields, typed, written anew; None for anything else (the shim runs as the sandbox's uid,
    and its caller must never be handed what the workload put there)."""
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("event") not in _EVENTS:
        return None
    event = {"event": raw["event"]}
    for name, kind in _FIELDS.items():
        if name in raw:
            if not isinstance(raw[name], kind):
                return None
            event[name] = raw[name]
    return json.dumps(event).encode() + b"\n"


async def events(stream: Stream, limit: int = WATCH_QUEUE,
                 limit_bytes: int = WATCH_QUEUE_BYTES) -> AsyncGenerator[bytes, None]:
    """A watch's events (NDJSON lines) for a caller, through a queue of `limit` events and
    `limit_bytes`: once it is full, events are dropped until the caller has taken what it
    holds; then it is told `{"event": "overflow", "dropped": N}` and the events go on from
    there."""
    queue: collections.deque[bytes] = collections.deque()
    held = 0  # the queue's bytes
    dropped = 0
    more = asyncio.Event()
    ended = False

    async def fill() -> None:
        nonlocal dropped, ended, held
        pending = b""
        try:
            async for chunk in stream.chunks(stall=False):
                *lines, pending = (pending + chunk).split(b"\n")
                if len(pending) > STATUS_MAX:  # no event is this long: the shim is not ours
                    break
                for line in lines:
                    if (event := _event(line)) is None:
                        return  # not an event of the shim's: the watch ends (its caller sees)
                    if dropped or len(queue) >= limit or held + len(event) > limit_bytes:
                        dropped += 1
                    else:
                        queue.append(event)
                        held += len(event)
                more.set()
        finally:
            ended = True
            more.set()

    filler = asyncio.create_task(fill())
    try:
        while True:
            await more.wait()
            more.clear()
            while queue:
                event = queue.popleft()
                held -= len(event)
                yield event
            if dropped:
                said, dropped = dropped, 0
                yield json.dumps({"event": "overflow", "dropped": said}).encode() + b"\n"
            if ended:
                return
    finally:
        filler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await filler
