"""The connection handler serving a client: what mitmproxy keeps per connection and gives no
API for. Found through the proxy server addon's table, by the client's id."""

from __future__ import annotations

from mitmproxy import ctx
from mitmproxy.proxy import server


def handler_of(client_id: str) -> server.ConnectionHandler | None:
    """The handler of client `client_id`; None once its connection has ended."""
    proxyserver = ctx.master.addons.get("proxyserver")
    return proxyserver.connections.get(client_id) if proxyserver else None
