"""A blind tunnel's bytes relayed socket to socket, past mitmproxy's layers (mitm.py installs it).

A CONNECT a rule passes through undecrypted is decided, pinned and checked (its ClientHello's
SNI) before a byte goes upstream; after that nothing of sealgate's looks at its bytes (no hook,
no budget counts them). mitmproxy still carries every chunk through its reading task, the
connection handler's lock, the layer stack (HTTP, the CONNECT's stream, TLS, TCP: a generator
each) and a SendData command back down: a py-spy profile of the tunnel at c=16 put about half
of the worker there, besides the socket writes themselves (18 %).

So once mitmproxy's TCP layer of an ignored connection (the only kind sealgate's tunnels make:
layers.py replaces every other raw TCP layer) has relayed a chunk, and both sockets are plain
TCP with nothing unread, nothing much unsent, and both reading tasks parked in `read`, each
socket's protocol is replaced by one that writes what it receives straight to the other socket,
pausing its reading while the other's buffer is full. The idle timeout still sees every chunk.
At the first end, error or close on either side, or any event mitmproxy is given for the
connection (its idle timeout, a drain, a deadline closing it), both sockets get their own
protocols back first, then the event goes on as it would have: mitmproxy's layers do the close,
and the connection's audit line is written as before.

The client's half-close of such a tunnel, spliced or not, is passed upstream as one here
(`_half_closing`): mitmproxy's TCP layer asks for it, but the CONNECT's HTTP stream above it turns
every half-close into a full close ("to be consistent", HttpStream.passthrough), so what the
origin sent after the client's end never reached the client.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
from collections.abc import Callable, Generator
from typing import Any

from mitmproxy import connection
from mitmproxy.proxy import commands, events, server
from mitmproxy.proxy.layers import tcp
from mitmproxy.proxy.layers.http import HttpStream

from .handlers import handler_of

_ASKED = "_sealgate_splice_asked"  # on a TCP layer: a splice is scheduled or done
SPLICE = "_sealgate_splice"  # on a connection handler: its live splice
_HAPPENED = "_sealgate_spliced"  # on a connection handler: it was spliced once


class _Relay(asyncio.Protocol):
    """One socket's protocol while spliced: its bytes go to the peer's socket."""

    def __init__(self, splice: Splice, transport: asyncio.Transport,
                 original: asyncio.BaseProtocol, activity: Callable[[], None]) -> None:
        self.splice = splice
        self.transport = transport
        self.original = original
        self.activity = activity
        self.peer: _Relay = self
        self.write_paused = False  # this socket's buffer is full: the peer's reading paused

    def data_received(self, data: bytes) -> None:
        self.peer.transport.write(data)
        self.activity()

    def eof_received(self) -> bool | None:
        self.splice.end()
        return self.original.eof_received()  # type: ignore[attr-defined, no-any-return]

    def connection_lost(self, exc: Exception | None) -> None:
        self.splice.end()
        self.original.connection_lost(exc)

    def pause_writing(self) -> None:
        self.write_paused = True
        self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.peer.transport.resume_reading()


class Splice:
    def __init__(self, handler: server.ConnectionHandler, a: asyncio.Transport,
                 b: asyncio.Transport) -> None:
        self.handler = handler
        activity = handler.timeout_watchdog.register_activity
        self.relays = (_Relay(self, a, a.get_protocol(), activity),
                       _Relay(self, b, b.get_protocol(), activity))
        self.relays[0].peer, self.relays[1].peer = self.relays[1], self.relays[0]
        for relay in self.relays:
            relay.transport.set_protocol(relay)
        setattr(handler, SPLICE, self)
        setattr(handler, _HAPPENED, True)

    def end(self) -> None:
        """Both sockets back to mitmproxy's protocols, as they were; once."""
        if getattr(self.handler, SPLICE, None) is not self:
            return
        delattr(self.handler, SPLICE)
        for relay in self.relays:
            relay.transport.set_protocol(relay.original)
            if relay.write_paused:  # the transport tells the original when it drains
                relay.original.pause_writing()
                relay.peer.transport.resume_reading()  # mitmproxy's drain waits for it


def end(handler: server.ConnectionHandler) -> None:
    """Give the handler's sockets back before mitmproxy handles an event (hooks.py calls it)."""
    splice: Splice | None = getattr(handler, SPLICE, None)
    if splice is not None:
        splice.end()


def happened(client_id: str) -> bool:
    """Whether client `client_id`'s tunnel was spliced (its connection's audit line says)."""
    handler = handler_of(client_id)
    return handler is not None and getattr(handler, _HAPPENED, False)


def _spliceable(io: server.ConnectionIO | None) -> asyncio.Transport | None:
    """The transport of a plain TCP socket whose reading task is parked in `read` with nothing
    unread, and whose write buffer is under its low mark (so its protocol is not paused)."""
    if io is None or not isinstance(io.reader, asyncio.StreamReader) or not isinstance(
            io.writer, asyncio.StreamWriter) or not isinstance(
            transport := io.writer.transport, asyncio.Transport):
        return None
    protocol = transport.get_protocol()
    if (type(protocol) is not asyncio.StreamReaderProtocol or transport.is_closing()
            or transport.get_extra_info("sslcontext") is not None
            or io.reader._waiter is None or io.reader._buffer or io.reader.at_eof()  # type: ignore[attr-defined]
            or transport.get_write_buffer_size() > transport.get_write_buffer_limits()[0]):
        return None
    return transport


def _try(layer: tcp.TCPLayer) -> None:
    client, upstream = layer.context.client, layer.context.server
    handler = handler_of(client.id)
    if handler is None or getattr(handler, SPLICE, None) is not None:
        return
    both = connection.ConnectionState.CAN_READ | connection.ConnectionState.CAN_WRITE
    if client.state is both and upstream.state is both and not handler.hook_tasks and (
            (a := _spliceable(handler.transports.get(client))) is not None
            and (b := _spliceable(handler.transports.get(upstream))) is not None):
        Splice(handler, a, b)
    else:
        vars(layer).pop(_ASKED, None)  # not yet: asked again at the next chunk


def _half_closing(layer: tcp.TCPLayer, relayed: Generator[Any, Any, None]
                  ) -> Generator[Any, Any, None]:
    """The TCP layer's commands at an end of an ignored connection, with its half-close of the
    upstream done here, as the connection handler would do it, instead of handed up: the
    CONNECT's HttpStream.passthrough would make it a full close (mitmproxy 11.0,
    proxy/layers/http/__init__.py:877-883), and the origin's answer to the client's end would
    be lost with the socket. Only the upstream's: it is a socket of its own, while the client's
    side of a CONNECT over HTTP/2 is a stream, which only mitmproxy's layers can end."""
    upstream = layer.context.server
    for command in relayed:  # no reply to send: an ignored connection's end has no hook
        if type(command) is commands.CloseTcpConnection and command.half_close and (
                command.connection is upstream):
            handler = handler_of(layer.context.client.id)
            if handler is not None and upstream in handler.transports:
                handler.close_connection(upstream, half_close=True)
                continue
        yield command


def relaying(relay: Callable[..., Generator[Any, Any, None]]) -> Callable[..., Any]:
    """TCPLayer.relay_messages, which asks for a splice after a chunk of an ignored connection
    (no flow: nothing looks at its bytes), once the chunk's own handling is over, and passes
    the client's half-close of one upstream as a half-close (`_half_closing`)."""

    @functools.wraps(relay)
    def relay_messages(self: tcp.TCPLayer, event: events.Event) -> Generator[Any, Any, None]:
        if type(event) is events.DataReceived:
            if self.flow is None and not vars(self).get(_ASKED):
                vars(self)[_ASKED] = True
                asyncio.get_running_loop().call_soon(_try, self)
        elif self.flow is None and type(event) is events.ConnectionClosed:
            return _half_closing(self, relay(self, event))
        return relay(self, event)

    return relay_messages


def changed() -> list[str]:
    """What this module relies on that is not as tested, by name (mitmcheck.py: the proxy does
    not start): mitmproxy's TCP relay and reading loop, the CONNECT's passthrough and the
    handler's close by source, asyncio's reader by the attributes read above."""
    tested: list[tuple[Callable[..., Any], str]] = [
        (tcp.TCPLayer.relay_messages, "3b3d49a9f63b7d40"), (tcp.TCPLayer.start, "b1418418362ceaa7"),
        (tcp.TCPLayer.__init__, "1aa7d03a0e4a1b05"),
        (server.ConnectionHandler.handle_connection, "95c3f93e9824e527"),
        (server.ConnectionHandler.close_connection, "c0d10cc05dd65b80"),
        (HttpStream.passthrough, "33d9057d13750eca"),
    ]
    found = [fn.__qualname__ for fn, digest in tested if hashlib.sha256(
        inspect.getsource(inspect.unwrap(fn)).encode()).hexdigest()[:16] != digest]
    if not {"_waiter", "_buffer"} <= set(asyncio.StreamReader.__init__.__code__.co_names):
        found.append("asyncio.StreamReader.__init__")
    return found
