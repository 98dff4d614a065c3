"""The event loop the proxy's processes run on: asyncio's own, or uvloop when asked for
(`--event-loop uvloop`, with the `uvloop` extra installed).

asyncio's is the default because it measured faster here. bench/ab.py, the same code on each
loop, c=16, one core (docs/performance.md): kept-alive plain HTTP 0.97x and intercepted HTTPS
0.99x on uvloop, a new connection per request 0.80x, intercepted or in base-URL mode. What
uvloop speeds up (the selector, handles, socket reads and writes in C) is a small share of a
request next to mitmproxy's layers and sealgate's hooks, and something per connection costs
more on it, so far unexplained (a bare asyncio server accepting a connection per request is
as fast on either). The option stays because it is tested: the suite's tunnel tests run on
both loops, and a machine where uvloop wins can measure it (`bench/proxy_overhead.py` with
SEALGATE_EVENT_LOOP=uvloop).

What differs for sealgate's own code: uvloop's socket transports are not subclasses of
asyncio.Transport (the splice checks a transport with `stream_transport`, not isinstance).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from ..errors import ProxyError

Choice = Literal["asyncio", "uvloop"]  # `sealgate proxy --event-loop`

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
        raise EventLoopUnavailable(
            "--event-loop uvloop: uvloop is not installed (pip install 'sealgate[uvloop]')")
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
