"""A TCP (or TLS) server on loopback whose connections a test handles byte by byte: for upstreams
that misbehave in ways a real server will not (reset before answering, never answer)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from pathlib import Path


class RawServer:
    """Accepts on an ephemeral loopback port until `stop`; each connection (TLS-wrapped when
    `tls` is a certificate and key) goes to `handle`, in a thread of its own."""

    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self._context: ssl.SSLContext | None = None
        if tls is not None:
            self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._context.load_cert_chain(str(tls[0]), str(tls[1]))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(30)
        with contextlib.suppress(OSError), raw:
            conn = raw if self._context is None else self._context.wrap_socket(
                raw, server_side=True)
            self.handle(conn)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


class TwoAddressTLS:
    """An HTTPS server on 127.0.0.1 and 127.0.0.2, one port and one TLS context (a ticket
    issued on one address is good on the other: what an origin behind a name that re-resolves
    looks like); each connection goes to `serve`, TLS done, in a thread of its own."""

    def __init__(self, cert: tuple[Path, Path]) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(str(cert[0]), str(cert[1]))
        first = socket.create_server(("127.0.0.1", 0))
        self.port = int(first.getsockname()[1])
        self.socks = [first, socket.create_server(("127.0.0.2", self.port))]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, args=(s,), daemon=True)
                         for s in self.socks]
        for t in self._threads:
            t.start()

    def serve(self, conn: ssl.SSLSocket, peer: tuple[str, int]) -> None:
        raise NotImplementedError

    def _accept(self, sock: socket.socket) -> None:
        sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                raw, peer = sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(raw, peer), daemon=True).start()

    def _serve(self, raw: socket.socket, peer: tuple[str, int]) -> None:
        raw.settimeout(10)
        with contextlib.suppress(OSError), self.context.wrap_socket(raw, server_side=True) as c:
            self.serve(c, peer)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        for s in self.socks:
            s.close()
