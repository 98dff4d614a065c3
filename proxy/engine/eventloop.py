"""The event loop the proxy's processes run on: uvloop where it is installed, asyncio's own
where it is not or where it is asked for (`--event-loop asyncio`).

Why uvloop: mitmproxy's per-request work is Python either way, but the loop's own share (the
selector, its handles, the socket transports' reads and writes) is C under uvloop. Measured
with bench/ab.py (docs/performance.md): kept-alive plain HTTP and intercepted HTTPS ~1.1-1.2x
req/s on one core; a new connection per request the same. The whole test suite runs the
proxy processes on it; asyncio's loop stays one flag away, and is what the proxy falls back
to on a platform uvloop has no build for.

What differs for sealgate's own code: uvloop's socket transports are not subclasses of
asyncio.Transport (the splice checks a transport by `stream_transport`, not isinstance).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from ..errors import ProxyError

Choice = Literal["auto", "uvloop", "asyncio"]
CHOICES: tuple[Choice, ...] = ("auto", "uvloop", "asyncio")

_T = TypeVar("_T")


class EventLoopUnavailable(ProxyError):
    """`--event-loop uvloop` where uvloop cannot be imported."""


def _uvloop() -> Any | None:
    try:
        return importlib.import_module("uvloop")
    except ImportError:
        return None


def factory(choice: Choice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop factory for `choice`; None is asyncio's default loop."""
    if choice == "asyncio":
        return None
    uvloop = _uvloop()
    if uvloop is None:
        if choice == "uvloop":
            raise EventLoopUnavailable(
                "--event-loop uvloop: uvloop is not installed (pip install uvloop)")
        return None
    new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return new_loop


def name(loop: asyncio.AbstractEventLoop) -> str:
    """What a loop is, for the start line: "uvloop" or "asyncio"."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, _T], choice: Choice) -> _T:
    """asyncio.run(main) on the loop `choice` names."""
    with asyncio.Runner(loop_factory=factory(choice)) as runner:
        return runner.run(main)


def _stream_transport_types() -> tuple[type, ...]:
    uvloop = _uvloop()
    tcp = getattr(getattr(uvloop, "loop", None), "TCPTransport", None)
    return (asyncio.Transport,) if tcp is None else (asyncio.Transport, tcp)


_STREAM_TRANSPORTS = _stream_transport_types()


def stream_transport(transport: object) -> bool:
    """A socket stream transport of either loop (one whose protocol can be swapped)."""
    return isinstance(transport, _STREAM_TRANSPORTS)
