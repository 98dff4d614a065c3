"""A port the sandbox serves, reached by the harness only: `/v1/sandboxes/{id}/ports/{port}/...`
forwards an HTTP request to the sandbox's own loopback, from a socket the daemon makes inside
its network namespace (`sandbox.host.nsocket`), so nothing else anywhere can reach that port
and no egress rule changes.

The request goes on as HTTP/1.1 (h11 writes it and reads the answer: a server in the sandbox is
untrusted, and its answer is parsed with caps, never copied through as bytes), without the
hop-by-hop headers and without the daemon's own `Authorization` (the bearer key of a TCP
listener must never reach the sandbox). The answer streams back as it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import h11
from aiohttp import web

from sealgate.reasons import Reason

from ..host import nsocket
from . import bodies
from .session import SessionError

MAX_HEAD = 64 << 10  # the answer's status line and headers
MAX_BODY = 24 << 20  # a request body forwarded (read whole: the daemon's own cap)
CONNECT_SECONDS = 10.0
READ_SECONDS = 300.0  # the most the answer may go without a byte
_READ = 1 << 20  # bytes taken from the server at a time
# Not forwarded either way: the connection's own, and what is the daemon's or recomputed.
# X-Sealgate-Error marks the daemon's own refusals: a server in the sandbox may not forge one.
_DROPPED = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                      "te", "trailer", "transfer-encoding", "upgrade", "host", "authorization",
                      "content-length", "x-sealgate-error"})


async def forward(request: web.Request, netns: Path, port: int, path: str,
                  began: Callable[[], None]) -> web.StreamResponse:
    """`request` to `port` of the sandbox whose namespace is `netns`; its answer. `began` is
    called once the answer has started (errors after it end the stream, not a JSON answer).
    Raises SessionError (port_unreachable) for no listener or no HTTP answer."""
    sock = await asyncio.to_thread(nsocket.socket_in, netns)
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), CONNECT_SECONDS)
    except (OSError, TimeoutError):
        sock.close()
        raise SessionError(f"nothing in the sandbox accepts connections on port {port}",
                           reason=Reason.PORT_UNREACHABLE) from None
    # The reader's limit is its buffer before it stops reading (h11 caps the head itself): a
    # small one paces a large answer to a crawl.
    reader, writer = await asyncio.open_connection(sock=sock, limit=_READ)
    try:
        body = await bodies.raw(request, MAX_BODY)
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        headers = [(name, value) for name, value in request.headers.items()
                   if name.lower() not in _DROPPED]
        headers += [("host", f"127.0.0.1:{port}"), ("connection", "close"),
                    ("content-length", str(len(body)))]
        target = "/" + path + (f"?{request.query_string}" if request.query_string else "")
        for event in (h11.Request(method=request.method, target=target, headers=headers),
                      h11.Data(data=body), h11.EndOfMessage()):
            writer.write(conn.send(event) or b"")
        await writer.drain()
        return await _answer(request, conn, reader, port, began)
    except (h11.ProtocolError, ConnectionError, TimeoutError) as exc:
        raise SessionError(f"port {port} did not answer with HTTP: {type(exc).__name__}",
                           reason=Reason.PORT_UNREACHABLE) from None
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _copy(conn: h11.Connection, reader: asyncio.StreamReader,
                response: web.StreamResponse, length: int) -> None:
    """A body of a known length, copied as it comes: past the head there is nothing left to
    parse, and h11's buffer would copy every byte once more (a quarter of direct speed)."""
    pending = bytes(conn.trailing_data[0][:length])
    if pending:
        await response.write(pending)
    left = length - len(pending)
    while left > 0:
        data = await asyncio.wait_for(reader.read(min(_READ, left)), READ_SECONDS)
        if not data:
            return  # cut short: the caller sees fewer bytes than were announced
        await response.write(data)
        left -= len(data)


async def _answer(request: web.Request, conn: h11.Connection, reader: asyncio.StreamReader,
                  port: int, began: Callable[[], None]) -> web.StreamResponse:
    response: web.StreamResponse | None = None
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await asyncio.wait_for(reader.read(_READ), READ_SECONDS))
        elif isinstance(event, h11.Response):
            response = web.StreamResponse(status=event.status_code,
                                          reason=event.reason.decode("latin-1") or None)
            for name, value in event.headers:
                text = name.decode("latin-1")
                if text.lower() == "content-length":
                    response.content_length = int(value)
                elif text.lower() not in _DROPPED:
                    response.headers.add(text, value.decode("latin-1"))
            began()
            await response.prepare(request)
            if (response.content_length is not None and request.method != "HEAD"
                    and event.status_code not in (204, 304)):
                await _copy(conn, reader, response, response.content_length)
                break
        elif isinstance(event, h11.Data) and response is not None:
            await response.write(event.data)
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
        elif event is h11.PAUSED:  # a 101: what follows is not HTTP
            raise SessionError("an upgrade (WebSocket) through a port is not served yet",
                               reason=Reason.UNSUPPORTED)
        # an InformationalResponse (100 Continue) is passed over
    if response is None:
        raise SessionError(f"port {port} closed the connection without an answer",
                           reason=Reason.PORT_UNREACHABLE)
    await response.write_eof()
    return response
