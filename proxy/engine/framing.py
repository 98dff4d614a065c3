"""A message's framing where mitmproxy left it to chance (mitm.py installs these): an HTTP/2
request's body of no declared length written into HTTP/1 unframed, an empty HTTP/2 DATA frame
taken for a body's end, an HTTP/1 response's head and whole body written at once, and an
upstream's informational answer taken for its final one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from mitmproxy.proxy import commands, events
from mitmproxy.proxy.events import Event
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import HttpStream, _http1
from mitmproxy.proxy.layers.http._events import (
    HttpEvent,
    RequestData,
    RequestHeaders,
    ResponseData,
    ResponseHeaders,
)

_Send = Callable[[_http1.Http1Client, HttpEvent], CommandGenerator[None]]
_ServerSend = Callable[[_http1.Http1Server, HttpEvent], CommandGenerator[None]]
_HELD = "_sealgate_head"  # on an Http1Server: the SendData of a head held for its body
_Read = Callable[[_http1.Http1Client, events.ConnectionEvent], CommandGenerator[None]]
# A status line of an informational answer other than 101 (which switches protocols).
_INTERIM = re.compile(rb"HTTP/1\.[01] 1(?!01)[0-9][0-9] ")
_INTERIM_MAX = 8  # skipped in one read, at most: the rest wait for the next


def interim_skipped(read: _Read) -> _Read:
    """Http1Client.read_headers, past an upstream's informational answers (1xx but 101).
    mitmproxy takes the first head it reads for the final answer: a 103 Early Hints, or an
    origin's own 100 Continue, went to the client as the answer, the real one after it was
    never read, and the client waited for it until its own timeout (found by
    tests/security/test_baseurl_answers.py). The proxy asks for none (it answers
    `Expect: 100-continue` itself) and a hint is only a hint: each is dropped as its head
    completes, by the same buffer that reads the final one (the fast path does the same:
    fastexchange.py)."""

    @functools.wraps(read)
    def read_headers(self: _http1.Http1Client, event: events.ConnectionEvent
                     ) -> CommandGenerator[None]:
        if isinstance(event, events.DataReceived) and self.request is not None:
            for _ in range(_INTERIM_MAX):
                if not _INTERIM.match(bytes(self.buf)):
                    break
                if self.buf.maybe_extract_lines() is None:
                    break  # the rest of it is still to come
        yield from read(self, event)

    return read_headers


def framed_for_http1(send: _Send) -> _Send:
    """mitmproxy writes an HTTP/2 or 3 request into HTTP/1 with the body that follows unframed
    when the client declared no Content-Length, so the origin reads the body's bytes as the
    next request (carrying, from sealgate, the credential of the one that was allowed). A body
    of unknown length goes chunked, as RFC 9112 has an intermediary frame it. And an empty
    piece of a body is not written: chunked, it would be the last chunk, the body's end (a
    stream function passes on nothing while it holds what came, aws-chunked's re-signer a
    chunk still coming; or once it refused the body, whose end must never go)."""

    @functools.wraps(send)
    def framed(self: _http1.Http1Client, event: HttpEvent) -> CommandGenerator[None]:
        if isinstance(event, RequestData) and not event.data:
            return
        if isinstance(event, RequestHeaders) and not event.end_stream:
            request = event.request
            if (request.is_http2 or request.is_http3) and not (
                "content-length" in request.headers or "transfer-encoding" in request.headers
            ):
                # Set on the request itself: mitmproxy decides each chunk's framing from it.
                request.headers["transfer-encoding"] = "chunked"
        yield from send(self, event)

    return framed


_State = Callable[[HttpStream, Event], CommandGenerator[None]]


def no_empty_chunks(state: _State) -> _State:
    """An empty HTTP/2 DATA frame in the middle of a body reaches a stream function as b"",
    which is also how mitmproxy says the body ended. In a response the scrubber would let out
    the tail it held back, and a secret split around the empty frame would pass unmasked; in a
    request aws-sigv4's re-signer (`awschunked.Resigner`) would find the body cut short before
    its final chunk and refuse a client that did nothing wrong. Such an event carries nothing,
    so it is dropped here, before any stream function sees it: b"" keeps the one meaning every
    stream function relies on, which lets the re-signer check that the body really ended with
    its final chunk."""

    @functools.wraps(state)
    def stream_body(self: HttpStream, event: Event) -> CommandGenerator[None]:
        if isinstance(event, RequestData | ResponseData) and not event.data:
            return
        yield from state(self, event)

    return stream_body


def head_with_body(send: _ServerSend) -> _ServerSend:
    """A response whose whole body is known when its head is sent (not streamed: mitmproxy's
    `send_response` then sends the body right after) goes out in one write: one TLS record and
    one socket write instead of two, on every kept-alive intercepted request. The head's write
    is held until the next event, joined to the write of a body's data, and otherwise let go
    before whatever that event writes: the bytes and their order are always mitmproxy's."""

    @functools.wraps(send)
    def sent(self: _http1.Http1Server, event: HttpEvent) -> CommandGenerator[None]:
        head: commands.SendData | None = vars(self).pop(_HELD, None)
        if head is not None:
            if isinstance(event, ResponseData):
                for command in send(self, event):
                    if head is not None and isinstance(command, commands.SendData):
                        command.data = head.data + command.data
                        head = None
                    yield command
                if head is not None:  # the data wrote nothing (an empty piece)
                    yield head
                return
            yield head
        if not (isinstance(event, ResponseHeaders) and not event.end_stream
                and event.response.raw_content):
            yield from send(self, event)
            return
        written = list(send(self, event))
        if len(written) == 1 and isinstance(written[0], commands.SendData):
            vars(self)[_HELD] = written[0]
        else:
            yield from written

    return sent
