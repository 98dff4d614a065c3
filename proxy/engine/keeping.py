"""What mitmproxy's layers need changed for upstream connections that outlive their client
connection (pool.py keeps them; mitm.py installs these).

- A kept connection's TLS is handed to a new ServerTLSLayer with its handshake long done; the
  layer would wait for the server's answer to its first handshake step, which never comes.
- A client's `Connection: close` is about its own connection: forwarded upstream, it ended
  every upstream connection of a client that never keeps its own; and an HTTP/2 client's
  requests each had an HTTP/1 upstream connection of their own, closed after the answer.
- A kept connection may be closed by its origin just as a request is sent on it; a request
  safe to send twice is sent once more, on a new connection.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable

from mitmproxy import http
from mitmproxy.proxy import tunnel
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers import tls as tls_layers
from mitmproxy.proxy.layers.http import (
    GetHttpConnection,
    GetHttpConnectionCompleted,
    HttpLayer,
    HttpStream,
    SendHttp,
    _http1,
)
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
    """Http1Client.send, without what would end the upstream connection with its answer.

    - The client's `Connection: close`. `Connection` is hop-by-hop (RFC 9110, 7.6.1): a
      client's `close` is about its own connection with the proxy, which still closes it after
      the answer (its HTTP/1 server layer reads the client's request, unchanged). mitmproxy
      forwarded it, so the upstream connection of a client that says `close` -- every request
      of a client that does not keep connections, Go's with keep-alive off, say -- ended with
      the answer and could not be kept.
    - An HTTP/2 (or 3) client's request, which mitmproxy sends on an HTTP/1 connection of its
      own and closes after the answer: curl's and Go's requests, which speak HTTP/2 to the
      proxy, never left a connection to keep. The request goes as HTTP/1.1 made here, the way
      mitmproxy makes it, and the connection is left open; the layer's other streams take it
      when it is idle (`reused_by_streams`).

    Either way the upstream request is a copy: the client's request is the flow's and its
    server layer's."""

    @functools.wraps(send)
    def sent(self: _http1.Http1Client, event: HttpEvent) -> CommandGenerator[None]:
        if isinstance(event, RequestHeaders):
            request = event.request
            closing = _closing(request)
            if closing or request.is_http2 or request.is_http3:
                event = RequestHeaders(event.stream_id, _upstream(request, closing),
                                       event.end_stream)
        yield from send(self, event)

    return sent


def kept_request(request: http.Request) -> http.Request:
    """An HTTP/1.1 `request` as it goes on an upstream connection that is to be kept: without
    the client's `close` (the fast path's, fastexchange.py, as `kept_open` is mitmproxy's)."""
    return _upstream(request, True) if _closing(request) else request


def _closing(request: http.Request) -> bool:
    return "connection" in request.headers and any(
        token.strip().lower() == "close"
        for value in request.headers.get_all("connection") for token in value.split(","))


def _upstream(request: http.Request, closing: bool) -> http.Request:
    copied = copy.copy(request)
    copied.data = dataclasses.replace(request.data, headers=request.headers.copy())
    if closing:
        tokens = [token.strip() for value in copied.headers.get_all("connection")
                  for token in value.split(",")]
        if kept := [t for t in tokens if t and t.lower() != "close"]:
            copied.headers["connection"] = ", ".join(kept)
        else:
            del copied.headers["connection"]
    if request.is_http2 or request.is_http3:
        # What Http1Client.send makes of such a request, so that it sees one of HTTP/1.1.
        copied.http_version = "HTTP/1.1"
        if "Host" not in copied.headers and request.authority:
            copied.headers.insert(0, "Host", request.authority)
        copied.authority = ""
        if len(cookies := copied.headers.get_all("Cookie")) > 1:
            copied.headers["Cookie"] = "; ".join(cookies)  # one header in HTTP/1 (RFC 6265)
    return copied


_Get = Callable[..., CommandGenerator[None]]


def reused_by_streams(get_connection: _Get) -> _Get:
    """HttpLayer.get_connection, which gives an HTTP/2 client's stream an idle HTTP/1
    connection of its layer's (mitmproxy gave each such stream one of its own)."""

    @functools.wraps(get_connection)
    def get(self: HttpLayer, event: GetHttpConnection, *, reuse: bool = True
            ) -> CommandGenerator[None]:
        kept = installed()
        if reuse and kept is not None and self.context.client.alpn == b"h2":
            for server in self.connections:
                if (server.alpn != b"h2" and server.connected and not server.error
                        and server not in self.waiting_for_establishment
                        and event.connection_spec_matches(server) and kept.idle(server)):
                    stream = self.command_sources.pop(event)
                    yield from self.event_to_child(
                        stream, GetHttpConnectionCompleted(event, (server, None)))
                    return
        yield from get_connection(self, event, reuse=reuse)

    return get


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
                and self.client_state == self.state_done and _bodiless(request)
                and kept.went_stale(self.context.server)):
            vars(self)[_RETRIED] = True
            if (yield from self.make_server_connection()):
                server = self.context.server
                yield SendHttp(RequestHeaders(self.stream_id, request, True), server)
                yield SendHttp(RequestEndOfMessage(self.stream_id), server)
            return
        yield from handle(self, event)

    return handle_protocol_error


def _bodiless(request: http.Request) -> bool:
    """A safe request whose whole message was its head: no body read, none streamed (found
    by review: a chunked GET's head went again with its end at once, and the client's body
    after it), none declared."""
    headers = request.headers
    return (request.method in _SAFE and not request.stream and not request.raw_content
            and not request.trailers and "transfer-encoding" not in headers
            and headers.get("content-length", "0").strip() == "0")
