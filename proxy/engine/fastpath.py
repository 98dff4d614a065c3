"""The fast path: plain HTTP/1.1 requests to the explicit listener, base-URL ones
(proxy/request/baseurl.py) and absolute-form `http://` ones, served without mitmproxy's layers.

Why: these are the simplest exchanges the proxy makes (plain HTTP/1.1 in, one connection out,
verified TLS for base-URL mode), and mitmproxy's per-connection and per-request machinery (its
connection handler, layers, contexts, commands, a task per hook) was most of its cost:
bench/forwarder_floor.py measured sealgate at ~13 times the CPU of a bare Python forwarder
per kept-alive request, and ~10 times per new connection.

What it takes, and what it hands over. Every connection to the regular (explicit) listener
comes here first. Its first request head is read; if it is a request the fast path takes
(`_taken`: HTTP/1.1, an origin-form target under the base-URL prefix or an absolute-form
`http://` one, a Host, a body of a declared Content-Length within `TAKEN_BODY`, nothing asking
for more than one plain exchange: no Transfer-Encoding, Expect or Upgrade) the connection is
the fast path's; anything else (CONNECT, TLS, HTTP/2, another origin-form target, an
absolute-form `https://` one, a head that does not parse) goes to
mitmproxy's own handler with the bytes read put back in front of the reader, before any of
them was acted on. A later request on a fast connection that is not taken hands the rest of
the connection over the same way, at that message boundary (its part so far ends with its own
connection line; mitmproxy's part has another). Framing is never decided twice: heads are read
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
import functools
import logging
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final

from mitmproxy import connection, ctx
from mitmproxy.addonmanager import Loader
from mitmproxy.net.http import http1, url
from mitmproxy.net.http.http1.read import get_header_tokens
from mitmproxy.proxy import mode_servers, mode_specs, server_hooks
from mitmproxy.proxy.layers.http import HTTPMode, _http1, validate_request

from . import fastexchange, limits, upstream
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
        self.validate = True  # mitmproxy's validate_inbound_headers (request smuggling)
        self.taken = self.handed = 0  # connections, for the metrics

    def load(self, loader: Loader) -> None:
        loader.add_option(OPTION, bool, True, "Serve plain HTTP/1.1 requests (base-URL and "
                          "absolute-form http://) without mitmproxy's layers "
                          "(docs/architecture.md).")

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
        await _Connection(fast, reader, writer).run(
            functools.partial(handle_stream, self, reader, writer), self.mode)

    return handle


class _Connection:
    def __init__(self, fast: FastPath, reader: asyncio.StreamReader, writer: Any) -> None:
        self.fast = fast
        self.wire = Wire(reader, writer, fast.bounds.idle_seconds)
        self.peername = writer.get_extra_info("peername")
        self.sockname = writer.get_extra_info("sockname")
        self.source = str(self.peername[0])

    async def run(self, hand_over: Callable[[], Coroutine[Any, Any, None]],
                  mode: mode_specs.ProxyMode) -> None:
        gate: ConnectionGate | None = getattr(ctx.master.addons.get("sealgate"), "gate", None)
        if gate is not None and gate.admit(self.source) is not None:
            self.wire.writer.close()  # as the pipeline's client_connected refuses it
            return
        # Whether this connection's count in the gate is the fast path's to pass on or release
        # (once client_connected has it, client_disconnected releases it).
        held = gate is not None
        client: connection.Client | None = None
        lease = Lease(self.fast.dialer)
        handing = b""
        try:
            while True:
                head = await self._head()
                if head is None:
                    break
                raw, lines = head
                taken = self._taken(lines, len(raw))
                if taken is None:
                    handing = raw + self.wire.unread()
                    break
                if client is None:
                    self.fast.taken += 1
                    if held and gate is not None:
                        gate.pass_on(self.peername)
                        held = False
                    client = connection.Client(peername=self.peername, sockname=self.sockname,
                                               timestamp_start=time.time(), proxy_mode=mode)
                    await fastexchange.hook(server_hooks.ClientConnectedHook(client))
                    if client.error:
                        break
                if not await fastexchange.exchange(self.fast, self.wire, lease, client, taken):
                    break
        except HeadTooLarge:
            handing = self.wire.unread()  # mitmproxy's to refuse (431), as it refuses any
        except (WireError, OSError):
            pass  # the client ended a head part way, or left: nothing to answer
        except Exception:
            logger.exception("sealgate: internal error on a fast-path connection; closed")
            handing = b""
        finally:
            lease.end()
            if client is not None:
                if handing and gate is not None and not client.error:
                    # Counted on across the hand-over: the fast part's count is released by
                    # its client_disconnected, this one passed to mitmproxy's handler.
                    gate.hold(self.source)
                    held = True
                client.timestamp_end = time.time()
                await fastexchange.hook(server_hooks.ClientDisconnectedHook(client))
        if handing and _put_back(self.wire.reader, handing):
            self.fast.handed += 1
            if held and gate is not None:
                gate.pass_on(self.peername)
            await hand_over()
        else:
            if held and gate is not None:
                gate.release(self.source)
            self.wire.writer.close()

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
        bounds = self.fast.bounds
        target = lines[0].split(b" ", 2)[1:2] if lines else []
        if size > bounds.header_bytes or not target or not (
                target[0].startswith(self.fast.prefix_bytes)
                or target[0][:7].lower() == b"http://"):
            return None  # a CONNECT, mostly: left at a glance
        try:
            request = vars(_http1)["http1"].read_request_head(lines)  # mitm.py's: marks origin form
            expected = http1.expected_http_body_size(request)
            host, port = url.parse_authority(request.host_header or "", check=True)
        except ValueError:
            return None
        headers = request.headers
        if request.data.host:  # absolute form: plain HTTP through the proxy
            if request.scheme != "http":
                return None
        elif not request.path.startswith(self.fast.prefix):
            return None
        if (request.http_version != "HTTP/1.1"
                or expected is None or not 0 <= expected <= TAKEN_BODY
                or "transfer-encoding" in headers or "expect" in headers
                or "upgrade" in headers
                or not {token.lower() for token in get_header_tokens(
                    headers, "connection")} <= _CONNECTION_TOKENS
                or limits.parsed(request, bounds) is not None
                or validate_request(HTTPMode.regular, request, self.fast.validate) is not None):
            return None
        # What mitmproxy's HTTP stream makes of a request to a regular listener: the
        # destination of an origin-form one from its Host; the upstream's in origin form.
        if not request.data.host:
            request.data.host, request.data.port, request.scheme = host, port or 80, "http"
        request.authority = ""
        return fastexchange.Taken(request, expected)


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
