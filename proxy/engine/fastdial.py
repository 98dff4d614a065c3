"""The fast path's upstream connections (fastpath.py): dialed to the address the guard pinned,
TLS by Python's `ssl` module, verified as mitmproxy verifies its own, and kept across client
connections under the same key as mitmproxy's kept connections (pool.py: the pinned address,
the SNI, TLS or not, the tenant; docs/architecture.md says why that key is safe).

A connection is given back only at a message boundary (its response read to the end by its
framing, nothing more read or buffered, no end seen) and kept by kept.py, which closes one
that hears anything while it waits.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import OrderedDict
from typing import Any

import certifi

from . import tlsstream
from .fastwire import Wire
from .kept import Kept, Reader
from .pool import IDLE_SECONDS, PER_KEY, PER_TENANT, TOTAL, Key
from .resumption import MAX_SESSIONS

_HANDSHAKE_SECONDS = 10.0


class Line:
    """One upstream connection of the fast path."""

    __slots__ = ("dialed_at", "dialer", "generation", "key", "reader", "remembered", "reused",
                 "wire", "writer")

    def __init__(self, dialer: Dialer, key: Key, reader: Reader,
                 writer: asyncio.StreamWriter) -> None:
        self.dialer: Dialer | None = dialer
        self.key = key
        self.reader = reader
        self.writer = writer
        self.wire = Wire(reader, writer, dialer.idle_seconds)
        self.generation = dialer.generation
        self.reused = False
        self.remembered = False  # its TLS session is in the dialer's
        self.dialed_at: tuple[float, float] | None = None  # (started, connected), when dialed

    def closing(self) -> bool:
        return self.writer.is_closing()

    def close(self) -> None:
        if self.dialer is not None:  # once: the gauge counts each connection down once
            self.dialer.remember(self)
            self.dialer.open -= 1
            self.dialer = None
        self.writer.close()


def tls_context(options: Any) -> ssl.SSLContext:
    """The upstream TLS of mitmproxy's TlsConfig under the options the fast path takes: the
    peer verified against `ssl_verify_upstream_trusted_ca`/`_confdir` or else certifi's bundle
    (mitmproxy's default), unless `ssl_insecure`; TLS 1.2 at least; HTTP/1.1 offered."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if options.ssl_insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        cafile = options.ssl_verify_upstream_trusted_ca
        capath = options.ssl_verify_upstream_trusted_confdir
        if cafile is None and capath is None:
            cafile = certifi.where()
        context.load_verify_locations(cafile=cafile, capath=capath)
    context.set_alpn_protocols(["http/1.1"])
    return context


class Dialer:
    def __init__(self, connect_timeout: float, idle_seconds: float) -> None:
        self.connect_timeout = connect_timeout
        self.idle_seconds = idle_seconds  # the longest wait for a response body's next bytes
        self.tls: ssl.SSLContext | None = None
        self.generation = 0  # one more whenever the TLS options change: older lines not kept
        self.kept: Kept[Line] = Kept(per_key=PER_KEY, per_tenant=PER_TENANT, total=TOTAL,
                                     idle_seconds=IDLE_SECONDS)
        self.sessions: OrderedDict[Key, ssl.SSLSession] = OrderedDict()  # resumption.py's
        self.offered = self.resumed = 0  # sessions offered and resumed, for the metrics
        self.dialed = self.reused = 0  # for the metrics, beside pool.py's
        self.open = 0  # connections made and not yet closed

    def __len__(self) -> int:
        return len(self.kept)

    def configure(self, tls: ssl.SSLContext | None) -> None:
        self.tls = tls
        self.flush()

    async def line(self, key: Key, *, fresh: bool = False) -> Line:
        """A kept connection for `key` (unless `fresh`), or a new one. Raises OSError
        (TimeoutError and ssl.SSLError among them) when it cannot be made, or TLS is asked for
        and the fast path has no upstream trust (turned off while this connection was open):
        never a connection in plain text where TLS was meant."""
        if key.tls and self.tls is None:
            raise ssl.SSLError("the upstream trust is not loaded")
        if not fresh and (kept := self.kept.take(key)) is not None:
            kept.reused = True
            self.reused += 1
            return kept
        host, port = key.address
        loop = asyncio.get_running_loop()
        reader = Reader(loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        started = time.time()
        transport: asyncio.BaseTransport | None = None
        try:
            # The TLS handshake within the dial's bound too, as mitmproxy's: an upstream that
            # accepts and never answers is a connect timeout, not a wait until idle.
            async with asyncio.timeout(self.connect_timeout):
                transport, _ = await loop.create_connection(lambda: protocol, host, port)
                writer = asyncio.StreamWriter(transport, protocol, reader, loop)
                connected = time.time()
                if key.tls and self.tls is not None:
                    session = self.sessions.get(key)
                    ssl_object = await tlsstream.start(
                        reader, writer, self.tls, server_side=False, server_hostname=key.sni,
                        session=session, seconds=_HANDSHAKE_SECONDS)
                    self.offered += session is not None
                    self.resumed += ssl_object.session_reused
        except BaseException as exc:
            if transport is not None:
                transport.close()
            if isinstance(exc, TimeoutError):
                # Said as mitmproxy's bounded dial says it (upstream.failure reads "timed out").
                raise TimeoutError(
                    f"connect timed out after {self.connect_timeout:g} s") from None
            raise
        line = Line(self, key, reader, writer)
        line.dialed_at = (started, connected)
        self.dialed += 1
        self.open += 1
        return line

    def remember(self, line: Line) -> None:
        """`line`'s TLS session, for the next connection dialed for its key to resume (by the
        time a response was read, a TLS 1.3 ticket has come). Its key is the pool's: the
        pinned address, the SNI, the tenant; emptied when the TLS options change."""
        if line.remembered or not line.key.tls or line.generation != self.generation:
            return
        line.remembered = True
        ssl_object = line.writer.get_extra_info("ssl_object")
        session = ssl_object.session if ssl_object is not None else None
        if session is None or (not session.has_ticket and not session.id):
            return
        self.sessions[line.key] = session
        self.sessions.move_to_end(line.key)
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)

    def usable(self, line: Line) -> bool:
        """Whether `line`, between two messages, may carry another request: made under the
        TLS options in force, nothing left over on it or unsent, no end seen."""
        reader = line.reader
        return (line.generation == self.generation and not len(line.wire.buf)
                and not reader.unread and not reader.ended and not line.closing()
                and not line.writer.transport.get_write_buffer_size())

    def give_back(self, line: Line) -> None:
        """`line`, its client connection gone: kept for another if it is usable."""
        if not (self.usable(line) and self.kept.put(line)):
            line.close()

    def flush(self) -> None:
        self.generation += 1
        self.kept.flush()
        self.sessions.clear()


class Lease:
    """The upstream connection a client connection rode last, kept for its next request as
    mitmproxy keeps a client connection's own; the pool only between client connections. A
    trip through the pool per request cost its bookkeeping each time, and with more client
    connections busy at once than the pool keeps per key, closed the rest after every answer
    and dialed them again (base-URL keep-alive at c=64 ran at 0.67x intercepted)."""

    __slots__ = ("dialer", "held")

    def __init__(self, dialer: Dialer) -> None:
        self.dialer = dialer
        self.held: Line | None = None

    async def line(self, key: Key, *, fresh: bool = False) -> Line:
        """The held connection if it is for `key` and still usable, else one of the dialer's
        (the held one given back to the pool, or closed); a new one if `fresh`."""
        held, self.held = self.held, None
        if held is not None:
            held.reader.stirred = None
            if not fresh and held.key == key and self.dialer.usable(held):
                held.reused = True  # the origin may have closed it meanwhile: retried if safe
                return held
            self.dialer.give_back(held)
        return await self.dialer.line(key, fresh=fresh)

    def keep(self, line: Line) -> None:
        """`line` after a response read to its end, held for this client's next request;
        closed at once if it hears anything meanwhile (a late second answer, an end), as a
        connection waiting in the pool is."""
        self.dialer.remember(line)
        if self.dialer.usable(line):
            self.held = line
            line.reader.stirred = self._stirred
        else:
            line.close()

    def _stirred(self) -> None:
        if self.held is not None:
            self.held.reader.stirred = None
            self.held.close()
            self.held = None

    def end(self) -> None:
        """The client connection ends (or goes to mitmproxy): its connection to the pool."""
        if self.held is not None:
            self.held.reader.stirred = None
            self.dialer.give_back(self.held)
            self.held = None


_INSTALLED: list[Dialer] = []


def install(dialer: Dialer) -> Dialer:
    _INSTALLED[:] = [dialer]
    return dialer


def installed() -> Dialer | None:
    return _INSTALLED[0] if _INSTALLED else None
