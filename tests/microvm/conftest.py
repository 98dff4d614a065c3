"""One booted guest per test module (`guest`), with a workspace shared read-write."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.sandbox.tiers.microvm import pool
from sealgate.sandbox.tiers.microvm.channel import Channel
from tests.microvm.kit import NOBODY, spec


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    # Where the run's uid can reach it (pytest's own temporary directories are root's only), as
    # any tier's workspace must be.
    path = Path(tempfile.mkdtemp(prefix="sealgate-microvm-ws-"))
    try:
        (path / "from-host.txt").write_text("made on the host\n")
        os.chown(path, NOBODY, NOBODY)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def guest(workspace: Path) -> Iterator[Channel]:
    booted = pool.boot(spec(workspace))
    try:
        yield booted.channel
    finally:
        booted.close()
