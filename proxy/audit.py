"""The canonical log: one JSON line per decision and one per closed connection.

Lines go to a file (append-only) and/or stdout. In the proxy they are written once per event-loop
turn, however many requests finished in it: one write system call for a batch instead of one per
line. A batch that cannot be written (a full disk, a revoked mount) is kept, bounded, and retried
with the next one; until it is written the audit log reports itself unhealthy, so the proxy
refuses new requests rather than forwarding traffic nobody can account for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import structlog

# Field names that must never reach a log line, whatever a caller passes by mistake.
_FORBIDDEN = frozenset(
    {"authorization", "proxy_authorization", "token", "secret", "password", "query", "cookie"}
)
_BUFFER_CAP = 64 * 1024 * 1024


def _drop_forbidden(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in _FORBIDDEN.intersection(event):
        del event[key]
    return event


class AuditLog:
    def __init__(self, path: Path | None, *, stdout: bool = False, batch: bool = False) -> None:
        self.path = path
        self.batch = batch
        self._fd: int | None = None
        self._stdout = stdout
        self._stdout_failed = False
        self._buffer = bytearray()
        self._scheduled = False
        self._failed = False
        self.dropped = 0
        self._render = structlog.processors.JSONRenderer(sort_keys=False)
        self._second = -1
        self._second_text = ""
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._open()

    @property
    def healthy(self) -> bool:
        return not self._failed and not self._stdout_failed

    def emit(self, event: str, **fields: Any) -> None:
        record: MutableMapping[str, Any] = {"ts": self._timestamp(), "event": event}
        record.update(fields)
        record = _drop_forbidden(None, "", record)
        line = str(self._render(None, "", record)) + "\n"
        if self._stdout and not self._stdout_failed:
            try:
                sys.stdout.write(line)
                sys.stdout.flush()
            except OSError:
                # A closed pipe: the copy there is lost from now on, which makes this log
                # unhealthy (requests refused) rather than an exception inside a hook.
                self._stdout_failed = True
        if self.path is None:
            return
        if len(self._buffer) > _BUFFER_CAP:
            self.dropped += 1  # counted; the sink has been failing and requests are refused
            return
        self._buffer += line.encode()
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
                self.emit("audit_lines_dropped", count=dropped)

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        if self._buffer:
            self.flush()
        self._close_fd()
