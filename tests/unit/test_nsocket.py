"""The socket the daemon makes in a sandbox's network namespace (`sandbox.host.nsocket`), when
it cannot be made: the daemon out of descriptors. Found by review: the thread that enters the
namespace let the OSError escape (a traceback on stderr, the daemon's log), and the port route
answered a bug (`internal_error`) instead of its refusal."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.reasons import Reason
from sealgate.sandbox.daemon import ports
from sealgate.sandbox.daemon.session import SessionError
from sealgate.sandbox.host import nsocket

OWN = Path("/proc/self/ns/net")  # a network namespace's file: our own


@contextlib.contextmanager
def no_descriptors() -> Iterator[None]:
    """No new descriptor to be had (EMFILE) while it lasts: the soft limit at the lowest free
    one, which every open would take."""
    free = os.open("/dev/null", os.O_RDONLY)
    os.close(free)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (free, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_out_of_descriptors_is_a_namespace_error_never_a_traceback(
        capfd: pytest.CaptureFixture[str]) -> None:
    with no_descriptors(), pytest.raises(nsocket.NamespaceError) as failed:
        nsocket.socket_in(OWN)
    assert "Too many open files" in str(failed.value), failed.value
    assert "Traceback" not in capfd.readouterr().err


def test_the_port_route_says_port_unreachable(capfd: pytest.CaptureFixture[str]) -> None:
    async def connect() -> None:
        await asyncio.to_thread(int)  # the loop's threads and their module, before the limit
        with no_descriptors():
            await ports.connect(OWN, 9)

    with pytest.raises(SessionError) as refused:
        asyncio.run(connect())
    assert refused.value.reason is Reason.PORT_UNREACHABLE, refused.value
    assert "Traceback" not in capfd.readouterr().err
