"""The canonical log: one JSON line per decision and one per closed connection.

Lines go to a file (append-only, flushed per line) and/or stdout. A line that cannot be written
(a full disk, a revoked mount) is kept in a bounded backlog and retried before the next line, and
while any line is pending the audit log reports itself unhealthy so the proxy refuses new requests
rather than forwarding traffic nobody can account for.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import deque
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import structlog

# Field names that must never reach a log line, whatever a caller passes by mistake.
_FORBIDDEN = frozenset(
    {"authorization", "proxy_authorization", "token", "secret", "password", "query", "cookie"}
)
_BACKLOG_CAP = 100_000


def _drop_forbidden(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in _FORBIDDEN.intersection(event):
        del event[key]
    return event


class AuditLog:
    def __init__(self, path: Path | None, *, stdout: bool = False) -> None:
        self.path = path
        self._fd: int | None = None
        self._offset = 0
        self._stdout = stdout
        self._backlog: deque[str] = deque(maxlen=_BACKLOG_CAP)
        self.dropped = 0
        self._render = structlog.processors.JSONRenderer(sort_keys=False)
        self._stamp = structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts")
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._open()

    @property
    def healthy(self) -> bool:
        return not self._backlog

    def emit(self, event: str, **fields: Any) -> None:
        record: MutableMapping[str, Any] = {"event": event}
        record.update(fields)
        record = _drop_forbidden(None, "", self._stamp(None, "", record))
        line = str(self._render(None, "", record))
        if self._stdout:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        if self.path is None:
            return
        if len(self._backlog) == self._backlog.maxlen:
            self.dropped += 1  # counted, and reported once the sink recovers
        self._backlog.append(line)
        self._drain()

    def _open(self) -> None:
        assert self.path is not None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _drain(self) -> None:
        # Raw writes with an offset into the first pending line: after a short write (ENOSPC
        # half-way) the retry continues the same line instead of leaving a torn one behind.
        try:
            if self._fd is None:
                self._open()
            assert self._fd is not None
            while self._backlog:
                data = (self._backlog[0] + "\n").encode()
                self._offset += os.write(self._fd, data[self._offset :])
                if self._offset >= len(data):
                    self._backlog.popleft()
                    self._offset = 0
        except OSError:
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        if self._backlog:
            self._drain()
        self._close_fd()
