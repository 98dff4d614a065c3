"""The event loop a proxy process runs on: uvloop where it is installed, else asyncio's own.

uvloop (libuv under asyncio's API) takes less of the proxy's CPU per connection and per request
than the standard selector loop: bench/ab.py's figures are in docs/performance.md, "The event
loop". It is a dependency of the distribution, so a normal install has it; a Python where its
wheel does not exist still runs, on asyncio's loop, and `SEALGATE_EVENT_LOOP=asyncio` chooses
asyncio's loop deliberately (to tell a loop's bug from ours).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")
ENV = "SEALGATE_EVENT_LOOP"


def factory() -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """The loop's name and how to make it (None: asyncio's default)."""
    if os.environ.get(ENV, "") == "asyncio":
        return "asyncio", None
    try:
        import uvloop
    except ImportError:
        return "asyncio", None
    return "uvloop", uvloop.new_event_loop


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """`asyncio.run(main)` on the chosen loop."""
    _, make = factory()
    with asyncio.Runner(loop_factory=make) as runner:
        return runner.run(main)
