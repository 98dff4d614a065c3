"""What mitmproxy's layers need changed for upstream connections that outlive their client
connection (pool.py keeps them; mitm.py installs these).

- A kept connection's TLS is handed to a new ServerTLSLayer with its handshake long done; the
  layer would wait for the server's answer to its first handshake step, which never comes.
- A client's `Connection: close` is about its own connection: forwarded upstream, it ended
  every upstream connection of a client that never keeps its own.
- A kept connection may be closed by its origin just as a request is sent on it; a request
  safe to send twice is sent once more, on a new connection.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable

from mitmproxy.proxy import tunnel
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers import tls as tls_layers
from mitmproxy.proxy.layers.http import HttpStream, SendHttp, _http1
from mitmproxy.proxy.layers.http._events import (
    HttpEvent,
    RequestEndOfMessage,
    RequestHeaders,
    RequestProtocolError,
    ResponseProtocolError,
)

from .pool import installed


def finished_at_once(start: Callable[[tls_layers.ServerTLSLayer], CommandGenerator[None]]
                     ) -> Callable[[tls_layers.ServerTLSLayer], CommandGenerator[None]]:
    """ServerTLSLayer.start_handshake, for a handshake that was done before it started.

    mitmproxy's layer drives its first handshake step and waits for the server's answer to
    finish; given a kept connection's TLS, that first step already finds the handshake done,
    and no answer will come. So the layer is told here that it is finished."""

    @functools.wraps(start)
    def start_handshake(self: tls_layers.ServerTLSLayer) -> CommandGenerator[None]:
        yield from start(self)
        if self.tunnel_state is tunnel.TunnelState.ESTABLISHING and self.conn.tls_established:
            yield from self._handshake_finished(None)

    return start_handshake


_Send = Callable[[_http1.Http1Client, HttpEvent], CommandGenerator[None]]


def kept_open(send: _Send) -> _Send:
    """Http1Client.send, without the client's `Connection: close` upstream.

    `Connection` is hop-by-hop (RFC 9110, 7.6.1): a client's `close` is about its own
    connection with the proxy, which still closes it after the answer (its HTTP/1 server
    layer reads the client's request, unchanged). mitmproxy forwarded it, so the upstream
    connection of a client that says `close` -- every request of a client that does not keep
    connections, Go's with keep-alive off, say -- ended with the answer and could not be kept.
    The upstream request is a copy without it."""

    @functools.wraps(send)
    def sent(self: _http1.Http1Client, event: HttpEvent) -> CommandGenerator[None]:
        if isinstance(event, RequestHeaders) and "connection" in event.request.headers:
            tokens = [token.strip() for value in event.request.headers.get_all("connection")
                      for token in value.split(",")]
            if any(token.lower() == "close" for token in tokens):
                upstream = copy.copy(event.request)
                upstream.data = dataclasses.replace(event.request.data,
                                                    headers=event.request.headers.copy())
                if kept := [t for t in tokens if t and t.lower() != "close"]:
                    upstream.headers["connection"] = ", ".join(kept)
                else:
                    del upstream.headers["connection"]
                event = RequestHeaders(event.stream_id, upstream, event.end_stream)
        yield from send(self, event)

    return sent


# In an HttpStream's instance dict: its request was sent again once already.
_RETRIED = "_sealgate_retried"
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

_HandleError = Callable[[HttpStream, ResponseProtocolError | RequestProtocolError],
                        CommandGenerator[None]]


def retried_once(handle: _HandleError) -> _HandleError:
    """HttpStream.handle_protocol_error, which sends a request once more, on a new
    connection, when the kept connection it rode was closed by the origin before any answer
    (a close that crossed the request: it waited idle up to the origin's own timeout).

    Only a request safe to send twice is: GET, HEAD or OPTIONS with no body. Any other
    fails as a connection the upstream closed always did (502 upstream_reset), since the
    origin may have acted on it."""

    @functools.wraps(handle)
    def handle_protocol_error(self: HttpStream,
                              event: ResponseProtocolError | RequestProtocolError
                              ) -> CommandGenerator[None]:
        request, kept = self.flow.request, installed()
        if (isinstance(event, ResponseProtocolError) and kept is not None
                and not vars(self).get(_RETRIED) and self.flow.response is None
                and self.server_state == self.state_wait_for_response_headers
                and request.method in _SAFE and not request.raw_content
                and not request.trailers and kept.went_stale(self.context.server)):
            vars(self)[_RETRIED] = True
            if (yield from self.make_server_connection()):
                server = self.context.server
                yield SendHttp(RequestHeaders(self.stream_id, request, True), server)
                yield SendHttp(RequestEndOfMessage(self.stream_id), server)
            return
        yield from handle(self, event)

    return handle_protocol_error
