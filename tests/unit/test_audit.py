"""The audit sink keeps what it could not write, reports itself unhealthy, and catches up."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sealgate.audit import AuditLog


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_lines_survive_a_failing_sink(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path)
    log.emit("request", n=1)
    assert log._fd is not None
    os.close(log._fd)  # the sink breaks under it (a revoked mount, a rotated file)
    log.emit("request", n=2)
    assert not log.healthy
    log.emit("request", n=3)  # reopens and writes what was pending, in order
    assert log.healthy
    assert [line["n"] for line in lines(path)] == [1, 2, 3]
    log.close()


def test_forbidden_fields_never_written(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path)
    log.emit("request", authorization="Bearer canary-123", token="sg1.x", path="/a")
    log.close()
    text = path.read_text()
    assert "canary-123" not in text and "sg1.x" not in text
    assert lines(path)[0]["path"] == "/a"


def test_mode_is_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    AuditLog(path).close()
    assert path.stat().st_mode & 0o777 == 0o600


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@contextlib.contextmanager
def stdout_pipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    writer = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stdout", writer)
    try:
        yield read_end, write_end
    finally:
        monkeypatch.undo()
        for close in (writer.close, lambda: os.close(read_end)):
            with contextlib.suppress(OSError):
                close()


def test_a_closed_stdout_makes_the_log_unhealthy_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with stdout_pipe(monkeypatch) as (read_end, _):
        os.close(read_end)  # nobody reads: every write is EPIPE
        path = tmp_path / "audit.log"
        log = AuditLog(path, stdout=True)
        log.emit("request", n=1)
        wait_for(lambda: not log.healthy)
        log.emit("request", n=2)
        assert not log.healthy
        assert [line["n"] for line in lines(path)] == [1, 2]  # the file copy is whole
        log.close()


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "non-blocking"])
def test_a_stalled_stdout_reader_does_not_stall_the_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blocking: bool
) -> None:
    """A log shipper that stops reading: emitting never blocks; past the cap the log is
    unhealthy (requests refused), and healthy again once the reader catches up, with a line
    counting what the copy missed meanwhile. A stdout left non-blocking by whoever started
    the proxy is waited on, not taken for a dead reader."""
    with stdout_pipe(monkeypatch) as (read_end, write_end):
        os.set_blocking(write_end, blocking)
        path = tmp_path / "audit.log"
        log = AuditLog(path, stdout=True, copy_cap=16 * 1024)
        pad = "x" * 1000
        started = time.monotonic()
        n = 0
        while log.healthy:  # the pipe holds 64 KiB, then the copy's own 16 KiB
            n += 1
            assert n < 1000, "never became unhealthy"
            log.emit("request", n=n, pad=pad)
            time.sleep(0.001)  # let the copy's thread fill the pipe
        log.emit("request", n=n + 1, pad=pad)  # over the cap: dropped from the copy
        # A blocked emit would never return (nobody reads the pipe yet): the bound only has to
        # tell that from a machine loaded by other work.
        assert time.monotonic() - started < 15
        assert [line["n"] for line in lines(path)] == list(range(1, n + 2))
        received = bytearray()
        wait_for(lambda: received.extend(os.read(read_end, 1 << 16)) or log.healthy, timeout=15)
        log.emit("request", n=n + 2)
        log.close()
        os.set_blocking(read_end, False)
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read_end, 1 << 16):
                received.extend(chunk)
        copied = [json.loads(line) for line in received.decode().splitlines()]
        assert [c["n"] for c in copied if c["event"] == "request"] == [*range(1, n + 1), n + 2]
        assert {"event": "audit_lines_dropped", "sink": "stdout", "count": 1}.items() <= \
            copied[-2].items()
