"""What the sandbox sees when the upstream fails, and how long a dial may take.

mitmproxy dials with no timeout of its own, so a black-holed destination holds a request for the
kernel's SYN retries (about two minutes); and it answers a failed dial, or a request it cannot
parse, with an HTML page that names the address it tried, over HTTP/1 and HTTP/2 alike. The lean
master installs both fixes here: a bounded dial, and the proxy's own JSON refusal
(`connect_timeout` 504, `connect_failed` 502, `bad_request` 400) without the address, so every
answer a client gets has one shape.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Awaitable, Callable
from typing import Any

from mitmproxy import http
from mitmproxy.net.http import http1, status_codes
from mitmproxy.proxy.events import Event
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import _http1, _http2
from mitmproxy.proxy.layers.http._events import (
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
    ResponseProtocolError,
)

from sealgate.proxy.errors import Denial, deny_response
from sealgate.reasons import Reason

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
    _http2.Http2Server._handle_event = _json_errors(  # type: ignore[method-assign, assignment]
        _http2.Http2Server._handle_event
    )


def error_response(status_code: int, message: str = "") -> bytes:
    response = _refusal(status_code, message)
    response.headers["Connection"] = "close"
    return bytes(http1.assemble_response(response))


def _refusal(status_code: int, message: str) -> http.Response:
    return deny_response(_denial(status_code, message), host=None, policy=None, request_id="")


_Handler = Callable[[_http2.Http2Server, Event], CommandGenerator[None]]


def _json_errors(handle: _Handler) -> _Handler:
    """mitmproxy's HTTP/2 server answers a stream's failure with its HTML page where it can
    still send headers (else it resets the stream); send the JSON refusal as a response there
    instead."""

    @functools.wraps(handle)
    def handle_event(self: _http2.Http2Server, event: Event) -> CommandGenerator[None]:
        if (
            isinstance(event, ResponseProtocolError)
            and event.code != status_codes.NO_RESPONSE
            and self.is_open_for_us(event.stream_id)
            and not self.h2_conn.streams[event.stream_id].state_machine.headers_sent
        ):
            response = _refusal(event.code, event.message)
            stream = event.stream_id
            yield from handle(self, ResponseHeaders(stream, response, end_stream=False))
            yield from handle(self, ResponseData(stream, response.raw_content or b""))
            yield from handle(self, ResponseEndOfMessage(stream))
        else:
            yield from handle(self, event)

    return handle_event


def _denial(status_code: int, message: str) -> Denial:
    if own := _OWN_REASON.search(message):
        # A dial the guard refused (a rebinding answer, say): its reason, not a generic one.
        return Denial(Reason.of(own.group(1)), "the upstream connection was refused by the guard")
    if "timed out" in message.lower():
        return Denial(Reason.CONNECT_TIMEOUT, "the upstream did not answer in time")
    if status_code >= 500:
        return Denial(Reason.CONNECT_FAILED, "the upstream could not be reached")
    # The client's own malformed input: telling it what was wrong is safe and useful.
    return Denial(Reason.BAD_REQUEST, message[:200])
