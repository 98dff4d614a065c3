"""A small disk that fills: a 64 KiB tmpfs (root only) and a file taking its last byte."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs() -> Iterator[Path]:
    """A 64 KiB tmpfs, unmounted on the way out; the test skips where one cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mount = Path(tempfile.mkdtemp(prefix="sealgate-full-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs",
                           str(mount)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        mount.rmdir()
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        mount.rmdir()


def fill(directory: Path) -> Path:
    """A file taking every free byte of the filesystem."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (4096, 512, 64, 1):  # down to the last byte (at most 64 KiB in all)
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size) == size:
                    pass
    finally:
        os.close(fd)
    return filler
