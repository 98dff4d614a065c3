"""Everything sealgate does to mitmproxy's insides, in one place, for the version it was tested on.

mitmproxy's addon API (hooks, flows, options) is public and sealgate uses it everywhere. What is
here goes past it: module globals and methods replaced, private attributes read. Each patch is
scoped to mitmproxy's own modules (a namespace of its own where mitmproxy calls asyncio, never
`asyncio` itself), and each symbol it relies on is checked before anything is patched: a
mitmproxy that moved one refuses to start (`require_tested`), naming it, rather than run with a
patch silently missing (an HTML error page naming the address dialed, an unbounded dial).
pyproject.toml pins the tested version; tests/unit/test_mitm.py runs the same checks.

The patches, and why:

- upstream dials and the proxy's TLS handshakes with upstreams bounded, upstream failures
  answered as JSON (upstream.py);
- upstream HTTP/1 connections kept across client connections: every dial through the pool,
  which learns each connection's HTTP/1 client layer when mitmproxy makes it, a handshake
  already done finished at once, a client's `Connection: close` kept off the upstream leg
  (hop-by-hop), and a safe request whose kept connection the origin closed sent once more
  (pool.py, keeping.py);
- request heads bounded in size and time while they are read, idle connections closed
  (limits.py), an upstream's wait for its response head bounded (deadline.py);
- a request refused at its head answered before its body, which is read and dropped within
  bounds so that a client still sending it reads the refusal (linger.py), and a
  streamed body cut off past its request's cap, upstream and downstream (bodycap.py);
- a body's framing across HTTP versions: an HTTP/2 body of no declared length chunked into
  HTTP/1, an empty DATA frame never taken for the end, an upstream's informational answer
  never taken for its final one (framing.py);
- several workers on one port: mitmproxy binds with no SO_REUSEPORT (proxy/process/master.py);
- per-request conveniences for mitmproxy's developers left out (speedups.py), and the
  `update` walk of the addon chain after every flow event, which only UIs handle;
- hooks dispatched from handlers looked up once per hook name, and a hook whose handlers are
  all plain functions run without a task of its own (hooks.py);
- base-URL requests on plain HTTP/1.1 connections served in front of mitmproxy's handler
  (fastpath.py), which gets every connection the fast path does not take;
- what the pipeline needs and mitmproxy has no API for: cutting a client off in the middle of a
  streamed response, the listen endpoints, a pinned connection's name given back, whether
  an HTTP/1 request came in origin form (base-URL mode, proxy/request/baseurl.py), and HTTP/2 chosen
  for a client that offers it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import wsproto.events
from mitmproxy import addonmanager, certs, connection, flow, http, optmanager, tls
from mitmproxy.addons import tlsconfig
from mitmproxy.net.http import http1, status_codes
from mitmproxy.proxy import commands, context, events, mode_servers, mode_specs, server
from mitmproxy.proxy.events import Event
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers import tcp, websocket
from mitmproxy.proxy.layers import tls as tls_layers
from mitmproxy.proxy.layers.http import HttpLayer, HttpStream, _http1, _http2
from mitmproxy.proxy.layers.http._events import (
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
    ResponseProtocolError,
)
from mitmproxy.utils import asyncio_utils
from OpenSSL import crypto

from ..errors import ProxyError
from . import (
    bodycap,
    deadline,
    fastdial,
    fastpath,
    framing,
    handlers,
    hooks,
    keeping,
    limits,
    linger,
    pool,
    speedups,
    upstream,
)
from .mitmcheck import mismatches
from .splice import relaying

TESTED = "11.0"  # the mitmproxy minor version the patches and checks were written against


class MitmproxyMismatch(ProxyError, RuntimeError):
    """The installed mitmproxy is not shaped the way the patches here expect (the proxy does not
    start: `internal_error`)."""


def require_tested() -> None:
    """Raise MitmproxyMismatch, naming every symbol gone or changed, unless all are as tested."""
    if problems := mismatches():
        raise MitmproxyMismatch(
            f"sealgate: mitmproxy is not as tested ({TESTED}.x); refusing to run with these "
            "patches missing:\n  " + "\n  ".join(problems)
        )


def install(
    connect_timeout: float, *, reuse_port: bool, bounds: limits.HttpLimits | None = None,
    fast_prefix: str | None = None,
) -> fastpath.FastPath | None:
    """Check every symbol, then patch: all of it, or nothing. Once per process (a second time
    would wrap the HTTP/2 handler twice). With `fast_prefix` (the base-URL prefix), the fast
    path in front of the regular listener: its addon, for the master to load, is returned."""
    if _http1.make_error_response is upstream.error_response:
        raise RuntimeError("sealgate.proxy.mitm.install: already installed in this process")
    require_tested()
    kept = pool.install(pool.Pool(connect_timeout))
    _scoped_asyncio(server, open_connection=kept.dial)  # bounded by connect_timeout
    _http1.Http1Client.__init__ = _told_to(kept, _http1.Http1Client.__init__)  # type: ignore[method-assign]
    HttpLayer.get_connection = keeping.reused_by_streams(HttpLayer.get_connection)  # type: ignore[method-assign]
    tls_layers.ServerTLSLayer.start_handshake = keeping.finished_at_once(  # type: ignore[method-assign, assignment]
        tls_layers.ServerTLSLayer.start_handshake)
    if reuse_port:
        _scoped_asyncio(
            mode_servers, start_server=functools.partial(asyncio.start_server, reuse_port=True)
        )
    _http1.make_error_response = upstream.error_response
    tls_layers.ServerTLSLayer.start_tls = upstream.bounded_handshake(  # type: ignore[method-assign, assignment]
        tls_layers.ServerTLSLayer.start_tls, connect_timeout
    )
    tls_layers.ServerTLSLayer._handshake_finished = upstream.named_failure(  # type: ignore[method-assign, assignment]
        tls_layers.ServerTLSLayer._handshake_finished
    )
    bounds = bounds or limits.HttpLimits()
    limits.enforce(bounds)
    _http1.Http1Server.send = framing.head_with_body(_http1.Http1Server.send)  # type: ignore[method-assign, assignment]
    _http1.Http1Client.read_headers = framing.interim_skipped(  # type: ignore[method-assign, assignment]
        _http1.Http1Client.read_headers)
    _http1.Http1Server.read_headers = _bounded_heads(  # type: ignore[method-assign, assignment]
        _http1.Http1Server.read_headers, bounds
    )
    # The watchdog of every connection reads this when the connection is accepted.
    server.TCP_TIMEOUT = bounds.idle_seconds  # type: ignore[assignment]
    fast = None
    if fast_prefix is not None:
        fast = fastpath.install(fastpath.FastPath(fastdial.install(
            fastdial.Dialer(connect_timeout, bounds.idle_seconds)), bounds, fast_prefix))
        mode_servers.ServerInstance.handle_stream = fastpath.front(  # type: ignore[method-assign]
            mode_servers.ServerInstance.handle_stream, fast)
    HttpStream._handle_event = deadline.bounded_wait(  # type: ignore[method-assign]
        HttpStream._handle_event, bounds.response_seconds
    )
    _scoped(_http1, "http1", read_request_head=_marking_origin_form(http1.read_request_head))
    _http2.Http2Server._handle_event = _json_errors(  # type: ignore[method-assign, assignment]
        _http2.Http2Server._handle_event
    )
    # Framed first: it marks an HTTP/2 request's unframed body chunked on the request itself,
    # which the HTTP/1.1 copy kept_open sends then carries.
    _http1.Http1Client.send = framing.framed_for_http1(keeping.kept_open(  # type: ignore[method-assign, assignment]
        _http1.Http1Client.send
    ))
    HttpStream.state_stream_request_body = framing.no_empty_chunks(  # type: ignore[method-assign]
        bodycap.counted(HttpStream.state_stream_request_body, bounds)
    )
    HttpStream.handle_protocol_error = keeping.retried_once(bodycap.quiet_upstream(  # type: ignore[method-assign, assignment]
        HttpStream.handle_protocol_error))
    HttpStream.state_stream_response_body = framing.no_empty_chunks(  # type: ignore[method-assign]
        HttpStream.state_stream_response_body
    )
    HttpStream.state_wait_for_request_headers = linger.answered_before_body(  # type: ignore[method-assign]
        HttpStream.state_wait_for_request_headers, bounds
    )
    websocket.WebsocketLayer._handle_event = _scrub_setup(
        websocket.WebsocketLayer.start
    )
    websocket.WebsocketConnection.send2 = _scrubbed_control(  # type: ignore[method-assign, assignment]
        websocket.WebsocketConnection.send2
    )
    # Type-checks every field of every Request and Response against its annotation (only
    # `if __debug__`); the values come from mitmproxy's own parser. Running everything with -O
    # would drop the asserts mitmproxy and sealgate rely on too, so only this check goes.
    http.MessageData.__post_init__ = lambda self: None  # type: ignore[method-assign]
    for name, lookup in speedups.header_lookups(http._always_bytes).items():
        setattr(http.Headers, name, functools.wraps(getattr(http.Headers, name))(lookup))
    asyncio_utils.set_task_debug_info = speedups.name_task
    context.Context.fork = functools.wraps(context.Context.fork)(  # type: ignore[method-assign, assignment]
        speedups.forks_keeping_the_server(context.Context))
    optmanager._Option.current = speedups.option_reads(  # type: ignore[method-assign, assignment]
        optmanager._Option.current, optmanager.unset)
    # The leaf's certificate and key converted for pyOpenSSL once, not for every handshake.
    certs.Cert.to_pyopenssl = speedups.converted_once(certs.Cert.to_pyopenssl)  # type: ignore[method-assign, assignment]
    _scoped(tlsconfig, "crypto", PKey=speedups.keys_once(crypto.PKey))
    hooks.install()
    tcp.TCPLayer.relay_messages = relaying(tcp.TCPLayer.relay_messages)  # type: ignore[method-assign]
    # What flow.py and connection.py call `uuid`; uuid4() is all they use of it (checked).
    ids = types.SimpleNamespace(uuid4=speedups.RandomIds().uuid4)
    for module in (flow, connection):
        vars(module)["uuid"] = ids
    return fast


def _told_to(kept: pool.Pool, init: Callable[..., None]) -> Callable[..., None]:
    """Http1Client.__init__, which also tells the pool the layer of its connection."""

    @functools.wraps(init)
    def made(self: _http1.Http1Client, context: Any) -> None:
        init(self, context)
        kept.http_client(self)

    return made


def _scoped_asyncio(module: types.ModuleType, **replaced: Callable[..., Any]) -> None:
    """Give `module` an asyncio of its own with `replaced` swapped in: the rest of the process
    (the guard's resolver, the control API) keeps the real functions."""
    _scoped(module, "asyncio", **replaced)


def _scoped(module: types.ModuleType, name: str, **replaced: object) -> None:
    """Give `module` its own copy of the module it calls `name`, with `replaced` swapped in."""
    original = vars(module)[name]
    scoped = types.ModuleType(f"{original.__name__} (as {module.__name__} sees it)")
    vars(scoped).update(vars(original))
    vars(scoped).update(replaced)
    vars(module)[name] = scoped


# Requests whose HTTP/1 request line was in origin form (`GET /path`), as read off the wire:
# mitmproxy fills in the host from the Host header and then, for the upstream, rewrites every
# HTTP/1 request line into origin form, so the hooks cannot tell the forms apart.
_ORIGIN_FORM: weakref.WeakSet[http.Request] = weakref.WeakSet()


def _marking_origin_form(
    read: Callable[[list[bytes]], http.Request],
) -> Callable[[list[bytes]], http.Request]:
    @functools.wraps(read)
    def read_request_head(lines: list[bytes]) -> http.Request:
        request = read(lines)
        if not request.data.host and request.method != "CONNECT":
            _ORIGIN_FORM.add(request)
        return request

    return read_request_head


def origin_form(request: http.Request) -> bool:
    """Whether `request` came as an HTTP/1 request line in origin form."""
    return request in _ORIGIN_FORM


_Handler = Callable[[_http2.Http2Server, Event], CommandGenerator[None]]


def _json_errors(handle: _Handler) -> _Handler:
    """mitmproxy's HTTP/2 server answers a stream's failure with its HTML page where it can
    still send headers (else it resets the stream); send the JSON refusal as a response there
    instead."""

    @functools.wraps(handle)
    def handle_event(self: _http2.Http2Server, event: Event) -> CommandGenerator[None]:
        if (
            isinstance(event, ResponseProtocolError)
            and event.code != status_codes.NO_RESPONSE
            and self.is_open_for_us(event.stream_id)
            and not self.h2_conn.streams[event.stream_id].state_machine.headers_sent
        ):
            response = upstream.refusal(event.code, event.message)
            stream = event.stream_id
            yield from handle(self, ResponseHeaders(stream, response, end_stream=False))
            yield from handle(self, ResponseData(stream, response.raw_content or b""))
            yield from handle(self, ResponseEndOfMessage(stream))
        else:
            yield from handle(self, event)

    return handle_event


_Read = Callable[[_http1.Http1Server, events.ConnectionEvent], CommandGenerator[None]]
# When the head being read began, per HTTP/1 server (its first byte's arrival).
_HEAD_BEGAN: weakref.WeakKeyDictionary[_http1.Http1Server, float] = weakref.WeakKeyDictionary()


def _bounded_heads(read: _Read, bounds: limits.HttpLimits) -> _Read:
    """mitmproxy's HTTP/1 server reads a request head until its blank line, however long it
    grows and however slowly it comes ("FIXME: protect against header size DoS"). Refused while
    it is read: over the size or the time before it is complete, over the URI or field count
    once it is (before mitmproxy acts on it); answered with the JSON refusal, then closed."""

    @functools.wraps(read)
    def read_headers(
        self: _http1.Http1Server, event: events.ConnectionEvent
    ) -> CommandGenerator[None]:
        denial = None
        if isinstance(event, events.DataReceived):
            now = time.monotonic()
            head = bytes(self.buf)
            ends = [i + len(mark) for mark in (b"\n\r\n", b"\n\n") if (i := head.find(mark)) >= 0]
            waited = now - _HEAD_BEGAN.setdefault(self, now)
            # Complete, only its size counts (what follows is the body, or the next request).
            denial = (limits.while_read(min(ends), 0.0, bounds) if ends
                      else limits.while_read(len(head), waited, bounds))
        if denial is None:
            before = self.request
            # Run to the end first: a head over the bounds must not reach the HTTP layer. (Its
            # commands are all replies-free: ReceiveHttp, SendData, CloseConnection, Log.)
            done = list(read(self, event))
            if self.request is not before and self.request is not None:
                _HEAD_BEGAN.pop(self, None)
                denial = limits.parsed(self.request, bounds)
            if denial is None:
                yield from done
                return
        yield commands.SendData(self.conn, upstream.refused_head(denial))
        yield commands.CloseConnection(self.conn)
        self.state = self.done

    return read_headers


# A WebSocket flow's metadata key for the function that masks a credential in bytes: set by
# the pipeline on a connection that carried one, read when mitmproxy relays control frames.
CONTROL_SCRUB = "sealgate_control_scrub"
_Start = Callable[[websocket.WebsocketLayer, Event], CommandGenerator[None]]


def _scrub_setup(start: _Start) -> _Start:
    """mitmproxy relays WebSocket control frames (ping and pong payloads, a close's reason)
    without a hook, as the same wsproto events it parsed: the connection to the client is
    handed the flow's masking function, which `_scrubbed_control` applies to them."""

    @functools.wraps(start)
    def start_scrubbed(self: websocket.WebsocketLayer, event: Event) -> CommandGenerator[None]:
        yield from start(self, event)
        if (scrub := self.flow.metadata.get(CONTROL_SCRUB)) is not None:
            self.client_ws.__dict__[CONTROL_SCRUB] = scrub

    return start_scrubbed


_Send2 = Callable[[websocket.WebsocketConnection, Any], Any]


def _scrubbed_control(send2: _Send2) -> _Send2:
    @functools.wraps(send2)
    def send(self: websocket.WebsocketConnection, event: Any) -> Any:
        scrub: Callable[[bytes], bytes] | None = self.__dict__.get(CONTROL_SCRUB)
        if scrub is not None:
            if isinstance(event, wsproto.events.Ping | wsproto.events.Pong):
                event = dataclasses.replace(event, payload=scrub(bytes(event.payload)))
            elif isinstance(event, wsproto.events.CloseConnection) and event.reason:
                reason = scrub(event.reason.encode()).decode(errors="replace")
                event = dataclasses.replace(event, reason=reason)
        return send2(self, event)

    return send


def skip_update_walk(addons: addonmanager.AddonManager) -> bool:
    """After each flow event mitmproxy walks the addon chain once more with an `update` event,
    which only UIs handle. With no addon handling it, send lifecycle events straight to the
    chain; True if it did."""
    if any(callable(getattr(a, "update", None)) for a in addonmanager.traverse(addons.chain)):
        return False
    addons.handle_lifecycle = addons.trigger_event  # type: ignore[method-assign]
    return True


def cut_off(flow: http.HTTPFlow) -> None:
    """Close the client's connection now, in the middle of a streamed response. mitmproxy has
    no hook for that; raising from a stream function would leave the client waiting for the
    rest until the idle timeout, and letting the stream end would tell it the body was whole.
    The writer is closed at once, so not even the end of the chunked body gets out."""
    flow.kill()
    close_client(flow.client_conn.id)


def close_client(client_id: str) -> None:
    """Close a client's connection now, whatever its layers are waiting for (a handshake that
    does not finish, a stream cut off): its writer first, so nothing more gets out."""
    handler = handlers.handler_of(client_id)
    if handler is None:
        if (close := handlers.fast_closer(client_id)) is not None:
            close()  # a connection the fast path serves
        return
    io = handler.transports.get(handler.client)
    if io is not None and io.writer is not None:
        io.writer.close()
    handler.close_connection(handler.client)


def listen_endpoints(
    modes: Sequence[str], listen_host: str, listen_port: int | None
) -> list[tuple[str, int]]:
    """(host, port) of every listener the `mode` option asks for; unspecified hosts as
    0.0.0.0. Pass ctx.options.mode, .listen_host, .listen_port."""
    endpoints = []
    for spec in modes:
        mode = mode_specs.ProxyMode.parse(spec)
        port = mode.listen_port(listen_port)
        if port is not None:
            # mitmproxy keeps an IPv6 host's brackets; the guard compares bare addresses.
            host = (mode.listen_host(listen_host) or "0.0.0.0").strip("[]")  # noqa: S104
            endpoints.append((host, port))
    return endpoints


def prefer_h2(data: tls.TlsData, offered: Sequence[bytes]) -> None:
    """Speak HTTP/2 with a client that offers it. mitmproxy picks the first of the client's
    protocols it speaks, and clients list http/1.1 first for servers that mishandle h2 (httpx
    does), so a client asking for h2 got HTTP/1.1 on its leg. The choice is mitmproxy's ALPN
    callback's, read from the connection's app data, which `tls_start_client` has just set; a
    choice it made already (HTTP/1.1 for a TLS-wrapped proxy connection) is left alone."""
    if data.ssl_conn is None or b"h2" not in offered:
        return
    app: tlsconfig.AppData = data.ssl_conn.get_app_data()
    if app["client_alpn"] is None and app["server_alpn"] is None and app["http2"]:
        app["client_alpn"] = b"h2"


async def stop_listening(proxyserver: Any) -> None:
    """Close every listening socket; the connections already accepted go on."""
    await proxyserver.servers.update([])


def restore_address(server_conn: connection.Server, address: tuple[str, int]) -> None:
    """Give a connection dialed to a pinned IP back the address it was asked for: mitmproxy
    matches reusable upstream connections by address, and refuses a change on an open
    connection through `Server.__setattr__`, which this steps around."""
    object.__setattr__(server_conn, "address", address)
