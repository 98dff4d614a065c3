"""The canonical log: one JSON line per decision and one per closed connection.

Lines go to a file (append-only) and/or stdout. In the proxy the file is written once per
event-loop turn, however many requests finished in it: one write system call for a batch instead
of one per line. A batch that cannot be written (a full disk, a revoked mount) is kept, bounded,
and retried with the next one; until it is written the audit log reports itself unhealthy, so the
proxy refuses new requests rather than forwarding traffic nobody can account for.

The stdout copy is written by a thread of its own: stdout is usually a pipe to a log shipper, and
a reader that stops reading would otherwise stop the event loop, and every request with it. What
the reader has not taken yet is kept, bounded; past the bound the log is unhealthy (requests
refused) until the reader catches up. A closed pipe makes it unhealthy for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Field names that must never reach a log line, whatever a caller passes by mistake.
_FORBIDDEN = frozenset(
    {"authorization", "proxy_authorization", "token", "secret", "password", "query", "cookie"}
)
_BUFFER_CAP = 64 * 1024 * 1024


# One encoder, made once: json.dumps with any option builds a new one per call. Values JSON
# does not know are written as their repr, never as an error inside a hook.
_encode = json.JSONEncoder(default=repr).encode


class _Copy:
    """Lines written to a file descriptor by a thread of its own, so that a stalled reader
    stalls only that thread. The cap counts what waits and what is being written."""

    def __init__(self, fd: int, cap: int) -> None:
        self._fd = fd
        self._cap = cap
        self._pending = bytearray()
        self._writing = 0  # bytes of the batch the thread is writing now
        self._wake = threading.Condition()
        self._closing = False
        self.broken = False  # a write failed: the reader is gone
        self.dropped = 0  # lines refused while over the cap
        self._thread = threading.Thread(target=self._run, name="sealgate-audit-copy", daemon=True)
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return not self.broken and len(self._pending) + self._writing <= self._cap

    def put(self, data: bytes) -> None:
        with self._wake:
            if self.broken:
                return
            if len(self._pending) + self._writing > self._cap:
                self.dropped += 1
                return
            self._pending += data
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closing:
                    self._wake.wait()
                if not self._pending:
                    return
                # Handed over, not copied: the event loop waits for this lock.
                batch, self._pending = self._pending, bytearray()
                self._writing = len(batch)
            try:
                self._write(memoryview(batch))
            except OSError:
                with self._wake:
                    self.broken = True
                    self._pending.clear()
                return
            finally:
                self._writing = 0

    def _write(self, view: memoryview) -> None:
        while view:
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:
                # A stdout left non-blocking by whoever started us: a full pipe means wait.
                select.select([], [self._fd], [])

    def close(self, timeout: float) -> None:
        """Write what is pending, waiting at most `timeout` for a slow reader."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout)


class AuditLog:
    def __init__(
        self, path: Path | None, *, stdout: bool = False, batch: bool = False,
        copy_cap: int = _BUFFER_CAP,
    ) -> None:
        self.path = path
        self.batch = batch
        self._fd: int | None = None
        self._copy = _Copy(sys.stdout.fileno(), copy_cap) if stdout else None
        self._buffer = bytearray()
        self._scheduled = False
        self._failed = False
        self.dropped = 0
        self._second = -1
        self._second_text = ""
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._open()

    @property
    def healthy(self) -> bool:
        return not self._failed and (self._copy is None or self._copy.healthy)

    @property
    def backlog(self) -> int:
        """Bytes of lines waiting to be written (more than a turn's worth: the file is failing)."""
        return len(self._buffer)

    def emit(self, event: str, **fields: Any) -> None:
        if not _FORBIDDEN.isdisjoint(fields):
            fields = {k: v for k, v in fields.items() if k not in _FORBIDDEN}
        data = (_encode({"ts": self._timestamp(), "event": event, **fields}) + "\n").encode()
        if self._copy is not None:
            if self._copy.dropped and self._copy.healthy:
                dropped, self._copy.dropped = self._copy.dropped, 0
                self.emit("audit_lines_dropped", sink="stdout", count=dropped)
            self._copy.put(data)
        if self.path is None:
            return
        if len(self._buffer) > _BUFFER_CAP:
            self.dropped += 1  # counted; the sink has been failing and requests are refused
            return
        self._buffer += data
        if not self.batch:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def _timestamp(self) -> str:
        # ISO 8601 UTC with milliseconds; the seconds part is formatted once per second, since
        # datetime formatting per line was a visible share of the proxy's per-request cost.
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._second_text}.{int((now - second) * 1000):03d}Z"

    def _open(self) -> None:
        assert self.path is not None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def flush(self) -> None:
        # A short write (ENOSPC half-way) leaves the rest in the buffer: the retry continues
        # exactly where it stopped, so no line is lost or torn.
        self._scheduled = False
        try:
            if self._fd is None:
                self._open()
            assert self._fd is not None
            while self._buffer:
                del self._buffer[: os.write(self._fd, self._buffer)]
        except OSError:
            self._failed = True
            self._close_fd()
        else:
            self._failed = False
            if self.dropped:
                dropped, self.dropped = self.dropped, 0
                self.emit("audit_lines_dropped", sink="file", count=dropped)

    def retry(self) -> None:
        """Write what waits now, if the file is what failed (a full disk may have room)."""
        if self.path is not None and self._failed:
            self.flush()

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        if self._buffer:
            self.flush()
        self._close_fd()
        if self._copy is not None:
            self._copy.close(timeout=2.0)
