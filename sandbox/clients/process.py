"""A command running in a sandbox's background (`Sandbox.start`): read its output from where
you left off, write to its stdin, wait for it, kill it. Standard library only, like the sync
client whose calls it makes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any, Protocol
from urllib.parse import quote

from .clientshared import DEFAULT, CallLimit, Result, output_events

Event = tuple[str, "bytes | int | Result"]


class _Answer(Protocol):
    def lines(self) -> Iterator[bytes]: ...
    def read(self, most: int | None = None) -> bytes: ...


class Calls(Protocol):
    """What of the sync `Client` a process needs (typed here: client.py imports this module)."""

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
             headers: Mapping[str, str] | None = None,
             call_timeout: CallLimit = DEFAULT) -> dict[str, Any]: ...

    def open(self, method: str, path: str, body: bytes | None = None, *,
             headers: Mapping[str, str] | None = None,
             call_timeout: CallLimit = DEFAULT) -> contextlib.AbstractContextManager[_Answer]: ...


class Process:
    """A background process of sandbox `sandbox`; `offset` is where its output was read to."""

    def __init__(self, client: Calls, sandbox: str, info: dict[str, Any]) -> None:
        self.client = client
        self.sandbox = sandbox
        self.pid = int(info["pid"])
        self.info = info
        self.offset = 0

    def _path(self, tail: str = "") -> str:
        return f"/v1/sandboxes/{quote(self.sandbox, safe='')}/processes/{self.pid}{tail}"

    def refresh(self, *, call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        self.info = self.client.call("GET", self._path(), call_timeout=call_timeout)
        return self.info

    def output(self, offset: int | None = None, *, follow: bool = False,
               call_timeout: CallLimit = None) -> Iterator[Event]:
        """("stdout" | "stderr", bytes) from `offset` (default: where the last read ended),
        ("lost", n) where the daemon's ring no longer held n bytes of it, and ("exit", Result)
        once it has ended. Without `follow` it stops at what there is now; with it, it waits
        for more until the process ends (no call limit by default)."""
        start = self.offset if offset is None else offset
        path = self._path(f"/output?offset={start}&follow={'true' if follow else 'false'}")
        with self.client.open("GET", path, call_timeout=call_timeout) as answer:
            for line in answer.lines():
                self.offset, events = output_events(line)
                yield from events

    def write(self, data: bytes, *, close: bool = False,
              call_timeout: CallLimit = DEFAULT) -> None:
        """Bytes to its stdin (at most 1 MiB a call; `sandbox_busy` while it has not read 16
        writes); `close` ends its stdin after them."""
        path = self._path(f"/stdin?close={'true' if close else 'false'}")
        with self.client.open("POST", path, bytes(data), call_timeout=call_timeout) as answer:
            self.info = json.loads(answer.read())

    def wait(self, *, call_timeout: CallLimit = None) -> Result:
        """How it ended, once it has (no call limit by default)."""
        return Result.of(self.client.call("GET", self._path("/wait"),
                                          call_timeout=call_timeout), b"", b"")

    def signal(self, name: str = "TERM", *, call_timeout: CallLimit = DEFAULT) -> None:
        """`name` (TERM, INT, HUP, QUIT, USR1, USR2, KILL) to its process group, sent inside
        the sandbox."""
        self.info = self.client.call("POST", self._path("/signal"), {"signal": name},
                                     call_timeout=call_timeout)

    def kill(self, *, call_timeout: CallLimit = DEFAULT) -> None:
        self.signal("KILL", call_timeout=call_timeout)
