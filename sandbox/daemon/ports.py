"""A port the sandbox serves, reached by the harness only: `/v1/sandboxes/{id}/ports/{port}/...`
forwards an HTTP request to the sandbox's own loopback, from a socket the daemon makes inside
its network namespace (`sandbox.host.nsocket`), so nothing else anywhere can reach that port
and no egress rule changes.

The request goes on as HTTP/1.1 (h11 writes it and reads the answer: a server in the sandbox is
untrusted, and its answer is parsed with caps, never copied through as bytes), without the
hop-by-hop headers and without the daemon's own `Authorization` (the bearer key of a TCP
listener must never reach the sandbox). The answer streams back as it comes. A WebSocket
handshake goes on as one, and once the server answers 101 the connection is no longer HTTP:
its bytes are relayed both ways as they are (`relay`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

import h11
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from sealgate.reasons import Reason

from ..host import nsocket
from . import bodies, relay, splice
from .session import SessionError

MAX_HEAD = 64 << 10  # the answer's status line and headers
MAX_BODY = 24 << 20  # a request body forwarded (read whole: the daemon's own cap)
CONNECT_SECONDS = 10.0
READ_SECONDS = 300.0  # the most the answer may go without a byte
_READ = 1 << 20  # bytes taken from the server at a time
_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]  # a connection to the sandbox's port
# Not forwarded either way: the connection's own, and what is the daemon's or recomputed.
# X-Sealgate-Error marks the daemon's own refusals: a server in the sandbox may not forge one.
_DROPPED = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                      "te", "trailer", "transfer-encoding", "upgrade", "host", "authorization",
                      "content-length", "x-sealgate-error"})
# And to a browser (a signed URL), what reaches past the sandbox's own path: every signed URL is
# on the daemon's one origin, so a worker scoped above `/v1/signed/{token}/` would serve other
# sandboxes' pages, and clearing the site's data clears theirs (Referrer-Policy: `_head`).
_BROWSER_DROPPED = frozenset({"service-worker-allowed", "referrer-policy", "clear-site-data"})


async def connect(netns: Path, port: int) -> socket.socket:
    """A connection to `port` on the loopback of the sandbox whose namespace is `netns`.
    Raises SessionError (port_unreachable) when nothing accepts it."""
    try:
        sock = await asyncio.to_thread(nsocket.socket_in, netns)
    except nsocket.NamespaceError as exc:  # the daemon out of descriptors, the sandbox gone
        raise SessionError(f"cannot connect to port {port} in the sandbox: {exc}",
                           reason=Reason.PORT_UNREACHABLE) from None
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), CONNECT_SECONDS)
    except (OSError, TimeoutError):
        sock.close()
        raise SessionError(f"nothing in the sandbox accepts connections on port {port}",
                           reason=Reason.PORT_UNREACHABLE) from None
    return sock


async def stream(sock: socket.socket) -> _Stream:
    """`sock`'s connection as asyncio streams, for what is relayed rather than parsed: they own
    its descriptor from here, which `sock` gives up (its close is then a no-op), so that no
    close of `sock` can take the number from under the streams' transport while it still
    waits to write there (the next socket given that number would have its bytes). Their
    writer closes it, after what it holds is sent; it is closed here if they cannot be made.
    The reader's limit is its buffer before it stops reading: a small one paces a large
    stream to a crawl."""
    taken = socket.socket(fileno=sock.detach())
    try:
        return await asyncio.open_connection(sock=taken, limit=_READ)
    except BaseException:
        taken.close()
        raise


async def forward(request: web.Request, sock: socket.socket, port: int, path: str, *,
                  began: Callable[[], None], ended: asyncio.Event,
                  browser: bool = False) -> web.StreamResponse:
    """`request` on `sock`, a connection to `port` in the sandbox (the caller's to close); its
    answer. `began` is called once the answer has started (errors after it end the stream, not
    a JSON answer). A WebSocket upgrade the server accepts is relayed until it closes or the
    sandbox `ended`. `browser`: a signed URL's request, whose answer must not send the URL (the
    credential) on as a Referer. Raises SessionError (port_unreachable) for no HTTP answer."""
    try:
        upgrade = _websocket(request)
        # An upgrade's GET has no body, and aiohttp hands what follows it to the relay.
        body = b"" if upgrade else await bodies.raw(request, MAX_BODY)
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        headers = [(name, value) for name, value in request.headers.items()
                   if name.lower() not in _DROPPED]
        headers += [("host", f"127.0.0.1:{port}")]
        headers += [("connection", "upgrade"), ("upgrade", "websocket")] if upgrade else \
            [("connection", "close"), ("content-length", str(len(body)))]
        target = "/" + path  # raw, its query included (portroutes._raw_tail)
        sent = b"".join(conn.send(event) or b"" for event in (
            h11.Request(method=request.method, target=target, headers=headers),
            h11.Data(data=body), h11.EndOfMessage()))
        await asyncio.get_running_loop().sock_sendall(sock, sent)
        return await _answer(request, conn, sock, port, began=began, ended=ended,
                             browser=browser)
    except (h11.ProtocolError, ConnectionError, TimeoutError, ValueError) as exc:
        # ValueError: h11's own int() of a Content-Length of thousands of digits.
        raise SessionError(f"port {port} did not answer with HTTP: {type(exc).__name__}",
                           reason=Reason.PORT_UNREACHABLE) from None


def _websocket(request: web.Request) -> bool:
    """A WebSocket handshake, as aiohttp's parser tells one (it then hands the connection's
    further bytes to whoever takes them, not to its HTTP parser)."""
    tokens = {t.strip().lower() for t in request.headers.get("connection", "").split(",")}
    return "upgrade" in tokens and request.headers.get("upgrade", "").lower() == "websocket"


async def _body(request: web.Request, conn: h11.Connection, sock: socket.socket,
                response: web.StreamResponse, client: AbstractStreamWriter) -> None:
    """A body of a known length, moved as it comes: past the head there is nothing left to
    parse. By splice(2) where it can (`splice`), else read and written."""
    length = response.content_length or 0
    pending = bytes(conn.trailing_data[0][:length])
    if pending:
        await response.write(pending)
    left = length - len(pending)
    if splice.usable(request):
        left -= await splice.body(sock, request, client, left, READ_SECONDS)
    loop = asyncio.get_running_loop()
    while left > 0:
        data = await asyncio.wait_for(loop.sock_recv(sock, min(_READ, left)), READ_SECONDS)
        if not data:
            break
        await response.write(data)
        left -= len(data)
    if left > 0 and request.transport is not None:
        # Cut short by the server: the caller's connection is closed, so it sees a cut body
        # rather than waiting on a keep-alive connection for bytes that will not come.
        request.transport.close()


async def _answer(request: web.Request, conn: h11.Connection, sock: socket.socket, port: int,
                  *, began: Callable[[], None], ended: asyncio.Event,
                  browser: bool) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    response: web.StreamResponse | None = None
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await asyncio.wait_for(loop.sock_recv(sock, _READ), READ_SECONDS))
        elif isinstance(event, h11.InformationalResponse) and event.status_code == 101:
            return await _switched(request, conn, event, sock, began=began, ended=ended,
                                   browser=browser)
        elif isinstance(event, h11.Response):
            response = _head(event.status_code, event.reason, event.headers, browser)
            began()
            client = await response.prepare(request)
            assert client is not None  # prepared: its writer
            try:
                await _rest(request, conn, sock, response, client, status=event.status_code)
            except (h11.ProtocolError, ConnectionError, TimeoutError, ValueError):
                # Begun, so no refusal can follow: the caller's connection is cut, and it sees
                # an answer cut short (never a complete-looking one, nor a traceback here).
                if request.transport is not None:
                    request.transport.close()
                return response
            break
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
        # an InformationalResponse (100 Continue) is passed over
    if response is None:
        raise SessionError(f"port {port} closed the connection without an answer",
                           reason=Reason.PORT_UNREACHABLE)
    await response.write_eof()
    return response


async def _rest(request: web.Request, conn: h11.Connection, sock: socket.socket,
                response: web.StreamResponse, client: AbstractStreamWriter, *,
                status: int) -> None:
    """The answer's body, after its head went to the caller."""
    if (response.content_length is not None and request.method != "HEAD"
            and status not in (204, 304)):
        await _body(request, conn, sock, response, client)
        return
    loop = asyncio.get_running_loop()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await asyncio.wait_for(loop.sock_recv(sock, _READ), READ_SECONDS))
        elif isinstance(event, h11.Data):
            await response.write(event.data)
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return


def _head(status: int, reason: bytes, headers: Iterable[tuple[bytes, bytes]],
          browser: bool) -> web.StreamResponse:
    """The server's status and headers, less the dropped ones, for the caller. Raises
    SessionError for a length and a transfer coding both (two framings: the caller's and the
    server's reading of where the answer ends could differ).

    For a browser (a signed URL): every sandbox's pages share the daemon's one origin, so what
    a page may set for its origin it sets for all of them. `Service-Worker-Allowed` is dropped
    (a worker registered at `/v1/signed/` would see every sandbox's requests), and
    `Referrer-Policy: no-referrer` replaces the page's own: the URL is the credential, and a
    Referer would carry it to whatever the page loads from elsewhere."""
    headers = list(headers)
    names = {name.lower() for name, _ in headers}
    if b"content-length" in names and b"transfer-encoding" in names:
        raise SessionError("the port answered with both Content-Length and Transfer-Encoding",
                           reason=Reason.PORT_UNREACHABLE)
    response = web.StreamResponse(status=status, reason=reason.decode("latin-1") or None)
    dropped = _DROPPED | _BROWSER_DROPPED if browser else _DROPPED
    for name, value in headers:
        text = name.decode("latin-1")
        if text.lower() == "content-length":
            response.content_length = int(value)
        elif text.lower() not in dropped:
            response.headers.add(text, value.decode("latin-1"))
    if browser:
        response.headers["Referrer-Policy"] = "no-referrer"
    return response


async def _switched(request: web.Request, conn: h11.Connection, event: h11.InformationalResponse,
                    sock: socket.socket, *, began: Callable[[], None],
                    ended: asyncio.Event, browser: bool) -> web.StreamResponse:
    """The server accepted the WebSocket (h11 only lets a 101 through to a request that asked
    for the upgrade): its 101 to the caller, then the bytes both ways as they are."""
    response = _head(101, event.reason, event.headers, browser)
    response.headers.update({"Connection": "Upgrade", "Upgrade": "websocket"})
    response.force_close()
    began()
    client = await response.prepare(request)
    assert client is not None  # prepared: its writer
    early, _ = conn.trailing_data
    reader, writer = await stream(sock)
    try:
        await relay.upgraded(request, client, bytes(early), (reader, writer), ended)
    finally:
        writer.close()  # the transport's: once what it still holds is sent
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), CONNECT_SECONDS)
    return response
