"""framing.head_with_body on mitmproxy's own HTTP/1 server layer: a response's head and whole
body leave in one write, with exactly the bytes mitmproxy writes in two, and a body it frames
or streams is left to it."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

import pytest
from mitmproxy import connection, http
from mitmproxy.options import Options
from mitmproxy.proxy import commands, context
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._events import (
    HttpEvent,
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
    ResponseProtocolError,
)

from sealgate.proxy.engine import framing

_ORIGINAL = inspect.unwrap(_http1.Http1Server.send)  # mitmproxy's, whether installed or not
_JOINED = framing.head_with_body(_ORIGINAL)


def _server() -> _http1.Http1Server:
    client = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 2),
                               timestamp_start=0)
    server = _http1.Http1Server(context.Context(client, Options()))
    server.stream_id = 1
    server.request = http.Request.make("GET", "http://origin.test/")
    return server


def _writes(send: Callable[..., Iterable[commands.Command]],
            events: list[HttpEvent]) -> list[bytes]:
    server = _server()
    return [c.data for e in events for c in send(server, e) if isinstance(c, commands.SendData)]


def _answer(response: http.Response, *pieces: bytes) -> list[HttpEvent]:
    return [ResponseHeaders(1, response, False), *(ResponseData(1, p) for p in pieces),
            ResponseEndOfMessage(1)]


def test_a_whole_body_leaves_with_its_head_in_one_write() -> None:
    response = http.Response.make(200, b"hello", {"content-type": "text/plain"})
    events = _answer(response, response.raw_content or b"")
    joined, mitmproxys = _writes(_JOINED, events), _writes(_ORIGINAL, events)
    assert len(mitmproxys) == 2 and joined == [b"".join(mitmproxys)]
    # The next answer on the connection is joined again: nothing held outlives its body.
    server = _server()
    again = [c.data for _ in range(2) for e in events for c in _JOINED(server, e)
             if isinstance(c, commands.SendData)]
    assert again == [b"".join(mitmproxys)] * 2


@pytest.mark.parametrize("case", ["chunked", "streamed", "another-body", "trailers", "empty",
                                  "error", "http2"])
def test_what_follows_a_head_is_written_as_mitmproxy_writes_it(case: str) -> None:
    """Joined or not, the bytes and their order are mitmproxy's; only the count of writes
    differs, and only where a head is followed by its data."""
    response = http.Response.make(200, b"hello")
    pieces: tuple[bytes, ...] = (b"hello",)
    joins = True
    if case == "chunked":  # framed by mitmproxy: joined with the first chunk's framing
        response.headers["transfer-encoding"] = "chunked"
        del response.headers["content-length"]
        pieces = (b"hel", b"lo")
    elif case == "streamed":  # its head sent before any of its body came: nothing held
        response.content = None
        pieces = (b"hel", b"lo")
        joins = False
    elif case == "another-body":  # other bytes than the body that went with the head
        pieces = (b"other", b"")
    elif case == "trailers":
        response.headers["transfer-encoding"] = "chunked"
        response.trailers = http.Headers(x="1")
    elif case == "empty":
        response.content = b""
        pieces = ()
        joins = False
    elif case == "http2":  # made HTTP/1 by mitmproxy's send, as it is
        response.http_version = "HTTP/2.0"
    events = _answer(response, *pieces)
    if case == "error":  # a protocol error after the head: the head goes first, then the rest
        events = [events[0], ResponseProtocolError(1, "gone", 502)]
        joins = False
    joined, mitmproxys = _writes(_JOINED, events), _writes(_ORIGINAL, events)
    assert b"".join(joined) == b"".join(mitmproxys)
    if joins:
        assert joined == [mitmproxys[0] + mitmproxys[1], *mitmproxys[2:]]
    else:
        assert joined == mitmproxys
