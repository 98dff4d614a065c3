"""The streams `carry` runs over one link: the frames written whole, each descriptor's bytes as a
stream of its own, and a window per stream so that no end ever stops reading the link.
Standard library only: the pod's end imports it.

- `Link`: frames written under a lock, read by one thread; closed for good (`close`), after
  which nothing is written to its descriptor number again, whatever now holds that number.
- `Outgoing`: a descriptor this end reads, its bytes sent as `data` frames (`id`, `fd`) and then
  its end (an empty payload); it sends only within the credit the other end grants (`credit`
  frames), starting from `WINDOW`.
- `Incoming`: a descriptor this end writes, by a thread of its own as the bytes come, each
  chunk's cost granted back as credit once written. The other end may have at most `WINDOW`
  unwritten here; past it is a violation (`ValueError`: the daemon ends the link). A reader that
  went away drops the rest (still granting, so the other end reaches its end), and one that
  went while nothing comes is seen within `_LOOK_SECONDS` and ends the stream; a stream that
  ends before its end came says so (`credit` with `closed`), and the other end stops reading
  its descriptor.

A frame costs its payload plus `_COST` (the objects that hold it), so a window of tiny frames
holds no more memory than one of large ones.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import select
import socket
import threading

from .protocol import MAX_FRAME, Frames, Op, encode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

CHUNK = 1 << 16
WINDOW = 256 << 10  # per stream: what one end may send ahead of the other's writing
_COST = 64
_LOOK_SECONDS = 2.0  # how soon a writer whose reader left, with nothing arriving, ends
END = b""


def cost(payload: bytes) -> int:
    return len(payload) + _COST


class Link:
    def __init__(self, read: int, write: int, max_header: int, max_frame: int = MAX_FRAME,
                 sock: socket.socket | None = None) -> None:
        self._read, self._write, self._sock = read, write, sock
        self._lock = threading.Lock()
        self._closed = False
        self._frames = Frames(max_header, max_frame)

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        """Raises OSError once the link is closed or broken."""
        with self._lock:
            if self._closed:
                raise OSError(errno.EPIPE, "the link is closed")
            write_all(self._write, encode(header, payload))

    def frames(self) -> Iterator[tuple[dict[str, Any], bytes]]:
        """Each frame as it comes, until the stream ends. ValueError for a bad frame."""
        while chunk := os.read(self._read, CHUNK):
            yield from self._frames.feed(chunk)

    def close(self) -> None:
        """Its socket shut first (a writer blocked in it fails and lets go of the lock), then
        closed under the lock, so that no thread writes to the number again."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._closed = True
            if self._sock is not None:
                self._sock.close()


class Outgoing:
    def __init__(self, link: Link, ident: int, index: int, fd: int,
                 ended: Callable[[], None]) -> None:
        self._link, self._where, self._fd, self._ended = link, {"id": ident, "fd": index}, fd, ended
        self._credit = WINDOW
        self._cond = threading.Condition()
        self._stopped = False

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def grant(self, n: int, closed: bool = False) -> None:
        """`closed`: the other end's writing of this stream is over (its reader left): stop."""
        with self._cond:
            self._credit = min(self._credit + n, 2 * WINDOW)
            self._stopped = self._stopped or closed
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:  # credit for a whole chunk before reading one
                    while self._credit < CHUNK + _COST and not self._stopped:
                        self._cond.wait()
                    if self._stopped:
                        return
                data = os.read(self._fd, CHUNK)
                if not data:
                    break
                with self._cond:
                    self._credit -= cost(data)
                self._link.send({"op": Op.DATA, **self._where}, data)
        except OSError:
            pass
        finally:
            os.close(self._fd)
            with contextlib.suppress(OSError, ValueError):
                self._link.send({"op": Op.DATA, **self._where}, END)
            self._ended()


class Incoming:
    def __init__(self, link: Link, ident: int, index: int, fd: int,
                 ended: Callable[[], None]) -> None:
        self._link, self._where, self._fd, self._ended = link, {"id": ident, "fd": index}, fd, ended
        self._left = WINDOW  # what the other end may still send unwritten, by our count
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def put(self, payload: bytes) -> None:
        """From the link's reader, which this never holds back. ValueError past the window."""
        if payload:
            with self._lock:
                if cost(payload) > self._left:
                    raise ValueError("a stream sent past its window")
                self._left -= cost(payload)
        self._queue.put(payload)

    def _run(self) -> None:
        broken = whole = False
        try:
            while True:
                try:
                    data = self._queue.get(timeout=_LOOK_SECONDS)
                except queue.Empty:
                    if _gone(self._fd):  # its reader left, and nothing is coming
                        return
                    continue
                if not data:
                    whole = True
                    return
                if not broken:
                    try:
                        write_all(self._fd, data)
                    except OSError:  # its reader left: the rest is dropped, still granted
                        broken = True
                with self._lock:
                    self._left += cost(data)
                with contextlib.suppress(OSError):
                    self._link.send({"op": Op.CREDIT, **self._where, "n": cost(data)})
        finally:
            end(self._fd)
            self._ended()
            if not whole:  # the other end's reading of it is to stop (nothing takes it here)
                with contextlib.suppress(OSError):
                    self._link.send({"op": Op.CREDIT, **self._where, "n": 0, "closed": True})


def _gone(fd: int) -> bool:
    """Whether the reader of the pipe or socket `fd` writes to has closed its end."""
    poller = select.poll()
    poller.register(fd, 0)  # errors and hang-ups are always reported
    return bool(poller.poll(0))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def end(fd: int) -> None:
    """The end of a stream written to `fd`: a socket's writing half shut (its reader sees the
    end while its other direction goes on), anything else closed."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_WR)
        finally:
            sock.close()
        return
    with contextlib.suppress(OSError):
        os.close(fd)
