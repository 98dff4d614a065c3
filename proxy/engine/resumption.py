"""TLS session resumption on the upstream leg: a new upstream connection offers the session (a
TLS 1.3 ticket, a TLS 1.2 session) of the last one made to the same place, so a sandbox's
short-lived clients -- a CLI call, a `pip install` -- do not each cost the proxy a full
handshake: no certificate chain sent, parsed and verified, one round trip fewer.

A session is offered only where everything that made the first connection trustworthy is the
same (`Key`):

- the TLS context, so the same trust anchors, verification and versions (mitmproxy caches one
  per configuration; the key holds it, so an id is never mistaken for another's);
- the address actually connected (the guard's pin: a name that re-resolves elsewhere never
  resumes the session of the old address);
- the SNI (the name the first handshake's certificate was verified for);
- the tenant: the sandbox's identity (for a client no sandbox is proven for, served by a
  default policy, its source address). Sessions carry nothing of a request, but a ticket is
  an identifier an origin sees again, and one sandbox's connections are never made linkable
  to another's through it.

The cache is per worker, bounded (least recently stored goes first), and holds what OpenSSL
hands back when a connection closes (by then a TLS 1.3 ticket, sent after the handshake, has
been read). A session the server no longer accepts costs nothing but the full handshake it
would have had anyway; OpenSSL checks the session's lifetime itself.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

from mitmproxy import connection, tls
from OpenSSL import SSL

MAX_SESSIONS = 4096
_LIB: Any = getattr(SSL, "_lib")  # noqa: B009  pyOpenSSL's binding: it has no API for "was this session resumed"


class Key(NamedTuple):
    context: SSL.Context
    address: tuple[str, int]
    sni: str | None
    tenant: str


class Sessions:
    def __init__(self, size: int = MAX_SESSIONS) -> None:
        self._size = size
        self._cache: OrderedDict[Key, SSL.Session] = OrderedDict()
        self._open: dict[str, tuple[Key, SSL.Connection]] = {}  # server connection id ->
        self.offered = self.resumed = 0  # this worker's counts, for the metrics

    def start(self, data: tls.TlsData, tenant: str) -> None:
        """An upstream handshake about to start (after mitmproxy made its TLS connection)."""
        ssl_conn, server = data.ssl_conn, data.conn
        if ssl_conn is None or not isinstance(server, connection.Server) or not server.peername:
            return
        key = Key(ssl_conn.get_context(), (str(server.peername[0]), int(server.peername[1])),
                  server.sni, tenant)
        self._open[server.id] = (key, ssl_conn)
        if (session := self._cache.get(key)) is not None:
            ssl_conn.set_session(session)
            self.offered += 1

    def established(self, data: tls.TlsData) -> None:
        if data.ssl_conn is not None and _LIB.SSL_session_reused(data.ssl_conn._ssl):
            self.resumed += 1

    def closed(self, server: connection.Server) -> None:
        """An upstream connection ended: its session is the one the next connection offers."""
        found = self._open.pop(server.id, None)
        if found is None or server.tls_version is None:  # no handshake finished
            return
        key, ssl_conn = found
        session = ssl_conn.get_session()
        if session is None:
            return
        self._cache[key] = session
        self._cache.move_to_end(key)
        while len(self._cache) > self._size:
            self._cache.popitem(last=False)

    def __len__(self) -> int:
        return len(self._cache)
