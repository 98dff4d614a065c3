"""The shape of every mitmproxy internal mitm.py patches or reads, checked.

A check names the symbol and says what was expected: that it exists, its parameters (names,
kinds, which have defaults), that the code meant to call a replaced global still calls it by
that name, that an attribute read from an instance is still set in `__init__`. It runs at
start-up (a few milliseconds) and in tests/unit/test_mitm.py. layers.py's reach into the
layer stack is checked here too.

Over 400 lines on purpose: it is one flat list of checks, one per patched or read internal,
each a few lines, and one place to read when mitmproxy is upgraded; split by theme it would
only scatter that list.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import re
import uuid
from collections.abc import Callable
from typing import Any

import h2.connection
import h2.stream
import wsproto.events
from h11._receivebuffer import ReceiveBuffer
from mitmproxy import addonmanager, certs, connection, flow, http, optmanager, tls
from mitmproxy.addons import proxyserver, tlsconfig
from mitmproxy.addons.tlsconfig import TlsConfig
from mitmproxy.coretypes import multidict
from mitmproxy.net.http import http1, status_codes
from mitmproxy.proxy import context, events, layer, mode_servers, mode_specs, server, tunnel
from mitmproxy.proxy.layers import ClientTLSLayer, HttpLayer, ServerTLSLayer, websocket
from mitmproxy.proxy.layers import tls as tls_layers
from mitmproxy.proxy.layers.http import (
    HTTPMode,
    HttpStream,
    _events,
    _http1,
    _http2,
    validate_request,
)
from mitmproxy.utils import asyncio_utils

from . import hooks, splice, tlsstream


class _Changed(Exception):
    pass


_CHECKS: list[tuple[str, Callable[[], None]]] = []


def _checks(symbol: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def register(check: Callable[[], None]) -> Callable[[], None]:
        _CHECKS.append((symbol, check))
        return check

    return register


def mismatches() -> list[str]:
    """One line per symbol that is gone or changed shape; empty when all are as tested."""
    found = []
    for symbol, check in _CHECKS:
        try:
            check()
        except _Changed as exc:
            found.append(f"{symbol}: {exc}")
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            found.append(f"{symbol}: gone or changed ({type(exc).__name__}: {exc})")
    return found


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise _Changed(what)


def _params(fn: Callable[..., Any], expected: str) -> None:
    """`expected` as `(a, b=, *, c=)`: names, kinds, and which have a default."""
    parts, star = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(p.name + ("=" if p.default is not p.empty else ""))
    found = f"({', '.join(parts)})"
    _expect(found == expected, f"expected parameters {expected}, found {found}")


def _names(fn: Callable[..., Any], *names: str) -> None:
    """`fn`'s own code reads (or sets, as attributes) every one of `names`."""
    missing = set(names) - set(fn.__code__.co_names)
    _expect(not missing, f"no longer uses {', '.join(sorted(missing))}")


def _fields(cls: type, *names: str) -> None:
    found = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in found]
    _expect(not missing, f"dataclass fields {missing} gone (has {found})")


def _coroutine(fn: Callable[..., Any]) -> None:
    _expect(inspect.iscoroutinefunction(fn), "is no longer a coroutine function")


# -- patched: upstream dials, error pages, listening sockets -------------------------------------


@_checks("mitmproxy.proxy.server.asyncio.open_connection")
def _server_dials() -> None:
    _expect(isinstance(vars(server).get("asyncio"), type(asyncio)), "module has no `asyncio`")
    _names(server.ConnectionHandler.open_connection, "asyncio", "open_connection")
    _names(server.ConnectionHandler.open_connection, "get_extra_info")  # all pool.py's writer has


@_checks("mitmproxy.proxy.layers.tls.ServerTLSLayer.start_tls")
def _server_handshakes() -> None:
    # Wrapped on the server side only (a blind tunnel's handshake is the client's): start_tls
    # sets `self.tls`; every end of a handshake goes through `_handshake_finished(err)`, a
    # close while it is under way too (as "connection closed").
    _params(tls_layers.ServerTLSLayer.start_tls, "(self)")
    _names(tls_layers.TLSLayer.start_tls, "tls", "ssl_conn")
    _params(tls_layers.ServerTLSLayer._handshake_finished, "(self, err)")
    _names(tunnel.TunnelLayer._handle_event, "_handshake_finished", "ConnectionClosed")
    _names(server.ConnectionHandler.close_connection, "transports", "cancel")
    _names(server.ConnectionHandler.handle_connection, "ConnectionClosed")


@_checks("mitmproxy.proxy.layers.http._http1.Http1Client")
def _kept_upstreams() -> None:
    # pool.py and keeping.py: every upstream HTTP/1 client layer is made with its context,
    # and says by its state, stream and buffer whether its connection sits between two
    # messages; a TLS
    # connection already given to TlsConfig is left alone; handle_connection reads with
    # read() and closes its writer only after its reading ended.
    _params(_http1.Http1Client.__init__, "(self, context)")
    _names(_http1.Http1Client.mark_done, "read_headers", "stream_id", "state")
    _names(_http1.Http1Connection.__init__, "buf")
    _names(tlsconfig.TlsConfig.tls_start_server, "ssl_conn")
    _names(server.ConnectionHandler.handle_connection, "read", "close")
    # A handshake found done at its first step is finished by the wrapper of start_handshake.
    _params(tls_layers.ServerTLSLayer.start_handshake, "(self)")
    _names(tls_layers.ServerTLSLayer.start_handshake, "start_tls", "receive_handshake_data")
    _names(tunnel.TunnelLayer._handshake_finished, "tunnel_state", "OPEN")
    _expect(isinstance(connection.Server.tls_established, property),
            "Server.tls_established is no longer a property")
    # A request sent again the way state_consume_request_body sends one without a body.
    _params(HttpStream.make_server_connection, "(self)")
    _names(inspect.unwrap(HttpStream.state_consume_request_body), "make_server_connection",
           "SendHttp",
           "RequestHeaders", "RequestEndOfMessage", "raw_content", "trailers")
    _names(_http1.Http1Client.read_headers, "response", "ResponseProtocolError")
    # The upstream copy of a request saying `close`, or of an HTTP/2 one made HTTP/1.1 as send
    # would: what send keeps and writes is the event's.
    _names(_http1.Http1Client.send, "request", "assemble_request_head", "is_http2",
           "authority", "http_version", "get_all")
    # An HTTP/2 client's stream given an idle HTTP/1 connection, as get_connection gives one.
    _params(HttpLayer.get_connection, "(self, event, *, reuse=)")
    _names(HttpLayer.get_connection, "connections", "waiting_for_establishment",
           "connection_spec_matches", "command_sources", "event_to_child",
           "GetHttpConnectionCompleted", "alpn", "connected")
    _expect(dataclasses.is_dataclass(http.RequestData), "RequestData is no dataclass")


@_checks("mitmproxy.proxy.layers.http._http1.Http1Server.send")
def _head_with_body() -> None:
    # framing.head_with_body: a head's one write held for the body's data that send_response
    # sends right after it, when the body is whole.
    _params(inspect.unwrap(_http1.Http1Server.send), "(self, event)")
    _names(inspect.unwrap(_http1.Http1Server.send), "assemble_response_head", "SendData",
           "ResponseData")
    _names(HttpStream.send_response, "raw_content", "ResponseHeaders", "ResponseData")


@_checks("mitmproxy.http.Headers")
def _header_lookups() -> None:
    # speedups.header_lookups: the same conversions, the same comparison, the same joining.
    _names(inspect.unwrap(http.Headers.get_all), "_always_bytes", "get_all")
    _names(multidict._MultiDict.get_all, "_kconv", "fields")
    _names(multidict._MultiDict.__getitem__, "get_all", "_reduce_values")
    _expect(http.Headers._kconv("A-B") == "a-b", "Headers no longer compares lower-cased")
    _expect(http.Headers._reduce_values(["a", "b"]) == "a, b", "Headers joins otherwise")
    _expect(http._native(b"\xff") == b"\xff".decode("utf-8", "surrogateescape"),
            "Headers decodes otherwise")


@_checks("mitmproxy.proxy.context.Context.fork")
def _forks() -> None:
    # speedups.forks_keeping_the_server: a Context is its client, options, server and layers,
    # and a fork shares the first three and copies the list.
    _expect(set(context.Context.__init__.__code__.co_names) == {
        "client", "options", "connection", "Server", "transport_protocol", "server", "layers"},
        "Context.__init__ sets something else")
    _names(inspect.unwrap(context.Context.fork), "Context", "client", "options", "server",
           "layers", "copy")


@_checks("mitmproxy.optmanager._Option.current")
def _option_reads() -> None:
    # speedups.option_reads: a value is the default's until set, `unset` marks it, and what a
    # read returns is a deep copy of it.
    _names(inspect.unwrap(optmanager._Option.current), "value", "unset", "default", "deepcopy")
    default = vars(optmanager._Option)["default"]
    _expect(isinstance(default, property), "_Option.default is no longer a property")
    _names(default.fget, "deepcopy", "_default")


@_checks("mitmproxy.proxy.mode_servers.asyncio.start_server")
def _servers_bind() -> None:
    _expect(isinstance(vars(mode_servers).get("asyncio"), type(asyncio)), "module has no `asyncio`")
    _names(mode_servers.AsyncioServerInstance.listen, "asyncio", "start_server")


@_checks("mitmproxy.proxy.mode_servers.ServerInstance.handle_stream")
def _fast_path_front() -> None:
    # fastpath.front: a regular listener's connections, each (reader, writer) as accepted.
    _params(mode_servers.ServerInstance.handle_stream, "(self, reader, writer=)")
    _names(mode_servers.AsyncioServerInstance.listen, "handle_stream")
    # fastwire and fastexchange: the readers and writers mitmproxy's HTTP/1 layers use.
    _params(_http1.make_body_reader, "(expected_size)")
    _params(http1.expected_http_body_size, "(request, response=)")
    _params(http1.read_response_head, "(lines)")
    _names(_http1.Http1Connection.read_body, "body_reader", "read_eof")
    _expect(vars(_http1).get("ReceiveBuffer") is ReceiveBuffer,
            "HTTP/1 no longer reads through h11's ReceiveBuffer")
    # Its smuggling checks, as the HTTP stream applies them to requests and responses.
    _params(validate_request, "(mode, request, validate_inbound_headers)")
    _names(HttpStream.check_invalid, "validate_request", "validate_headers")


@_checks("mitmproxy's CONNECT, client TLS and connection handler (fastconnect, continued)")
def _fast_connect() -> None:
    # fastconnect: the hooks and objects mitmproxy's CONNECT and client TLS layer use.
    _names(HttpStream.handle_connect, "HttpConnectHook")
    _names(HttpStream.handle_connect_finish, "HttpConnectedHook", "HttpConnectErrorHook")
    _params(tls_layers.parse_client_hello, "(data)")
    _names(ClientTLSLayer.receive_handshake_data, "TlsClienthelloHook", "ignore_connection",
           "establish_server_tls_first")
    _params(tls.ClientHelloData, "(context, client_hello, ignore_connection=, "
                                 "establish_server_tls_first=)")
    _params(tls.TlsData, "(conn, context, ssl_conn=, is_dtls=)")
    _params(TlsConfig.get_cert, "(self, conn_context)")
    _expect(callable(vars(tlsconfig).get("_default_ciphers")), "tlsconfig._default_ciphers gone")
    # continued: a handler for a client it did not make, its hooks through handle_hook, its
    # client's transport keyed by the client, the layers a tunnel's next_layer would give.
    _params(mode_servers.ProxyConnectionHandler.__init__, "(self, master, r, w, options, mode)")
    _names(server.LiveConnectionHandler.__init__, "transports", "ConnectionIO")
    _names(server.ConnectionHandler.handle_client, "handle_hook", "ClientConnectedHook",
           "ClientDisconnectedHook")
    _params(mode_servers.ServerManager.register_connection, "(self, connection_id, handler)")
    _params(ServerTLSLayer, "(context, conn=)")
    _params(ClientTLSLayer, "(context)")
    # fastexchange: a client's end seen while its request waits (the stream's close waiter).
    _params(vars(asyncio.StreamReaderProtocol)["_get_close_waiter"], "(self, stream)")
    missing = tlsstream.changed()
    _expect(not missing, f"asyncio's TLS stream changed: {', '.join(missing)}")


@_checks("mitmproxy.proxy.layers.http._http1.Http1Client.read_headers")
def _interim_answers() -> None:
    # framing.interim_skipped: the client layer reads a head off `buf` once it has a request.
    _params(_http1.Http1Client.read_headers, "(self, event)")
    _names(_http1.Http1Client.read_headers, "buf", "maybe_extract_lines", "request")


@_checks("mitmproxy.proxy.layers.http._http1.make_error_response")
def _http1_errors() -> None:
    _params(_http1.make_error_response, "(status_code, message=)")
    _names(_http1.Http1Server.send, "make_error_response")
    _names(_http1.Http1Server.read_headers, "make_error_response")


@_checks("mitmproxy.addons.proxyserver.Servers.update")
def _stop_listening() -> None:
    _params(proxyserver.Servers.update, "(self, modes)")
    _coroutine(proxyserver.Servers.update)
    _names(proxyserver.Proxyserver.__init__, "servers", "Servers")


@_checks("mitmproxy.addons.tlsconfig.AppData")
def _alpn_choice() -> None:
    _expect(set(tlsconfig.AppData.__annotations__) == {"client_alpn", "server_alpn", "http2"},
            "AppData's keys changed")
    _names(tlsconfig.alpn_select_callback, "get_app_data")
    _names(tlsconfig.TlsConfig.tls_start_client, "set_app_data", "AppData")


@_checks("mitmproxy.proxy.layers.http._http1.http1.read_request_head")
def _http1_request_head() -> None:
    _expect(hasattr(vars(_http1).get("http1"), "read_request_head"), "module has no `http1`")
    _params(http1.read_request_head, "(lines)")
    _names(_http1.Http1Server.read_headers, "http1", "read_request_head")
    # Origin form is what the parser leaves without a host (mitmproxy fills it in later).
    _expect(http1.read_request_head([b"GET /x HTTP/1.1", b"Host: a"]).data.host == "",
            "origin-form requests now come with a host")
    _expect(http1.read_request_head([b"GET http://a/x HTTP/1.1"]).data.host == "a",
            "absolute-form requests now come without their host")


@_checks("mitmproxy.proxy.layers.http.HttpStream.state_wait_for_request_headers")
def _refused_at_headers() -> None:
    wait = inspect.unwrap(HttpStream.state_wait_for_request_headers)  # under @expect
    _params(wait, "(self, event)")
    _names(wait, "client_state", "state_consume_request_body", "HttpRequestHeadersHook")
    _names(inspect.unwrap(HttpStream.state_consume_request_body), "send_response",
           "HttpResponseHeadersHook")
    _params(HttpStream.send_response, "(self, already_streamed=)")
    # A refused body being dropped (linger._dropping) ends the stream itself, at the body's end:
    # send_response ends it only when the client side is done.
    _names(HttpStream.send_response, "client_state", "state_done", "flow_done")
    _params(HttpStream.flow_done, "(self)")
    _names(HttpStream.flow_done, "DropStream", "ResponseEndOfMessage")
    # Past a bound the rest of a refused body goes to the errored state, which takes any event.
    _expect(callable(HttpStream.state_errored)
            and not hasattr(HttpStream.state_errored, "__wrapped__"),
            "HttpStream.state_errored now checks the events it is given")
    # HTTP/2: an end sent twice is not sent twice; a refused body past its bounds is reset
    # (CANCEL) once its answer is out.
    _names(_http2.Http2Connection._handle_event, "is_open_for_us", "end_stream", "is_closed",
           "CLIENT_CLOSED_REQUEST", "CANCEL", "reset_stream")


@_checks("mitmproxy.proxy.layers.http._http1.Http1Server.read_headers")
def _http1_heads() -> None:
    _params(_http1.Http1Server.read_headers, "(self, event)")
    _names(_http1.Http1Server.read_headers, "buf", "request", "state", "done")
    _names(_http1.Http1Connection._handle_event, "buf")
    _expect(isinstance(vars(server).get("TCP_TIMEOUT"), int | float), "no TCP_TIMEOUT")
    _names(server.ConnectionHandler.__init__, "TCP_TIMEOUT", "TimeoutWatchdog")


@_checks("mitmproxy.proxy.layers.http._http1.Http1Client.send")
def _http1_framing() -> None:
    _params(_http1.Http1Client.send, "(self, event)")
    # Each chunk's framing is read from the request the headers event carried.
    _names(_http1.Http1Client.send, "request", "headers", "get", "is_http2", "is_http3")
    _fields(_events.RequestHeaders, "stream_id", "request", "end_stream")


@_checks("mitmproxy.proxy.layers.http.HttpStream._handle_event (response deadline)")
def _response_deadline() -> None:
    _params(HttpStream._handle_event, "(self, event)")
    _params(HttpStream.handle_protocol_error, "(self, event)")
    _params(inspect.unwrap(HttpStream.state_wait_for_response_headers), "(self, event)")
    _names(HttpStream.__init__, "client_state", "server_state", "stream_id")
    # A stream's wake-up is routed back to it through the HTTP layer's table of sources.
    _names(HttpLayer.event_to_child, "command_sources", "RequestWakeup")
    _names(HttpLayer._handle_event, "command_sources", "CommandCompleted")
    _names(HttpLayer.__init__, "command_sources")
    _names(vars(HttpStream)["mode"].func, "layers", "index")
    _names(_http1.Http1Client.send, "RequestProtocolError", "CloseConnection")
    # The timer: a handle in the handler's set of wake-up timers, which a disconnect cancels;
    # when it fires, the wake-up goes through the handler's event entry, in a task.
    _names(server.ConnectionHandler.__init__, "wakeup_timer")
    _names(server.ConnectionHandler.handle_client, "wakeup_timer", "cancel")
    _params(server.ConnectionHandler.server_event, "(self, event)")
    _coroutine(server.ConnectionHandler.server_event)
    _params(asyncio_utils.create_task, "(coro, *, name, client=)")
    _fields(events.Wakeup, "command")


@_checks("mitmproxy.proxy.layers.http.HttpStream.state_stream_request_body")
def _stream_request_body() -> None:
    _params(HttpStream.state_stream_request_body, "(self, event)")
    _names(HttpStream.start_request_stream, "state_stream_request_body")  # as below
    _fields(_events.RequestData, "stream_id", "data")


@_checks("mitmproxy.proxy.layers.http.HttpStream (a streamed body's cap)")
def _body_cap() -> None:
    # bodycap.py answers with its refusal only while nothing of the upstream's answer
    # has gone to the client: its head awaited, or its body read whole before it is sent.
    _names(inspect.unwrap(HttpStream.state_wait_for_response_headers),
           "state_consume_response_body", "start_response_stream")
    _names(HttpStream.start_response_stream, "state_stream_response_body")
    _names(inspect.unwrap(HttpStream.state_consume_response_body), "send_response")
    _names(HttpStream.send_response, "server_state", "state_done")
    # Protocol errors reach a stream through the method patched to quiet its aborted upstream.
    _names(inspect.unwrap(HttpStream._handle_event), "handle_protocol_error")
    # A hook has one argument (the proxy's connection handlers take no other).
    _names(mode_servers.ProxyConnectionHandler.handle_hook, "args")
    _fields(flow.Error, "msg")


@_checks("mitmproxy.proxy.layers.http.HttpStream.state_stream_response_body")
def _stream_body() -> None:
    _params(HttpStream.state_stream_response_body, "(self, event)")
    # Looked up by name when streaming starts, so the replaced method is the one used.
    _names(HttpStream.start_response_stream, "state_stream_response_body")


@_checks("mitmproxy.proxy.layers.websocket (control frames)")
def _websocket_control() -> None:
    layer_cls, conn_cls = websocket.WebsocketLayer, websocket.WebsocketConnection
    _expect(layer_cls.__dict__.get("_handle_event") is layer_cls.start,
            "WebsocketLayer no longer starts in its start method")
    _params(layer_cls.start, "(self, _)")
    _names(inspect.unwrap(layer_cls.start), "client_ws", "flow")
    _params(conn_cls.send2, "(self, event)")
    # Control frames are relayed through send2 as the events wsproto parsed.
    _names(inspect.unwrap(layer_cls.relay_messages), "send2", "Ping", "Pong", "CloseConnection")
    for event, name in ((wsproto.events.Ping, "payload"), (wsproto.events.CloseConnection,
                                                         "reason")):
        _expect(name in [f.name for f in dataclasses.fields(event)], f"{event} has no {name}")


@_checks("mitmproxy.proxy.layers.http._http2.Http2Server._handle_event")
def _http2_errors() -> None:
    _expect("_handle_event" in vars(_http2.Http2Server), "no longer defined on Http2Server")
    _params(_http2.Http2Server._handle_event, "(self, event)")
    _params(_http2.Http2Server.is_open_for_us, "(self, stream_id)")
    _names(_http2.Http2Connection.__init__, "h2_conn")
    _names(h2.connection.H2Connection.__init__, "streams")
    _expect(hasattr(h2.stream.H2StreamStateMachine(1), "headers_sent"),
            "h2's H2StreamStateMachine has no headers_sent")
    _fields(_events.ResponseProtocolError, "stream_id", "message", "code")
    _fields(_events.ResponseHeaders, "stream_id", "response", "end_stream")
    _fields(_events.ResponseData, "stream_id", "data")
    _fields(_events.ResponseEndOfMessage, "stream_id")
    _expect(isinstance(status_codes.NO_RESPONSE, int), "status_codes.NO_RESPONSE gone")


# -- patched: per-request conveniences ----------------------------------------------------------


@_checks("mitmproxy.http.MessageData.__post_init__")
def _type_checks() -> None:
    if not __debug__:  # under -O mitmproxy defines none: nothing to leave out
        return
    _expect("__post_init__" in vars(http.MessageData), "no longer defined on MessageData")
    _params(http.MessageData.__post_init__, "(self)")
    for cls in (http.RequestData, http.ResponseData):
        _expect("__post_init__" not in vars(cls), f"{cls.__name__} defines its own")


@_checks("mitmproxy.utils.asyncio_utils.set_task_debug_info")
def _task_names() -> None:
    _params(asyncio_utils.set_task_debug_info, "(task, *, name, client=)")
    _names(asyncio_utils.create_task, "set_task_debug_info")
    _names(asyncio_utils.set_current_task_debug_info, "set_task_debug_info")


@_checks("mitmproxy.addons.tlsconfig.crypto, mitmproxy.certs.Cert.to_pyopenssl")
def _leaf_conversions() -> None:
    _names(tlsconfig.TlsConfig.tls_start_client, "crypto", "PKey", "from_cryptography_key",
           "to_pyopenssl")
    _params(certs.Cert.to_pyopenssl, "(self)")
    _expect(not hasattr(certs.Cert, "__slots__"), "Cert has __slots__")


@_checks("mitmproxy.flow.uuid, mitmproxy.connection.uuid")
def _ids() -> None:
    for module in (flow, connection):
        ids = vars(module).get("uuid")
        # The uuid module, or (once installed) what stands in for it.
        _expect(ids is uuid or callable(getattr(ids, "uuid4", None)),
                f"{module.__name__} has no `uuid` module global")
        try:
            source = inspect.getsource(module)
        except OSError:
            raise _Changed(f"{module.__name__}: no source to check what it uses of uuid") from None
        used = set(re.findall(r"\buuid\.(\w+)", source)) - {"uuid4"}
        _expect(not used, f"{module.__name__} also uses uuid.{', uuid.'.join(sorted(used))}")


@_checks("mitmproxy's hook dispatch and TCP relay (hooks.py, splice.py carry them out)")
def _hook_dispatch() -> None:
    try:
        changed = hooks.changed() + splice.changed()
    except OSError as exc:
        raise _Changed(f"no source to compare ({exc})") from None
    _expect(not changed, f"changed since tested: {', '.join(changed)}")


@_checks("mitmproxy.addonmanager.AddonManager.handle_lifecycle")
def _update_walk() -> None:
    manager = addonmanager.AddonManager
    for fn in (manager.handle_lifecycle, manager.trigger_event):
        _params(fn, "(self, event)")
        _coroutine(fn)
    _names(manager.handle_lifecycle, "trigger_event", "UpdateHook")
    _names(manager.__init__, "chain")


# -- read: what the pipeline and layers.py need -------------------------------------------


@_checks("mitmproxy.addons.proxyserver.Proxyserver.connections")
def _connections() -> None:
    _names(proxyserver.Proxyserver.__init__, "connections")
    _names(server.ConnectionHandler.__init__, "client", "transports")
    _params(server.ConnectionHandler.close_connection, "(self, connection, half_close=)")
    _fields(server.ConnectionIO, "writer")


@_checks("mitmproxy.connection.Server.address")
def _server_address() -> None:
    _fields(connection.Server, "address")


@_checks("mitmproxy.proxy.mode_specs.ProxyMode")
def _modes() -> None:
    _params(mode_specs.ProxyMode.parse, "(spec)")
    _params(mode_specs.ProxyMode.listen_host, "(self, default=)")
    _params(mode_specs.ProxyMode.listen_port, "(self, default=)")


@_checks("mitmproxy.proxy.context.Context.layers")
def _layer_stack() -> None:
    _names(context.Context.__init__, "layers")
    _names(layer.NextLayer.__init__, "context", "layer")
    _params(HttpLayer, "(context, mode)")
    _expect(isinstance(HTTPMode.transparent, HTTPMode), "HTTPMode.transparent gone")
