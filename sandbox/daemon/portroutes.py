"""The API's routes to a sandbox's ports (docs/sandbox-api.md, Ports), reached by the harness
only:

- `/v1/sandboxes/{id}/ports/{port}/{path}`: HTTP, and a WebSocket upgrade (`ports`);
- `GET /v1/sandboxes/{id}/tcp/{port}`: a raw TCP stream in a WebSocket's binary messages;
- `POST /v1/sandboxes/{id}/urls {"port", "expires_in"?}`: a signed URL for a browser, a daemon
  call outside `/ports/{port}/`, which is the sandbox server's path space;
- `/v1/signed/{token}/{path}`: a signed URL's requests, the one route the daemon serves without
  its bearer key (`add_to` returns it for the API's set of open routes), and to nothing but
  the port its token names.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from . import bodies, guestdial, ports, relay
from .bodies import BadRequest
from .session import Session
from .signing import Signer

_SIGNED_PREFIX = "/v1/signed/"
# The segments of a route's raw path before its {path} ("", "v1", ..., {port} or {token}).
_PORT_SEGMENTS, _SIGNED_SEGMENTS = 6, 4


def loggable(request: web.BaseRequest) -> str:
    """The request's path for a log line: a signed URL's token is a credential (whoever has it
    reaches the port), so it is never written there."""
    path = request.path
    if path.startswith(_SIGNED_PREFIX):
        _, _, rest = path[len(_SIGNED_PREFIX):].partition("/")
        path = f"{_SIGNED_PREFIX}<token>/{rest}"
    return path[:80]


class PortRoutes:
    """The handlers, given how the API finds its daemon (`daemon`: the app's key for it) and
    marks an answer begun (`streaming`: set once errors can no longer be a JSON answer)."""

    def __init__(self, daemon: web.AppKey[Any], streaming: str) -> None:
        self._daemon = daemon
        self._streaming = streaming
        self._signer = Signer()

    def add_to(self, app: web.Application) -> frozenset[web.AbstractRoute]:
        """The routes added to `app`; of them, those served without the daemon's key (the
        signed route, which checks its own token)."""
        app.router.add_route("*", "/v1/sandboxes/{id}/ports/{port}/{path:.*}", self._port)
        app.router.add_get("/v1/sandboxes/{id}/tcp/{port}", self._tcp)
        app.router.add_post("/v1/sandboxes/{id}/urls", self._url)
        return frozenset({app.router.add_route("*", "/v1/signed/{token}/{path:.*}",
                                               self._signed)})

    def _session(self, request: web.Request, ident: str) -> Session:
        """The sandbox whose port is asked for; its ended, paused and busy refusals come from
        `Session.serving`, which each connection holds (`_connected`)."""
        session: Session = request.app[self._daemon].get(ident)
        return session

    async def _port(self, request: web.Request) -> web.StreamResponse:
        port = _port_number(request.match_info["port"])
        return await self._forward(request, self._session(request, request.match_info["id"]),
                                   port, _PORT_SEGMENTS, browser=False)

    async def _signed(self, request: web.Request) -> web.StreamResponse:
        ident, port = self._signer.check(request.match_info["token"])
        return await self._forward(request, self._session(request, ident), port,
                                   _SIGNED_SEGMENTS, browser=True)

    async def _forward(self, request: web.Request, session: Session, port: int,
                       segments: int, *, browser: bool) -> web.StreamResponse:
        def began() -> None:
            request[self._streaming] = True

        tail = _raw_tail(request, segments)
        async with _connected(session, port) as sock:
            return await ports.forward(request, sock, port, tail, began=began,
                                       ended=session.ended, browser=browser)

    async def _tcp(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request, request.match_info["id"])
        port = _port_number(request.match_info["port"])
        ws = web.WebSocketResponse(max_msg_size=relay.MAX_MESSAGE)
        if not ws.can_prepare(request).ok:
            raise BadRequest("a WebSocket handshake (GET with Upgrade: websocket)")
        # Connected first: nothing listening is the daemon's plain refusal, not a closed socket.
        async with _connected(session, port) as sock:
            reader, writer = await ports.stream(sock)
            try:
                request[self._streaming] = True
                await ws.prepare(request)
                await relay.tcp(ws, reader, writer, session.ended)
            finally:
                writer.close()
                await ws.close()
        return ws

    async def _url(self, request: web.Request) -> web.Response:
        daemon = request.app[self._daemon]
        session = daemon.get(request.match_info["id"])
        body = await bodies.body(request, {"port", "expires_in"})
        port = body.get("port")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise BadRequest("'port': a port from 1 to 65535")
        # No URL outlives the longest a sandbox may live; by default an hour, or that.
        most = daemon.max_ttl
        expires_in = bodies.number(body, "expires_in", min(3600.0, most), low=1,
                                   high=most) or min(3600.0, most)
        expires = int(time.time() + expires_in)
        path = f"/v1/signed/{self._signer.sign(session.id, port, expires)}/"
        # Only a TCP caller's address is one a browser could use; the unix socket's is not.
        over_tcp = not isinstance(request.transport and
                                  request.transport.get_extra_info("sockname"), str)
        url = f"{request.scheme}://{request.host}{path}" if over_tcp else None
        return web.json_response({"url": url, "path": path, "port": port, "expires_at": expires},
                                 status=201)


@contextlib.asynccontextmanager
async def _connected(session: Session[Any], port: int) -> AsyncIterator[socket.socket]:
    """A connection to `port` on the sandbox's loopback, counted as one of its requests while it
    lasts (`Session.serving`), closed at the end. A microVM's guest and a pod have a loopback of
    their own, which no socket of the daemon's reaches (`Holder.netns` is None): the agent
    connects there (`guestdial`)."""
    with session.serving() as ident:
        if (netns := session.slot.netns) is None:
            async with guestdial.dial(session, ident, port) as dialed:
                yield dialed
        else:
            sock = await ports.connect(netns, port)
            try:
                yield sock
            finally:
                sock.close()  # without a descriptor once a relay took it over (`ports.stream`)


def _raw_tail(request: web.Request, before: int) -> str:
    """The path below the route's prefix as the caller sent it, escapes and all, with its query:
    the server in the sandbox must get `a%2Fb` and `%3F`, not what aiohttp decoded them to
    (another path, or a query). The prefix is the route's segments before `{path}`; escapes
    within them (a `%2F` in an id) would shift the tail, and are refused."""
    raw, _, query = request.raw_path.partition("?")
    parts = raw.split("/", before)
    tail = parts[before] if len(parts) > before else ""
    if unquote(tail) != request.match_info["path"]:
        raise BadRequest("an escaped '/' in the route's own segments (an id, a port or token)")
    return tail + (f"?{query}" if query else "")


def _port_number(text: str) -> int:
    if not text.isdigit() or len(text) > 5 or not 0 < int(text) < 65536:
        raise BadRequest("a port from 1 to 65535")
    return int(text)

