"""What the sandbox sees when the upstream fails, and how long a dial may take.

mitmproxy dials with no timeout of its own, so a black-holed destination holds a request for the
kernel's SYN retries (about two minutes); and it answers a failed dial, or a request it cannot
parse, with an HTML page that names the address it tried. The lean master installs both fixes
here: a bounded dial, and the proxy's own JSON refusal (`connect_timeout` 504, `connect_failed`
502, `bad_request` 400) without the address, so every answer a client gets has one shape.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Awaitable, Callable
from typing import Any

from mitmproxy.net.http import http1
from mitmproxy.proxy.layers.http import _http1

from proxy.errors import Denial, deny_response

_OWN_REASON = re.compile(r"sealgate: ([a-z0-9_]+)")


def install(connect_timeout: float) -> None:
    original: Callable[..., Awaitable[Any]] = asyncio.open_connection

    @functools.wraps(original)
    async def bounded(*args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.wait_for(original(*args, **kwargs), connect_timeout)
        except TimeoutError:
            # mitmproxy reports str(error): make it say what happened.
            raise TimeoutError(f"connect timed out after {connect_timeout:g} s") from None

    # Only mitmproxy's upstream dials use asyncio.open_connection in this process.
    asyncio.open_connection = bounded
    _http1.make_error_response = error_response


def error_response(status_code: int, message: str = "") -> bytes:
    response = deny_response(_denial(status_code, message), host=None, policy=None, request_id="")
    response.headers["Connection"] = "close"
    return bytes(http1.assemble_response(response))


def _denial(status_code: int, message: str) -> Denial:
    if own := _OWN_REASON.search(message):
        # A dial the guard refused (a rebinding answer, say): its reason, not a generic one.
        return Denial(own.group(1), "the upstream connection was refused by the guard")
    if "timed out" in message.lower():
        return Denial("connect_timeout", "the upstream did not answer in time")
    if status_code >= 500:
        return Denial("connect_failed", "the upstream could not be reached")
    # The client's own malformed input: telling it what was wrong is safe and useful.
    return Denial("bad_request", message[:200])
