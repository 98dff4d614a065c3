"""Fixtures several unit modules share."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def seqpacket() -> Iterator[tuple[socket.socket, socket.socket]]:
    """Two ends of a channel as the daemon and a sandbox's agent have one (SOCK_SEQPACKET);
    the far end's reads bounded, so a test waiting on nothing fails instead of hanging."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.settimeout(10)
    with ours, theirs:
        yield ours, theirs
