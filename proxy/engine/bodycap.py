"""A request body is held to its request's `max_request_bytes` as it streams, whatever its
framing says.

The budget refuses a declared Content-Length over the cap at the head, and the parsers hold a
body to the length it declared (h11 reads that many bytes as the body; h2 ends the connection at
a DATA frame past it). A body of unknown length (HTTP/1 chunked, HTTP/2 without
content-length) declares nothing to refuse: it streamed upstream as it came, counted only
against the sandbox's total, so a 50 MB chunked upload under a 100 kB cap reached the origin in
full. Here every data event of a streamed request body is counted as it comes from the client,
before anything passes it on (the byte meter, a re-signer), on every path: plain HTTP, tunnels,
transparent and base-URL mode, HTTP/1 and HTTP/2 all stream through mitmproxy's one HttpStream.

The event that takes the count past the cap is not forwarded, so the origin sees at most the cap
in body bytes, and never the request's end: the upstream request is aborted (HTTP/1: its
connection closed before the last chunk; HTTP/2: its stream reset, CANCEL). The addon records
the refusal (the `request_body_over_cap` hook: its audit line and metrics say
`request_too_large`). If nothing of an answer has gone to the client (the upstream has not
answered, or its answer is still being read whole), the client gets the 413 refusal and the
rest of its body is read and dropped within the linger bounds (linger.py), as for a
request refused at its head; otherwise its HTTP/1 connection is closed, or its HTTP/2 stream
reset, in the middle of the answer. Bodies mitmproxy buffers are not counted here: only a
declared length within the cap is buffered, and the parsers hold it to that.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from mitmproxy import flow as flows
from mitmproxy import http
from mitmproxy.net.http import status_codes
from mitmproxy.proxy import commands
from mitmproxy.proxy.events import Event
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import DropStream, HttpStream, SendHttp
from mitmproxy.proxy.layers.http._events import (
    RequestData,
    RequestProtocolError,
    ResponseProtocolError,
)
from mitmproxy.proxy.layers.http._hooks import HttpErrorHook

from sealgate.reasons import Reason

from . import limits, linger
from .limits import META, Bounds
from .refusal import said

_SEEN = "_sealgate_body_seen"  # body bytes counted so far, in the stream's instance dict
_CUT = "_sealgate_body_cut"  # set once the body passed its cap and its upstream was aborted


@dataclass
class RequestBodyOverCapHook(commands.StartHook):
    """A streamed request body passed its request's cap; nothing more of it goes upstream, and
    the request's audit line is still to be written. When `flow.response` is None, nothing has
    gone to the client, and the addon sets it to the refusal the client is sent (an upstream
    answer being read was dropped); else the upstream's answer has begun, and is cut off."""

    name = "request_body_over_cap"
    flow: http.HTTPFlow


_State = Callable[[HttpStream, Event], CommandGenerator[None]]


def counted(state: _State, bounds: limits.HttpLimits) -> _State:
    """HttpStream's state of a request body streaming upstream, each data event counted
    against the cap the request path left on the request's record."""

    @functools.wraps(state)
    def stream_request_body(self: HttpStream, event: Event) -> CommandGenerator[None]:
        if isinstance(event, RequestData):
            record: Bounds | None = self.flow.metadata.get(META)
            cap = record.max_request_bytes if record is not None else None
            if cap is not None:
                seen = vars(self)[_SEEN] = vars(self).get(_SEEN, 0) + len(event.data)
                if seen > cap:
                    yield from _over(self, cap, bounds)
                    return
        yield from state(self, event)

    return stream_request_body


def _over(stream: HttpStream, cap: int, bounds: limits.HttpLimits) -> CommandGenerator[None]:
    flow = stream.flow
    message = said(Reason.REQUEST_TOO_LARGE, f"request body over {cap} bytes")
    # Where the upstream's answer stands says whether any of it has gone to the client (none
    # while its head is awaited or its body is read whole) and whether the request's audit
    # line was written (by the response or error hook, once it is done or failed).
    answer = stream.server_state in (stream.state_wait_for_response_headers,
                                     stream.state_consume_response_body)
    logged = stream.server_state in (stream.state_done, stream.state_errored)
    # Whatever the upstream still sends (it may be queued behind this event) is dropped, and
    # its word that it is gone too (quiet_upstream).
    stream.server_state = stream.state_errored
    vars(stream)[_CUT] = True
    # Upstream first, so that nothing more goes, not even the body's end: an HTTP/1
    # connection is closed, an HTTP/2 stream reset (CANCEL).
    yield SendHttp(RequestProtocolError(stream.stream_id, message,
                                        status_codes.CLIENT_CLOSED_REQUEST),
                   stream.context.server)
    if answer:
        flow.response = None
    if not logged:  # (an answer already given whole keeps its line)
        yield RequestBodyOverCapHook(flow)
    if answer and flow.response is not None:
        yield from linger.answer(stream, bounds)
        stream.server_state = stream.state_errored  # send_response made it done
        return
    if not logged:  # the request's line, written by the error hook (the response's has not)
        flow.error = flows.Error(message)
        yield HttpErrorHook(flow)
    stream.client_state = stream.state_errored
    flow.live = False
    yield from linger.cut_off(stream)
    yield DropStream(stream.stream_id)


_Failed = RequestProtocolError | ResponseProtocolError
_Handler = Callable[[HttpStream, _Failed], CommandGenerator[None]]


def quiet_upstream(handle: _Handler) -> _Handler:
    """HttpStream's handling of a protocol error, with the upstream's word that it is gone
    ignored once this module aborted it: for a stream still dropping its client's body it
    would end that (an HTTP/1 client's connection closed, an HTTP/2 stream reset)."""

    @functools.wraps(handle)
    def handle_protocol_error(self: HttpStream, event: _Failed) -> CommandGenerator[None]:
        if isinstance(event, ResponseProtocolError) and vars(self).get(_CUT):
            return
        yield from handle(self, event)

    return handle_protocol_error
