"""The audit sink keeps what it could not write, reports itself unhealthy, and catches up."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import pytest

from proxy.audit import AuditLog


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


def test_a_closed_stdout_makes_the_log_unhealthy_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: every write is EPIPE
    broken = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stdout", broken)
    path = tmp_path / "audit.log"
    log = AuditLog(path, stdout=True)
    log.emit("request", n=1)
    log.emit("request", n=2)
    assert not log.healthy
    assert [line["n"] for line in lines(path)] == [1, 2]  # the file copy is whole
    log.close()
    monkeypatch.undo()
    with contextlib.suppress(OSError):
        broken.close()
