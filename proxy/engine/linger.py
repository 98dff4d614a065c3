"""A request refused at its head is answered at once, and the body it goes on sending is read and
dropped, within bounds, before the connection closes.

mitmproxy reads a request's whole body before an addon's answer goes out, so a declared
Content-Length over the budget was uploaded in full before its 413 (and over HTTP/2 buffered in
the proxy's memory, however large). The pipeline decides at the head; the refusal is sent then.

Closing the connection right after it does not work either: a client that writes its whole body
before it reads (requests, http.client, httpx) is still writing, the proxy's kernel answers the
bytes it never read with a reset, and over TLS the client's next write fails with an EOF it does
not read past. A 50 MB upload over `max_request_bytes` ended in "EOF occurred in violation of
protocol" instead of the 413 its client was to read (a chunked upload refused with 411 saw the
same, now and then). So what the client still sends is read and dropped: never buffered, never
sent upstream (no upstream connection is opened for a request answered at its head), until the
body ends, when HTTP/1's connection closes (the refusal says `Connection: close`) and HTTP/2's
stream is done. A refusal must not become a way to make the proxy read without end, or to hold a
connection, so this lingering is bounded (limits.py):

- `linger_bytes` (64 MiB): the most refused body bytes read from one connection. It covers
  uploads a sandbox may really send (the default `max_request_bytes` is 10 MiB), and costs no
  memory: bytes are counted and dropped.
- `linger_seconds` (5 s) from the refusal: data that comes later ends the lingering. A client
  that goes quiet instead is closed at the idle timeout, as any quiet connection is.

Past either bound HTTP/1's connection is closed (a client still writing then sees a reset, seconds
after its refusal arrived), and HTTP/2's stream is reset (CANCEL) while the connection's other
streams go on. A request whose client waits for an invitation (`Expect: 100-continue`) sends no
body after a refusal: over HTTP/1 its connection closes at once. A body refused in the middle, as
it streamed past its request's cap (bodycap.py), is answered and dropped the same way.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable

from mitmproxy import connection
from mitmproxy.net.http import status_codes
from mitmproxy.proxy import commands
from mitmproxy.proxy.events import Event
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import HttpStream, SendHttp
from mitmproxy.proxy.layers.http._events import (
    RequestData,
    RequestEndOfMessage,
    RequestHeaders,
    ResponseEndOfMessage,
    ResponseProtocolError,
)
from mitmproxy.proxy.layers.http._hooks import HttpResponseHeadersHook

from . import limits

# Refused body bytes read so far, per client connection (over HTTP/2, all its streams').
_DROPPED: weakref.WeakKeyDictionary[connection.Client, int] = weakref.WeakKeyDictionary()

_State = Callable[[HttpStream, Event], CommandGenerator[None]]


def answered_before_body(state: _State, bounds: limits.HttpLimits) -> _State:
    """HttpStream's first client state, with a request refused at its headers (the pipeline set
    its response) answered at once and its body left to `_dropping`."""

    @functools.wraps(state)
    def wait_for_request_headers(self: HttpStream, event: Event) -> CommandGenerator[None]:
        waits = isinstance(event, RequestHeaders) and (
            event.request.headers.get("expect", "").lower() == "100-continue"
        )
        yield from state(self, event)
        flow = self.flow
        if not (
            isinstance(event, RequestHeaders) and not event.end_stream
            and self.client_state == self.state_consume_request_body
            and flow.response is not None
        ):
            return
        yield from answer(self, bounds, close=waits and flow.request.http_version.startswith(
            "HTTP/1"))

    return wait_for_request_headers


def answer(stream: HttpStream, bounds: limits.HttpLimits, *, close: bool = False
           ) -> CommandGenerator[None]:
    """The flow's response (a refusal) sent now, while the request's body is still to come,
    and that body dropped as it comes (`_dropping`); with `close`, an HTTP/1 connection closed
    after the response instead (its client waits for 100-continue: no body is coming)."""
    flow = stream.flow
    assert flow.response is not None
    http1 = flow.request.http_version.startswith("HTTP/1")
    stream.client_state = stream.state_done if close else _dropping(stream, bounds)
    if http1:
        flow.response.headers["connection"] = "close"
    flow.response.timestamp_start = time.time()
    yield HttpResponseHeadersHook(flow)
    yield from stream.send_response()
    if close:
        yield commands.CloseConnection(stream.context.client)
    elif not http1:
        # The stream's end, which send_response leaves for the body's: an HTTP/2 client
        # reading as it sends has its whole answer now (a second end is not sent).
        yield SendHttp(ResponseEndOfMessage(stream.stream_id), stream.context.client)


def _dropping(
    stream: HttpStream, bounds: limits.HttpLimits
) -> Callable[[Event], CommandGenerator[None]]:
    """The client state of a refused request's body: counted and dropped until it ends (then
    the stream is done: mitmproxy closes an HTTP/1 connection after it) or a bound is passed."""
    client = stream.context.client
    began = time.monotonic()

    def drop(event: Event) -> CommandGenerator[None]:
        if isinstance(event, RequestData):
            dropped = _DROPPED[client] = _DROPPED.get(client, 0) + len(event.data)
            if dropped > bounds.linger_bytes or time.monotonic() - began > bounds.linger_seconds:
                # What is left of the body, already queued behind this event (it arrives while
                # a hook is pending) or still to come, is dropped unread: mitmproxy's errored
                # state takes any event, its done state none (an AssertionError per event).
                yield from _end(stream, stream.state_errored)
                yield from cut_off(stream)
        elif isinstance(event, RequestEndOfMessage):
            yield from _end(stream, stream.state_done)
        # Trailers are dropped with the body.

    return drop


def _end(stream: HttpStream, state: Callable[[Event], CommandGenerator[None]]
         ) -> CommandGenerator[None]:
    stream.client_state = state
    yield from stream.flow_done()


def cut_off(stream: HttpStream) -> CommandGenerator[None]:
    """The client's side of the stream ended now: an HTTP/1 connection closed, an HTTP/2
    stream reset (CANCEL) while the connection's other streams go on."""
    if stream.flow.request.http_version.startswith("HTTP/1"):
        yield commands.CloseConnection(stream.context.client)
    else:  # its answer's head has gone out: the stream is reset, not answered
        yield SendHttp(ResponseProtocolError(stream.stream_id, "sealgate: refused body too long",
                                             status_codes.CLIENT_CLOSED_REQUEST),
                       stream.context.client)
