"""The fast path: HTTP/1.1 requests to the explicit listener, base-URL ones
(proxy/request/baseurl.py), absolute-form `http://` ones and those inside a CONNECT's TLS
(fastconnect.py), served without mitmproxy's layers.

Why: these are the simplest exchanges the proxy makes (plain HTTP/1.1 in, one connection out,
verified TLS for base-URL mode), and mitmproxy's per-connection and per-request machinery (its
connection handler, layers, contexts, commands, a task per hook) was most of its cost:
bench/forwarder_floor.py measured sealgate at ~13 times the CPU of a bare Python forwarder
per kept-alive request, and ~10 times per new connection.

What it takes, and what it hands over. Every connection to the regular (explicit) listener
comes here first. Its first request head is read; if it is a request the fast path takes
(`_taken`: HTTP/1.1, an origin-form target under the base-URL prefix or an absolute-form
`http://` one, a Host, a body of a declared Content-Length within `TAKEN_BODY`, nothing asking
for more than one plain exchange: no Transfer-Encoding, Expect or Upgrade), or a CONNECT
(`_connect`, fastconnect.py), the connection is the fast path's; anything else (TLS, HTTP/2,
another origin-form target, an absolute-form `https://` one, a head that does not parse) goes
to mitmproxy's own handler with the bytes read put back in front of the reader, before any of
them was acted on. A later request on a fast connection that is not taken hands the rest of
the connection over the same way, at that message boundary (its part so far ends with its own
connection line; mitmproxy's part has another); inside a tunnel, where the pipeline's state for
the connection must stand, the same connection goes on in mitmproxy's layers instead
(continued.py). Framing is never decided twice: heads are read
by mitmproxy's own parser and bodies by the same h11 readers (fastwire.py), and the rest of
the head is what mitmproxy would refuse or handle anyway.

What it does with a request is the pipeline's: the same hooks, in the same order, on the same
flow objects (fastexchange.py), through the master's addon manager; the upstream is the
address the guard pinned for it (fastdial.py). Bounds are mitmproxy's under sealgate
(engine/limits.py): a connection idle `idle_seconds` is closed, a head must come whole within
`header_seconds` of its first byte and `header_bytes`, a response head within the response
deadline (engine/deadline.py).

A connection's slot in the connection gate (conncap.py) is held from its accept, as mitmproxy's
`client_connected` holds it, and passed on (`ConnectionGate.pass_on`) to whichever engine takes
the connection, with no moment at which an open connection counts for nothing (a worker takes
what is alive out of later collections at such a moment: proxy/process/master.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, Protocol

from mitmproxy import connection, ctx, http
from mitmproxy.addonmanager import Loader
from mitmproxy.net.http import http1, url
from mitmproxy.net.http.http1.read import get_header_tokens
from mitmproxy.proxy import mode_servers, mode_specs, server_hooks
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http import HTTPMode, _http1, validate_request

from . import continued, fastconnect, fastexchange, fastleaf, handlers, limits, upstream
from .conncap import ConnectionGate
from .fastdial import Dialer, Lease, tls_context
from .fastwire import HeadTooLarge, Wire, WireError

logger = logging.getLogger("sealgate")

TAKEN_BODY: Final = 64 * 1024  # larger declared bodies go to mitmproxy, which streams them
OPTION: Final = "sealgate_fast_path"
# What the fast path cannot honour as mitmproxy's TlsConfig would: with any of these set, every
# connection goes to mitmproxy.
_TLS_OPTIONS: Final = {"client_certs": None, "ciphers_server": None,
                       "tls_version_server_min": "TLS1_2",
                       "tls_version_server_max": "UNBOUNDED", "tls_ecdh_curve_server": None}
_VERIFY_OPTIONS: Final = {"ssl_insecure", "ssl_verify_upstream_trusted_ca",
                          "ssl_verify_upstream_trusted_confdir"}
_CONNECTION_TOKENS: Final = frozenset({"keep-alive", "close"})
_VERSIONS: Final = frozenset({"HTTP/1.1"})
_CONNECT_VERSIONS: Final = frozenset({"HTTP/1.1", "HTTP/1.0"})

_Handle = Callable[..., Coroutine[Any, Any, None]]


class FastPath:
    """The addon: the option that turns the fast path off, and the upstream TLS it dials
    with, made again (and the kept connections closed) whenever its options change."""

    def __init__(self, dialer: Dialer, bounds: limits.HttpLimits, prefix: str) -> None:
        self.dialer = dialer
        self.bounds = bounds
        self.prefix = prefix
        self.prefix_bytes = prefix.encode()
        self.on = False
        self.intercepts = False  # CONNECTs too: the client-leg TLS options are fastleaf's
        self.leaves = fastleaf.Leaves()
        self.validate = True  # mitmproxy's validate_inbound_headers (request smuggling)
        self.taken = self.handed = 0  # connections, for the metrics

    def load(self, loader: Loader) -> None:
        loader.add_option(OPTION, bool, True, "Serve plain HTTP/1.1 requests (base-URL and "
                          "absolute-form http://) and HTTP/1.1 inside CONNECT tunnels without "
                          "mitmproxy's layers (docs/architecture.md).")

    def configure(self, updated: set[str]) -> None:
        options = ctx.options
        self.validate = options.validate_inbound_headers
        on = getattr(options, OPTION) and all(
            getattr(options, name, default) == default for name, default in _TLS_OPTIONS.items())
        if on != self.on or updated & (_VERIFY_OPTIONS | set(_TLS_OPTIONS)):
            tls = None
            if on:
                try:
                    tls = tls_context(options)
                except (OSError, ssl.SSLError) as exc:
                    # mitmproxy's path says the same to each connection it cannot verify for.
                    logger.error("sealgate: the fast path is off: the upstream trust cannot "
                                 "be loaded (%s)", exc)
                    on = False
            self.dialer.configure(tls)
        self.on = on
        self.intercepts = on and fastleaf.default(options)
        if updated & ({"confdir"} | set(fastleaf.OPTIONS)):
            self.leaves.clear()  # mitmproxy's TlsConfig loads its CA and certificates again

    def done(self) -> None:
        self.dialer.flush()


def front(handle_stream: _Handle, fast: FastPath) -> _Handle:
    """ServerInstance.handle_stream, which gives a regular listener's connections to the fast
    path first."""

    @functools.wraps(handle_stream)
    async def handle(self: mode_servers.ServerInstance[Any], reader: Any,
                     writer: Any = None) -> None:
        if (not fast.on or writer is None or not isinstance(self.mode, mode_specs.RegularMode)
                or not isinstance(reader, asyncio.StreamReader)):
            await handle_stream(self, reader, writer)
            return
        await _Connection(fast, reader, writer, self).run(
            functools.partial(handle_stream, self, reader, writer))

    return handle


class _Pipeline(fastconnect.Pipeline, Protocol):
    @property
    def gate(self) -> ConnectionGate: ...


class _Connection:
    def __init__(self, fast: FastPath, reader: asyncio.StreamReader, writer: Any,
                 instance: mode_servers.ServerInstance[Any]) -> None:
        self.fast = fast
        self.wire = Wire(reader, writer, fast.bounds.idle_seconds)
        self.instance = instance
        self.peername = writer.get_extra_info("peername")
        self.sockname = writer.get_extra_info("sockname")
        self.source = str(self.peername[0])
        self.tunnel: Context | None = None  # inside a CONNECT whose TLS the fast path ended

    async def run(self, hand_over: Callable[[], Coroutine[Any, Any, None]]) -> None:
        pipeline: _Pipeline | None = ctx.master.addons.get("sealgate")
        gate = pipeline.gate if pipeline is not None else None
        if gate is not None and gate.admit(self.source) is not None:
            self.wire.writer.close()  # as the pipeline's client_connected refuses it
            return
        # Whether this connection's count in the gate is the fast path's to pass on or release
        # (once client_connected has it, client_disconnected releases it).
        held = gate is not None
        client: connection.Client | None = None
        lease = Lease(self.fast.dialer)
        handing = b""
        going_on: Callable[[], Coroutine[Any, Any, None]] | None = None  # continued.py's
        registered = contextlib.ExitStack()  # mitm.close_client finds the connection there
        try:
            while True:
                head = await self._head()
                if head is None:
                    break
                raw, lines = head
                connect = self.tunnel is None and lines[0][:8] == b"CONNECT "
                taken = self._connect(lines, len(raw), pipeline) if connect else self._taken(
                    lines, len(raw))
                if taken is None:
                    if self.tunnel is not None:  # inside TLS: only mitmproxy can go on
                        going_on = self._go_on(raw + self.wire.unread(), plain=self.tunnel)
                    else:
                        handing = raw + self.wire.unread()
                    break
                if client is None:
                    self.fast.taken += 1
                    if held and gate is not None:
                        gate.pass_on(self.peername)
                        held = False
                    client = connection.Client(
                        peername=self.peername, sockname=self.sockname, timestamp_start=time.time(),
                        proxy_mode=self.instance.mode, state=connection.ConnectionState.OPEN)
                    await fastexchange.hook(server_hooks.ClientConnectedHook(client))
                    if client.error:
                        break
                    registered.enter_context(handlers.fast(client.id, self._close))
                if isinstance(taken, http.Request):
                    assert pipeline is not None
                    entered = await fastconnect.enter(
                        self.wire, client, taken, leaves=self.fast.leaves, pipeline=pipeline)
                    if isinstance(entered, fastconnect.Terminated):
                        self.wire, self.tunnel = entered.wire, entered.context
                    elif isinstance(entered, fastconnect.Handed):
                        going_on = self._go_on(self.wire.unread(), raw=entered)
                        break
                    elif entered is None or not entered.keeps:
                        break
                elif not await fastexchange.exchange(self.fast, self.wire, lease, client, taken):
                    break
        except HeadTooLarge:
            # mitmproxy's to refuse (431), as it refuses any
            if self.tunnel is not None:
                going_on = self._go_on(self.wire.unread(), plain=self.tunnel)
            else:
                handing = self.wire.unread()
        except (WireError, OSError):
            pass  # the client ended a head part way, or left: nothing to answer
        except Exception:
            logger.exception("sealgate: internal error on a fast-path connection; closed")
            handing, going_on = b"", None
        finally:
            registered.close()
            lease.end()
            if client is not None and going_on is None:
                if handing and gate is not None and not client.error:
                    # Counted on across the hand-over: the fast part's count is released by
                    # its client_disconnected, this one passed to mitmproxy's handler.
                    gate.hold(self.source)
                    held = True
                client.timestamp_end = time.time()
                await fastexchange.hook(server_hooks.ClientDisconnectedHook(client))
        if going_on is not None:
            # The same connection, in mitmproxy's layers: its count and its end are theirs.
            self.fast.handed += 1
            await going_on()
        elif handing and _put_back(self.wire.reader, handing):
            self.fast.handed += 1
            if held and gate is not None:
                gate.pass_on(self.peername)
            await hand_over()
        else:
            if held and gate is not None:
                gate.release(self.source)
            self.wire.writer.close()

    def _close(self) -> None:
        self.wire.writer.close()

    def _go_on(self, data: bytes, *, plain: Context | None = None,
               raw: fastconnect.Handed | None = None
               ) -> Callable[[], Coroutine[Any, Any, None]] | None:
        """The rest of this connection in mitmproxy's layers (continued.py), `data` read first;
        None (closed) if it cannot be put back."""
        reader, writer = self.wire.reader, self.wire.writer
        if not _put_back(reader, data):
            return None
        if plain is not None:
            return functools.partial(continued.plain, self.instance, reader, writer, plain)
        assert raw is not None
        return functools.partial(continued.raw, self.instance, reader, writer, raw.context,
                                 raw.tls)

    async def _head(self) -> tuple[bytes, list[bytes]] | None:
        """The next request head, raw and as lines; None when the connection ended or was
        idle `idle_seconds` before its first byte, or its head was refused (answered here)."""
        bounds, wire = self.fast.bounds, self.wire
        if (head := wire.head_now(bounds.header_bytes)) is not None:
            return head  # pipelined, or read with the one before
        if not len(wire.buf):
            try:
                if not await wire.more():  # within idle_seconds
                    return None
            except HeadTooLarge:
                raise
            except WireError:
                return None  # idle: closed, as mitmproxy's watchdog closes it
            if (head := wire.head_now(bounds.header_bytes)) is not None:
                return head  # the usual case: the whole head in one read
        try:
            async with asyncio.timeout(bounds.header_seconds):
                return await wire.head(bounds.header_bytes)
        except TimeoutError:
            denial = limits.while_read(0, bounds.header_seconds + 1, bounds)
            assert denial is not None
            wire.writer.write(upstream.refused_head(denial))
            return None


    def _taken(self, lines: list[bytes], size: int) -> fastexchange.Taken | None:
        """The request the fast path takes, as mitmproxy's HTTP/1 server reads it; None for
        one it leaves to mitmproxy (which then reads, answers or refuses it as always)."""
        bounds, tunnel = self.fast.bounds, self.tunnel
        target = lines[0].split(b" ", 2)[1:2] if lines else []
        if size > bounds.header_bytes or not target or not (
                target[0][:1] == b"/" if tunnel is not None
                else target[0].startswith(self.fast.prefix_bytes)
                or target[0][:7].lower() == b"http://"):
            return None  # left at a glance
        try:
            request = vars(_http1)["http1"].read_request_head(lines)  # mitm.py's: marks origin form
            expected = http1.expected_http_body_size(request)
            host, port = ("", None) if tunnel is not None else url.parse_authority(
                request.host_header or "", check=True)
        except ValueError:
            return None
        if request.data.host:  # absolute form: plain HTTP through the proxy
            if request.scheme != "http" or tunnel is not None:
                return None
        elif tunnel is None and not request.path.startswith(self.fast.prefix):
            return None
        if not self._plain(request, HTTPMode.transparent if tunnel else HTTPMode.regular) or (
                expected is None or not 0 <= expected <= TAKEN_BODY):
            return None
        # What mitmproxy's HTTP stream makes of a request: inside a tunnel, the tunnel's
        # destination (transparent mode); to a regular listener, an origin-form one's from its
        # Host. The upstream's in origin form.
        if tunnel is not None:
            assert tunnel.server.address is not None
            request.data.host, request.data.port = tunnel.server.address
            request.scheme = "https"
        elif not request.data.host:
            request.data.host, request.data.port, request.scheme = host, port or 80, "http"
        request.authority = ""
        return fastexchange.Taken(request, expected)

    def _connect(self, lines: list[bytes], size: int, pipeline: _Pipeline | None
                 ) -> http.Request | None:
        """A CONNECT the fast path takes: HTTP/1.1, with no body or upgrade of its own, under
        the options its TLS honours (fastleaf.py)."""
        if not self.fast.intercepts or pipeline is None or size > self.fast.bounds.header_bytes:
            return None
        try:
            request: http.Request = vars(_http1)["http1"].read_request_head(lines)
        except ValueError:
            return None
        if (request.method != "CONNECT" or "content-length" in request.headers
                or not self._plain(request, HTTPMode.regular, _CONNECT_VERSIONS)):
            return None
        return request

    def _plain(self, request: http.Request, mode: HTTPMode,
               versions: frozenset[str] = _VERSIONS) -> bool:
        """HTTP/1.1 (a CONNECT may be 1.0: urllib3's are) asking for no more than one plain
        exchange (no Transfer-Encoding, Expect or Upgrade; `Connection` only keep-alive or
        close), within limits.py's bounds, and past mitmproxy's own check against request
        smuggling."""
        headers = request.headers
        return not (request.http_version not in versions
                    or "transfer-encoding" in headers or "expect" in headers
                    or "upgrade" in headers
                    or not {token.lower() for token in get_header_tokens(
                        headers, "connection")} <= _CONNECTION_TOKENS
                    or limits.parsed(request, self.fast.bounds) is not None
                    or validate_request(mode, request, self.fast.validate) is not None)


def _put_back(reader: asyncio.StreamReader, data: bytes) -> bool:
    """`data` in front of what `reader` holds, for mitmproxy's handler to read first. asyncio's
    StreamReader keeps what it holds in `_buffer`; without one (another reader class) the
    connection is closed rather than handed over short of its first bytes."""
    buffer = getattr(reader, "_buffer", None)
    if not isinstance(buffer, bytearray):
        return False
    buffer[0:0] = data
    return True


_INSTALLED: list[FastPath] = []


def install(fast: FastPath) -> FastPath:
    _INSTALLED[:] = [fast]
    return fast


def installed() -> FastPath | None:
    return _INSTALLED[0] if _INSTALLED else None
