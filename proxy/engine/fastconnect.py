"""A CONNECT on the fast path (fastpath.py): decided, answered, and its client's TLS terminated
without mitmproxy's layers, so that the HTTP/1.1 requests inside are served as the fast path
serves plain ones.

Why: a sandbox's short-lived processes open a new intercepted connection for nearly every
request, and mitmproxy's handling of one (its HTTP layer for the CONNECT, a layer per protocol
above it, each event handed down all of them, pyOpenSSL's handshake through memory buffers) was
most of what such a request cost (a py-spy profile: the handshake's own crypto ~8 %).

The order is mitmproxy's, with its hooks, on the same objects:

    CONNECT head -> http_connect (the pipeline decides, pins) -> [refused: its answer]
        -> http_connected -> "200 Connection established" -> the first flight read whole
        -> tls_clienthello (the SNI checked against the CONNECT) -> the client's TLS, with
           mitmproxy's leaf for it (fastleaf.py) -> requests (fastpath.py, fastexchange.py)

What the fast path does not serve goes on in mitmproxy's layers as the same connection
(continued.py), from the point it reached, before anything was acted on: first bytes that are
not a ClientHello (plain HTTP inside a tunnel), a ClientHello that offers HTTP/2 (mitmproxy
speaks it to the client; the fast path speaks HTTP/1.1 only) or HTTP/1.0 first, one a rule
passes through blind, one an addon wants answered after the upstream's handshake; and inside
the TLS, a request the fast path does not take.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any, Final, NamedTuple, Protocol, cast

from mitmproxy import connection, http, tls
from mitmproxy.net.http import http1
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers import tls as tls_layer
from mitmproxy.proxy.layers.http import _hooks as http_layer

from . import tlsstream
from .continued import context_for
from .fastexchange import hook, hooked, keeps, killed
from .fastleaf import Leaves
from .fastwire import Wire, WireError

_HELLO_BYTES: Final = 64 * 1024  # a ClientHello still incomplete past this is mitmproxy's
_HTTP1: Final = (b"http/1.1", b"http/1.0")


class Pipeline(Protocol):
    def handshake_refused(self, client: connection.Client) -> bool: ...


class Refused(NamedTuple):
    """The CONNECT was answered with a refusal; whether the connection carries on."""

    keeps: bool


class Handed(NamedTuple):
    """The tunnel goes on in mitmproxy's layers (continued.raw), its first bytes unread."""

    context: Context
    tls: bool


class Terminated(NamedTuple):
    """The client's TLS is up: its decrypted requests come on `wire`."""

    context: Context
    wire: Wire


Entered = Refused | Handed | Terminated | None  # None: the connection is closed


async def enter(wire: Wire, client: connection.Client, request: http.Request, *,
                leaves: Leaves, pipeline: Pipeline) -> Entered:
    """Serve the CONNECT `request` (read from `wire`, taken by fastpath.py) up to the tunnel's
    inside."""
    context = context_for(client, (request.host, request.port))
    flow_ = http.HTTPFlow(client, connection.Server(address=None))
    flow_.request = request
    flow_.live = True
    await hooked(http_layer.HttpConnectHook(flow_))
    if killed(flow_):
        return None
    flow_.server_conn.address = context.server.address
    if flow_.response is None:
        flow_.response = http.Response(request.data.http_version, 200, b"Connection established",
                                       http.Headers(), b"", None, time.time(), time.time())
    response = flow_.response
    if not 200 <= response.status_code < 300:
        await hooked(http_layer.HttpConnectErrorHook(flow_))
        flow_.live = False
        wire.writer.write(http1.assemble_response_head(response) + (response.raw_content or b""))
        await wire.drain()
        return Refused(keeps(request, response))
    await hooked(http_layer.HttpConnectedHook(flow_))
    wire.writer.write(http1.assemble_response_head(response))
    # The handshake deadline (handshake.py, armed by http_connect) closes a tunnel whose TLS
    # does not come up in time, through handlers.fast_closer; the idle bound is a backstop.
    try:
        async with asyncio.timeout(wire.idle):
            hello = await _first_flight(wire)
    except TimeoutError:
        return None
    if hello is None:
        return None if not len(wire.buf) else Handed(context, tls=_handshake(wire))
    client.sni, client.alpn_offers = hello.sni, hello.alpn_protocols
    if b"h2" in hello.alpn_protocols or next(
            (p for p in hello.alpn_protocols if p in _HTTP1), b"http/1.1") != b"http/1.1":
        return Handed(context, tls=True)
    data = tls.ClientHelloData(context, hello)
    await hook(tls_layer.TlsClienthelloHook(data))
    if pipeline.handshake_refused(client):
        return None  # no handshake, as mitmproxy's path gives none (pipeline.tls_start_client)
    if data.ignore_connection or data.establish_server_tls_first:
        return Handed(context, tls=True)
    try:
        inside = await _terminated(wire, leaves.context(context), wire.idle)
    except (OSError, ssl.SSLError, TimeoutError, ValueError):
        # The client refused the leaf, or left: closed, as on mitmproxy's path.
        await hook(tls_layer.TlsFailedClientHook(tls.TlsData(client, context)))
        return None
    _established(client, inside)
    await hook(tls_layer.TlsEstablishedClientHook(tls.TlsData(client, context)))
    return Terminated(context, inside)


async def _first_flight(wire: Wire) -> tls.ClientHello | None:
    """The tunnel's first bytes, read until they are a whole ClientHello; None when they are
    not one, or are one too large or malformed to take (what came stays in `wire.buf`), or
    when the client left first (nothing in `wire.buf`)."""
    while True:
        if len(wire.buf):
            if not _handshake(wire):
                return None
            try:
                hello = tls_layer.parse_client_hello(bytes(wire.buf))
            except ValueError:
                return None
            if hello is not None:
                return hello
            if len(wire.buf) > _HELLO_BYTES:
                return None
        try:
            if not await wire.more():
                wire.unread()
                return None
        except WireError:
            wire.unread()
            return None


async def _terminated(wire: Wire, context: ssl.SSLContext, seconds: float) -> Wire:
    """The client's TLS on `wire`'s connection, its first flight (read already, to look at)
    given to the handshake first; a new Wire on the same reader and writer, now decrypted."""
    await tlsstream.start(wire.reader, wire.writer, context, server_side=True, seconds=seconds,
                          early=wire.unread())
    return Wire(wire.reader, wire.writer, wire.idle)


def _handshake(wire: Wire) -> bool:
    """Whether what `wire` holds begins as a TLS handshake record."""
    return bytes(wire.buf)[:1] == b"\x16"


def _established(client: connection.Client, inside: Wire) -> None:
    """What mitmproxy's client TLS layer notes on a client connection after its handshake."""
    ssl_object: ssl.SSLObject = inside.writer.get_extra_info("ssl_object")
    client.tls = True
    client.timestamp_tls_setup = time.time()
    client.tls_version = cast(Any, ssl_object.version())
    cipher = ssl_object.cipher()
    client.cipher = cipher[0] if cipher else None
    alpn = ssl_object.selected_alpn_protocol()
    client.alpn = alpn.encode() if alpn else None
