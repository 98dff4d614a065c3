"""The sandbox runtime, and the client a harness drives it with:

    from sealgate.sandbox import Sandbox
    with Sandbox.create("ci-bot") as sb:
        sb.run(["pytest", "-q"])

`AsyncSandbox` (asyncio, on aiohttp) is imported only when asked for, so the sync client and
the CLI pay nothing for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .clients.client import CallTimeout, Client, CommandFailed, DaemonError, Result, Sandbox

if TYPE_CHECKING:
    from .clients.aclient import AsyncSandbox

__all__ = ["AsyncSandbox", "CallTimeout", "Client", "CommandFailed", "DaemonError", "Result",
           "Sandbox"]


def __getattr__(name: str) -> Any:
    if name == "AsyncSandbox":
        from .clients.aclient import AsyncSandbox

        return AsyncSandbox
    raise AttributeError(f"module 'sealgate.sandbox' has no attribute {name!r}")
