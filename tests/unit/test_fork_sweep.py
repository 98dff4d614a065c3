"""A daemon killed mid-fork leaves its sandbox's memory in a root-only file; the next daemon to
start removes every such file of a daemon no longer alive, and leaves a live one's (a
predecessor beside its successor, during a hand-over)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sealgate.sandbox.daemon import forking


def test_sweep_removes_only_the_dead_daemons_files(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=30)
    gone = int(dead.stdout)  # exited: its pid names no process (reused only after wrapping)
    left = tmp_path / f"{gone}-sb-abc-0123abcd.mem"
    mine = tmp_path / f"{os.getpid()}-sb-def-4567cdef.mem"
    other = tmp_path / "notes.txt"  # not a memory file: never touched
    for path in (left, mine, other):
        path.write_bytes(b"memory")
    assert forking.sweep(tmp_path) == 1
    assert not left.exists() and mine.exists() and other.exists()
    assert forking.sweep(tmp_path / "none") == 0  # no directory yet: nothing to do
