"""Upstream connections kept across client connections, per worker.

A sandbox's clients are mostly short-lived processes (a CLI call, a `pip install`), each with
connections of its own; mitmproxy's upstream connections belong to one client connection and end
with it, so every new client connection paid a TCP and a TLS handshake upstream. Here an
upstream HTTP/1 connection left idle when its client connection ends is kept, and the next
dial with the same `Key` takes it instead of dialing.

How it fits mitmproxy (mitm.py installs it): every upstream dial of mitmproxy's goes through
`Pool.dial`, which the pipeline's `server_connect` hook tells, by `claim`, which connection and
key the dial is for (after the guard pinned the address). A connection taken from the pool
comes with its established TLS connection: the `Handoff` addon gives it to mitmproxy's TLS
layer in place of a new one, whose handshake is then already done. mitmproxy closing the
connection (its client left) offers it back (`_Writer.close`); it is kept only when it sits at
a message boundary with nothing unread or unsent: its HTTP/1 client layer waits for a request
with no byte buffered (an informational answer is skipped on the way: framing.py), the TLS
connection holds no
plaintext and saw no close, and the socket no end, error or byte, with nothing waiting to be
written. A kept connection that receives anything (an end, a byte: a second response to a
request, say) is closed at once.

The key (docs/architecture.md says why each part):

- the address the guard checked and pinned: a name that re-resolves elsewhere takes nothing of
  the old address;
- the SNI: the name the certificate was verified for;
- TLS or not, and which of h2, http/1.1 and http/1.0 the client offered (they decide what is
  offered upstream; the rest of its list decides nothing, and would make keys without end);
- the tenant: the sandbox (for a client no sandbox is proven for, its source address). One
  sandbox's requests never ride a connection another's used: a desynchronised connection (an
  origin's extra response, a request smuggled in a body) reaches no one else.

TLS options are the process's: any reconfiguration empties the pool and keeps no connection in
use across it (a generation), so a kept connection was always made under the options in force.
HTTP/2 upstream connections are not kept (their layer is not at a boundary one can check from
outside); they end with their client as before.

How many are kept, for how long, and closing one that hears anything while it waits, is
kept.py's (shared with the fast path's connections, fastdial.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable
from typing import Any, NamedTuple, TypeVar

from mitmproxy import connection, tls
from mitmproxy.proxy.layers.http import _http1
from OpenSSL import SSL

from .kept import Kept, Reader

_T = TypeVar("_T")

PER_KEY = 16  # idle connections kept per key
PER_TENANT = 64  # per sandbox (so one cannot push every other's out)
TOTAL = 512  # idle connections kept per worker
# The ALPN protocols a key tells apart: what a client offers is passed upstream as it is, but
# only these decide the layer a connection gets (anything else is spoken as HTTP/1); a key of
# every list a client could make up would grow without bound (found by review).
ALPN = (b"h2", b"http/1.1", b"http/1.0")
IDLE_SECONDS = 15.0


class Key(NamedTuple):
    address: tuple[str, int]
    sni: str | None
    tls: bool
    alpn: tuple[bytes, ...]
    tenant: str


# The connection and key of the dial mitmproxy is about to make. Set by the pipeline's
# server_connect hook, which mitmproxy awaits in the very task that then dials.
_CLAIM: contextvars.ContextVar[tuple[connection.Server, Key] | None] = contextvars.ContextVar(
    "sealgate_upstream_claim", default=None)


def claim(server: connection.Server, key: Key) -> None:
    _CLAIM.set((server, key))


class _Upstream:
    """One upstream connection: its socket, and once its handshake is done, its TLS."""

    def __init__(self, key: Key, reader: Reader, writer: asyncio.StreamWriter,
                 generation: int) -> None:
        self.key = key
        self.generation = generation
        self.reader = reader
        self.writer = writer
        self.ssl_conn: SSL.Connection | None = None
        self.http: _http1.Http1Client | None = None  # this lease's HTTP/1 client layer
        self.server: connection.Server | None = None
        self.half_closed = False
        self.reused = False  # this lease's connection was taken from the pool

    def at_boundary(self, *, released: bool = True) -> bool:
        """Nothing in flight and nothing unread, at any level: safe to carry another request.
        Once `released` by mitmproxy, no one may be reading it either (while in use, its
        connection handler always is, between two reads)."""
        http, reader = self.http, self.reader
        if (http is None or http.state != http.read_headers or http.stream_id is not None
                or http.buf or self.half_closed
                or (released and reader.reading) or reader.unread or reader.ended
                or self.writer.is_closing() or self.writer.transport.get_write_buffer_size()):
            return False
        if self.key.tls:
            ssl_conn = self.ssl_conn
            return ssl_conn is not None and not ssl_conn.get_shutdown() and not ssl_conn.pending()
        return True

    def closing(self) -> bool:
        return self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class _Writer:
    """What mitmproxy writes to: the connection's writer, except that closing it offers the
    connection back to the pool."""

    def __init__(self, pool: Pool, upstream: _Upstream) -> None:
        self._pool = pool
        self._upstream = upstream
        self._closed = False

    def write(self, data: bytes) -> None:
        self._upstream.writer.write(data)

    def write_eof(self) -> None:
        self._upstream.half_closed = True
        self._upstream.writer.write_eof()

    def is_closing(self) -> bool:
        return self._closed or self._upstream.writer.is_closing()

    async def drain(self) -> None:
        await self._upstream.writer.drain()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._upstream.writer.get_extra_info(name, default)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.release(self._upstream)

    async def wait_closed(self) -> None:
        return None

    def __del__(self) -> None:
        # mitmproxy closes a writer once it is done reading; a handler task cancelled or failed
        # before that (in its server_connected hook) drops it unclosed, which kept the socket
        # open and its `_live` entry for good (tests/unit/test_engine_pool_leak.py).
        upstream, live = self._upstream, self._pool._live
        if not self._closed and upstream.server is not None:
            if live.get(upstream.server.id) is upstream:
                del live[upstream.server.id]
            with contextlib.suppress(RuntimeError):  # collected after its loop closed
                upstream.close()


class Pool:
    def __init__(self, connect_timeout: float = 10.0, *, per_key: int = PER_KEY,
                 per_tenant: int = PER_TENANT, total: int = TOTAL,
                 idle_seconds: float = IDLE_SECONDS) -> None:
        self.connect_timeout = connect_timeout
        self.generation = 0  # one more at each flush: a connection of an older one is not kept
        self.kept: Kept[_Upstream] = Kept(per_key=per_key, per_tenant=per_tenant, total=total,
                                          idle_seconds=idle_seconds)
        self._live: dict[str, _Upstream] = {}  # server connection id -> its connection
        self.dialed = self.reused = 0  # this worker's counts, for the metrics

    def __len__(self) -> int:
        return len(self.kept)

    async def dial(self, host: str, port: int, *, local_addr: Any = None) -> tuple[
            asyncio.StreamReader, asyncio.StreamWriter | _Writer]:
        """mitmproxy's `asyncio.open_connection` for upstream dials: a kept connection for
        the key claimed, or a new one that may be kept.

        The claim is read and cleared here, in mitmproxy's own task for the dial (the one its
        server_connect hook set it in), before anything can start a task that would inherit
        it: found by review, clearing it inside the bounded connect's own task (wait_for runs
        one) left it set, and a tunnel's later dial on the connection took a kept connection
        by it. And a claim is only good for the address it was made for."""
        claimed = _CLAIM.get()
        _CLAIM.set(None)
        if claimed is not None and not (claimed[1].address == (host, port)
                                        == tuple(claimed[0].address or ())):
            claimed = None
        if claimed is None:  # a blind tunnel's (its bytes are not HTTP the pool could check)
            return await self.bounded(asyncio.open_connection(host, port,
                                                               local_addr=local_addr))
        server, key = claimed
        upstream = self.kept.take(key)
        if upstream is None:
            loop = asyncio.get_running_loop()
            reader = Reader(loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
            transport, _ = await self.bounded(loop.create_connection(
                lambda: protocol, host, port, local_addr=local_addr))
            upstream = _Upstream(key, reader, asyncio.StreamWriter(transport, protocol, reader,
                                                                   loop), self.generation)
            self.dialed += 1
        else:
            upstream.reused = True
            self.reused += 1
        upstream.server = server
        self._live[server.id] = upstream
        return upstream.reader, _Writer(self, upstream)

    async def bounded(self, dialing: Awaitable[_T]) -> _T:
        """`dialing`, given connect_timeout seconds: mitmproxy dials with no bound of its own
        (a black-holed address held a request for the kernel's SYN retries)."""
        try:
            return await asyncio.wait_for(dialing, self.connect_timeout)
        except TimeoutError:
            # mitmproxy reports str(error): make it say what happened.
            raise TimeoutError(f"connect timed out after {self.connect_timeout:g} s") from None

    def reusing(self, server: connection.Connection) -> SSL.Connection | None:
        """The established TLS connection of a kept connection `server` was given, if any."""
        upstream = self._live.get(server.id)
        return upstream.ssl_conn if upstream is not None and upstream.reused else None

    def established(self, data: tls.TlsData) -> None:
        upstream = self._live.get(data.conn.id)
        if upstream is not None and upstream.ssl_conn is None:
            upstream.ssl_conn = data.ssl_conn

    def went_stale(self, server: connection.Connection) -> bool:
        """Whether `server` is a kept connection that ended before any answer to the request
        it was taken for: the origin closed it while it waited, and the close crossed the
        request. The key's other kept connections, as old, are closed too."""
        upstream = self._live.get(server.id)
        if (upstream is None or not upstream.reused or not upstream.reader.ended
                or (upstream.http is not None and (upstream.http.response is not None
                                                   or upstream.http.buf))):
            return False
        self.kept.drop_all(upstream.key)
        return True

    def idle(self, server: connection.Connection) -> bool:
        """Whether `server` is an HTTP/1 connection of the pool's between two messages, so
        another stream of its client may send on it."""
        upstream = self._live.get(server.id)
        return upstream is not None and upstream.at_boundary(released=False)

    def http_client(self, layer: _http1.Http1Client) -> None:
        """mitmproxy made the HTTP/1 client layer of an upstream connection (the layer whose
        state says whether the connection is between two messages)."""
        upstream = self._live.get(layer.conn.id)
        if upstream is not None:
            upstream.http = layer

    def release(self, upstream: _Upstream) -> None:
        if upstream.server is not None:
            self._live.pop(upstream.server.id, None)
            upstream.server = None
        reusable = upstream.generation == self.generation and upstream.at_boundary()
        upstream.http = None  # the next lease's layer is its own
        if not (reusable and self.kept.put(upstream)):
            upstream.close()

    def flush(self) -> None:
        """Every kept connection closed, and none in use now kept later."""
        self.generation += 1
        self.kept.flush()

_INSTALLED: list[Pool] = []  # the process's pool, once mitm.install made it


def install(pool: Pool) -> Pool:
    _INSTALLED[:] = [pool]
    return pool


def installed() -> Pool | None:
    return _INSTALLED[0] if _INSTALLED else None


class Handoff:
    """The addon (before mitmproxy's TlsConfig) that gives a kept connection's TLS to the
    layer that would otherwise start a handshake, and empties the pool on reconfiguration."""

    def configure(self, updated: set[str]) -> None:
        if (kept := installed()) is not None and updated:
            kept.flush()

    def tls_start_server(self, data: tls.TlsData) -> None:
        if (kept := installed()) is not None and (ssl_conn := kept.reusing(data.conn)):
            data.ssl_conn = ssl_conn  # TlsConfig leaves a connection already given alone

    def tls_established_server(self, data: tls.TlsData) -> None:
        if (kept := installed()) is not None:
            kept.established(data)

    def done(self) -> None:
        if (kept := installed()) is not None:
            kept.flush()
