"""What the sandbox sees when the upstream fails, and how long a dial (and its TLS) may take.

mitmproxy dials with no timeout of its own, so a black-holed destination holds a request for the
kernel's SYN retries (about two minutes); and it answers a failed dial, or a request it cannot
parse, with an HTML page that names the address it tried, over HTTP/1 and HTTP/2 alike. Here are
the two fixes the lean master puts in (mitm.py wires them into mitmproxy): a bounded dial
(its bound is the pool's, pool.py, through which every dial goes), and the proxy's own JSON
refusal (`connect_timeout` 504, `connect_failed` 502, `bad_request`
400) without the address, so every answer a client gets has one shape.

The dial's bound ends when TCP is up, and mitmproxy's TLS handshake with the upstream has none
of its own: an upstream whose kernel completed the TCP handshake but whose server does not (yet)
speak TLS -- a listener that stopped accepting, or accepts late under load -- held the request,
with nothing to the client and no audit line, until the idle timeout. So the proxy's own
handshake with an upstream gets the same `connect_timeout` seconds from its start; past them the
upstream connection is closed and the request answered 504 `connect_timeout`.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable

from mitmproxy import connection, http
from mitmproxy.net.http import http1
from mitmproxy.proxy import layer
from mitmproxy.proxy.layers import tls

from sealgate.reasons import Reason

from ..errors import Denial
from .handlers import handler_of
from .refusal import OWN_REASON, deny_response, said

# What mitmproxy's TLS layer and HTTP client say of a failed upstream handshake, and of a
# connection that ended before a response (its messages, not the client's text).
_TLS_FAILED = re.compile(r"certificate|\btls\b|\bssl\b|handshake|openssl", re.IGNORECASE)
_RESET = re.compile(r"reset|closed connection|disconnected|\beof\b|broken pipe",
                    re.IGNORECASE)



# In a ServerTLSLayer's instance dict: its handshake's deadline, and what a handshake closed at
# that deadline says.
_TIMER = "_sealgate_handshake_timer"
_OVERDUE = "_sealgate_handshake_overdue"

_Start = Callable[[tls.ServerTLSLayer], layer.CommandGenerator[None]]
_Finished = Callable[[tls.ServerTLSLayer, "str | None"], layer.CommandGenerator[None]]


def handshake_message(seconds: float) -> str:
    return said(Reason.CONNECT_TIMEOUT, f"no TLS handshake from the upstream in {seconds:g} s")


def bounded_handshake(start_tls: _Start, seconds: float) -> _Start:
    """ServerTLSLayer.start_tls, with a deadline on the handshake it starts (the proxy's own
    handshake with an upstream: a blind tunnel's is the client's, and starts none)."""

    @functools.wraps(start_tls)
    def start(self: tls.ServerTLSLayer) -> layer.CommandGenerator[None]:
        yield from start_tls(self)
        if self.tls is None:
            return  # no TLS context: mitmproxy closes the connection itself
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # driven without a loop (mitmproxy's own layer tests)
            return
        vars(self)[_TIMER] = loop.call_later(seconds, _overdue, self, seconds)

    return start


def named_failure(finished: _Finished) -> _Finished:
    """ServerTLSLayer._handshake_finished: the deadline is called off, and a handshake closed at
    it fails with what happened instead of mitmproxy's "connection closed"."""

    @functools.wraps(finished)
    def handshake_finished(self: tls.ServerTLSLayer, err: str | None
                           ) -> layer.CommandGenerator[None]:
        timer: asyncio.TimerHandle | None = vars(self).pop(_TIMER, None)
        if timer is not None:
            timer.cancel()
        said = vars(self).pop(_OVERDUE, None)
        if err and said:
            self.conn.error = err = said
        yield from finished(self, err)

    return handshake_finished


def _overdue(tls_layer: tls.ServerTLSLayer, seconds: float) -> None:
    vars(tls_layer).pop(_TIMER, None)
    server = tls_layer.conn
    if server.tls_established or server.state is connection.ConnectionState.CLOSED:
        return
    handler = handler_of(tls_layer.context.client.id)
    if handler is None or server not in handler.transports:
        return
    vars(tls_layer)[_OVERDUE] = handshake_message(seconds)
    io = handler.transports[server]
    if io.writer is not None:
        io.writer.close()
    handler.close_connection(server)  # its reader ends: the TLS layer sees the close


def error_response(status_code: int, message: str = "") -> bytes:
    """The bytes of an HTTP/1 answer to a failure mitmproxy reports: the JSON refusal, closing."""
    return closing(refusal(status_code, message))


def refused_head(denial: Denial) -> bytes:
    """The bytes of an HTTP/1 answer to a request head refused while it was read."""
    return closing(deny_response(denial, host=None, policy=None, request_id=""))


def closing(response: http.Response) -> bytes:
    response.headers["Connection"] = "close"
    return bytes(http1.assemble_response(response))


def refusal(status_code: int, message: str) -> http.Response:
    """The JSON refusal for a failure mitmproxy reports as `status_code` and `message`."""
    return deny_response(_denial(status_code, message), host=None, policy=None, request_id="")


def failure(message: str) -> Reason:
    """The reason for an upstream failure mitmproxy describes as `message` (which may name the
    address dialed: it goes to the audit log, never to the client)."""
    if own := OWN_REASON.search(message):
        return Reason.of(own.group(1))
    if "timed out" in message.lower():
        return Reason.CONNECT_TIMEOUT
    if _TLS_FAILED.search(message):
        return Reason.UPSTREAM_TLS_FAILED
    if _RESET.search(message):
        return Reason.UPSTREAM_RESET
    return Reason.CONNECT_FAILED


_SAID = {
    Reason.CONNECT_TIMEOUT: "the upstream did not answer in time",
    Reason.UPSTREAM_TLS_FAILED: "the upstream's TLS certificate or handshake failed",
    Reason.UPSTREAM_RESET: "the upstream closed the connection before a response",
    Reason.CONNECT_FAILED: "the upstream could not be reached",
    Reason.UPSTREAM_TIMEOUT: "the upstream sent no response in time",
}


def _denial(status_code: int, message: str) -> Denial:
    if own := OWN_REASON.search(message):
        # Ours: a dial the guard refused (a rebinding answer, say), a response deadline.
        reason = Reason.of(own.group(1))
        return Denial(reason, _SAID.get(reason, "the upstream connection was refused by the "
                                                "guard"))
    if status_code >= 500:
        reason = failure(message)
        return Denial(reason, _SAID[reason])
    # The client's own malformed input: telling it what was wrong is safe and useful.
    return Denial(Reason.BAD_REQUEST, message[:200])
