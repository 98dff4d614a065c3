"""Stopping without cutting requests in flight.

On SIGTERM a serving process stops accepting (its listening sockets close, so with several
workers the kernel sends new connections to the others), reports not ready on the control
API's health, lets the requests it is in the middle of finish, for up to the drain timeout, and
only then closes what is left (idle keep-alive connections, tunnels). A WebSocket or a tunnel
passed through undecrypted is not a request in flight: it is closed at the end of the drain.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from mitmproxy import master

from ..engine import mitm

_POLL_SECONDS = 0.02


@dataclass
class Health:
    """What the control API's health reports: set while a drain runs."""

    draining: bool = False


class _Tracks(Protocol):
    in_flight: set[str]

    def drained(self, *, waited: float, cut: int) -> None: ...


async def drain(m: master.Master, timeout: float, health: Health) -> int:
    """Stop accepting and wait for the requests in flight; returns how many the timeout cut."""
    health.draining = True
    addon: _Tracks = m.addons.get("sealgate")
    await mitm.stop_listening(m.addons.get("proxyserver"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout
    while addon.in_flight and loop.time() < deadline:
        await asyncio.sleep(_POLL_SECONDS)
    cut = len(addon.in_flight)
    addon.drained(waited=loop.time() - started, cut=cut)
    return cut
