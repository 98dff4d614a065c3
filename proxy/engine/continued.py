"""mitmproxy's connection handler for the rest of a connection the fast path began inside a
CONNECT tunnel (fastconnect.py): what the fast path does not serve there goes on in mitmproxy's
layers, as the same client connection.

A tunnel's state is the pipeline's, kept per client connection (the CONNECT's identity,
destination, pin, tokens, its blind-or-intercepted decision): so the handler carries on with
the very `Client` the CONNECT was decided for, and with the layers mitmproxy would have stacked
by then for it, not a new connection that would have to be decided again. It skips the
`client_connected` hook (the connection was admitted, counted and announced when it began) and
runs `client_disconnected` at its end as mitmproxy's handler always does, which writes the
connection's one audit line.

Where it begins:
- before the client's TLS (`raw`): its ClientHello (or whatever bytes came instead) unread,
  the layers a tunnel's first bytes get from mitmproxy's `next_layer` (server and client TLS
  for a ClientHello, which may still relay it blind; HTTP for anything else);
- after it (`plain`), on the fast path's decrypted stream: the HTTP layer a tunnel's TLS
  carries, under the server TLS layer that makes every upstream connection TLS.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mitmproxy import connection, ctx
from mitmproxy.proxy import commands, layer, mode_servers, server, server_hooks
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers import ClientTLSLayer, HttpLayer, ServerTLSLayer
from mitmproxy.proxy.layers.http import HTTPMode


class _Continued(mode_servers.ProxyConnectionHandler):
    def __init__(self, reader: asyncio.StreamReader, writer: Any, context: Context,
                 top: layer.Layer, tls_stream: bool) -> None:
        client = context.client
        super().__init__(  # type: ignore[no-untyped-call]
            ctx.master, reader, writer, ctx.options, client.proxy_mode)
        del self.transports[self.client]  # the one mitmproxy made: this is `client`'s
        self.client = client
        self.transports[client] = server.ConnectionIO(handler=None, reader=reader,
                                                      writer=writer)
        self.layer = top
        self.tls_stream = tls_stream

    async def handle_hook(self, hook: commands.StartHook) -> None:
        if isinstance(hook, server_hooks.ClientConnectedHook):
            return  # connected, counted and announced when the fast path took it
        await super().handle_hook(hook)

    def close_connection(self, connection_: connection.Connection,
                         half_close: bool = False) -> None:
        # A TLS stream of the `ssl` module cannot half-close: its end is a close_notify.
        super().close_connection(connection_, half_close and not (
            self.tls_stream and connection_ is self.client))


def context_for(client: connection.Client, target: tuple[str, int]) -> Context:
    """A tunnel's context as mitmproxy's CONNECT leaves it: its server the destination."""
    context = Context(client, ctx.options)
    context.server = connection.Server(address=target)
    return context


async def raw(instance: mode_servers.ServerInstance[Any], reader: asyncio.StreamReader,
              writer: Any, context: Context, tls: bool) -> None:
    """Carry on from a tunnel's first bytes, before any was acted on (they are in `reader`)."""
    top: layer.Layer
    if tls:
        top = server_tls = ServerTLSLayer(context)
        server_tls.child_layer = ClientTLSLayer(context)
    else:
        top = HttpLayer(context, HTTPMode.transparent)
    await _run(instance, _Continued(reader, writer, context, top, tls_stream=False))


async def plain(instance: mode_servers.ServerInstance[Any], reader: asyncio.StreamReader,
                writer: Any, context: Context) -> None:
    """Carry on inside a tunnel's TLS, which the fast path terminated, at a request boundary
    (the request's bytes are in `reader`)."""
    top = ServerTLSLayer(context)
    top.child_layer = HttpLayer(context, HTTPMode.transparent)
    await _run(instance, _Continued(reader, writer, context, top, tls_stream=True))


async def _run(instance: mode_servers.ServerInstance[Any], handler: _Continued) -> None:
    with instance.manager.register_connection(handler.client.id, handler):
        await handler.handle_client()
