"""A connection that is to start with TLS gets `--handshake-timeout` seconds to finish its
handshake, not as long as it keeps trickling bytes.

The idle timeout closes a connection only when nothing moves: a client that sends its ClientHello
a byte every few seconds, or accepts a CONNECT and never starts TLS while others keep the worker
busy, held a descriptor and a mitmproxy connection for as long as it liked (1,000 CONNECTs with no
ClientHello held 1,009 descriptors for ten minutes). The clock starts when the CONNECT is answered
200 (intercepted or not: a blind tunnel still waits for its ClientHello, which the proxy reads for
its SNI) and when a redirected connection is accepted; it stops at the first sign the opening is
over: TLS established with the client, a ClientHello let through to a blind tunnel, a plain HTTP
request head (a redirected port-80 connection; the header deadline takes over), or a raw TCP
stream. Past the deadline the connection is closed, with a `handshake_timeout` audit line per
second saying how many.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mitmproxy import connection, ctx, exceptions, http, tcp, tls
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy import mode_specs

from . import mitm

OPTION = "sealgate_handshake_timeout"


class HandshakeDeadline:
    def __init__(self) -> None:
        self.seconds = 10.0
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.closed = 0  # connections closed at the deadline since last taken

    def load(self, loader: Loader) -> None:
        # mitmproxy's options have no float type.
        loader.add_option(OPTION, str, "10",
                          "Seconds a connection that starts with TLS has to finish its handshake.")

    def configure(self, updated: set[str]) -> None:
        if OPTION in updated:
            text = getattr(ctx.options, OPTION)
            try:
                seconds = float(text)
            except ValueError:
                seconds = 0.0
            if not 0 < seconds < 86400:
                raise exceptions.OptionsError(f"{OPTION}: {text[:40]!r} is not seconds > 0")
            self.seconds = seconds

    # -- the clock starts ---------------------------------------------------------------------

    def client_connected(self, client: connection.Client) -> None:
        if isinstance(client.proxy_mode, mode_specs.TransparentMode) and client.error is None:
            self._arm(client)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        # After the pipeline's hook: a refused CONNECT has its response, and is closed anyway.
        if flow.response is None:
            self._arm(flow.client_conn)

    # -- and stops ----------------------------------------------------------------------------

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        if data.ignore_connection:  # a blind tunnel: the rest of the handshake is the upstream's
            self._stop(data.context.client)

    def tls_established_client(self, data: tls.TlsData) -> None:
        self._stop(data.context.client)

    def tls_failed_client(self, data: tls.TlsData) -> None:
        self._stop(data.context.client)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if not flow.client_conn.tls:  # plain HTTP: its head has the header deadline
            self._stop(flow.client_conn)

    def tcp_start(self, flow: tcp.TCPFlow) -> None:
        self._stop(flow.client_conn)

    def client_disconnected(self, client: connection.Client) -> None:
        self._stop(client)

    # -----------------------------------------------------------------------------------------

    def take_closed(self) -> int:
        closed, self.closed = self.closed, 0
        return closed

    def _arm(self, client: connection.Client) -> None:
        self._stop(client)
        loop = asyncio.get_running_loop()
        self._timers[client.id] = loop.call_later(self.seconds, self._expire, client)

    def _stop(self, client: connection.Client) -> None:
        timer = self._timers.pop(client.id, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, client: Any) -> None:
        self._timers.pop(client.id, None)
        if not client.tls_established:
            self.closed += 1
            mitm.close_client(client.id)
