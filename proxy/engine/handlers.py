"""The connection handler serving a client: what mitmproxy keeps per connection and gives no
API for. Found through the proxy server addon's table, by the client's id. A connection the
fast path serves (fastpath.py) has no handler: it is found in a table of its own, to be
closed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from mitmproxy import ctx
from mitmproxy.proxy import server

_FAST: dict[str, Callable[[], None]] = {}  # client id -> what closes its connection


def handler_of(client_id: str) -> server.ConnectionHandler | None:
    """The handler of client `client_id`; None once its connection has ended."""
    proxyserver = ctx.master.addons.get("proxyserver")
    return proxyserver.connections.get(client_id) if proxyserver else None


@contextlib.contextmanager
def fast(client_id: str, close: Callable[[], None]) -> Iterator[None]:
    """Client `client_id`'s connection, served by the fast path meanwhile, closed by `close`."""
    _FAST[client_id] = close
    try:
        yield
    finally:
        _FAST.pop(client_id, None)


def fast_closer(client_id: str) -> Callable[[], None] | None:
    return _FAST.get(client_id)
