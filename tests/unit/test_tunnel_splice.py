"""A blind tunnel relayed socket to socket (proxy/engine/splice.py), through a real proxy.

Once spliced, mitmproxy's layers see nothing until an end: the bytes must still arrive whole
and in order under backpressure, a half-close must still reach the other side (and what the
other side sends after it must still come back), the idle timeout must still see a tunnel in use
(and close a silent one), and the connection's audit line must still be written.
"""

from __future__ import annotations

import hashlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.dnsstub import StubDNS
from tests.harness import OriginCA, Proxy, ProxyFactory, key_digest
from tests.rawserver import RawServer
from tests.security.rawclient import open_tunnel, proxy_auth

NAME = "splice.test"
KEY = "splice-1-key"
BIG = 8 * 1024 * 1024
IDLE = 3  # the proxy's idle timeout, seconds
REPLY = bytes(range(251)) * 4177  # ~1 MiB, sent by ReplyAtEnd after its client's end


class EchoOrigin:
    """TLS on loopback: echoes each connection's bytes back; at the client's end it notes how
    many it read."""

    def __init__(self, cert: tuple[Path, Path]) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(*cert)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.ended: list[int] = []  # bytes read by each connection whose client ended
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                total = 0
                while data := tls.recv(65536):
                    total += len(data)
                    tls.sendall(data)
                self.ended.append(total)
        except (OSError, ssl.SSLError):
            pass

    def stop(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def origin(test_ca: OriginCA, dns: StubDNS) -> Iterator[EchoOrigin]:
    dns.set(NAME, "A 127.0.0.1")
    echo = EchoOrigin(test_ca.issue(NAME))
    yield echo
    echo.stop()


class ReplyAtEnd(RawServer):
    """Plain TCP on loopback: reads each connection up to its client's end (a half-close), notes
    what it read, then sends REPLY and closes. The tunnel never looks past the ClientHello, so
    the origin need not speak TLS."""

    def __init__(self) -> None:
        self.ended: list[bytes] = []  # what each connection read, once its client ended
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        received = bytearray()
        while data := conn.recv(65536):
            received += data
        self.ended.append(bytes(received))
        conn.sendall(REPLY)


@pytest.fixture(scope="module")
def replier() -> Iterator[ReplyAtEnd]:
    server = ReplyAtEnd()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tproxy(proxy_with: ProxyFactory, origin: EchoOrigin, replier: ReplyAtEnd) -> Iterator[Proxy]:
    rules = f"""
version: 1
policies:
  blind:
    allow:
      - host: {NAME}  # no method or path: TLS to it is passed through undecrypted
        ports: [{origin.port}, {replier.port}]
    allow_networks: [127.0.0.1/32]
sandboxes:
  splice-1: {{policy: blind, key_sha256: "{key_digest(KEY)}"}}
"""
    with proxy_with(rules, name="splice", options=["--idle-timeout", str(IDLE)],
                    clean_stderr=True) as p:
        yield p


class Client:
    """TLS to the origin over a tunnel's socket, by memory BIOs: the socket stays a plain one,
    so its write side can be shut while TLS reading goes on (as a client's half-close)."""

    def __init__(self, proxy: Proxy, origin: EchoOrigin, test_ca: OriginCA) -> None:
        self.sock, head = open_tunnel(proxy.port, f"{NAME}:{origin.port}",
                                      [("Proxy-Authorization", proxy_auth("splice-1", KEY))])
        assert head.status == 200
        self.sock.settimeout(20)
        context = ssl.create_default_context(cafile=str(test_ca.path))
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname=NAME)
        while not self._step(self.tls.do_handshake):
            pass

    def _step(self, op: Callable[[], object]) -> bool:
        try:
            op()
            done = True
        except ssl.SSLWantReadError:
            done = False
        self.sock.sendall(self.outgoing.read())
        if not done:
            data = self.sock.recv(65536)
            if not data:
                self.incoming.write_eof()
            self.incoming.write(data)
        return done

    def send(self, data: bytes) -> None:
        self.tls.write(data)
        self.sock.sendall(self.outgoing.read())

    def recv(self) -> bytes:
        """What the origin sent next; b"" at its end."""
        while True:
            try:
                return self.tls.read(65536)
            except ssl.SSLWantReadError:
                data = self.sock.recv(65536)
                if not data:
                    return b""
                self.incoming.write(data)
            except ssl.SSLEOFError:
                return b""


def test_bytes_arrive_whole_both_ways_and_the_end_reaches_the_origin(
    tproxy: Proxy, origin: EchoOrigin, test_ca: OriginCA
) -> None:
    client = Client(tproxy, origin, test_ca)
    with client.sock:
        client.send(b"x")  # the splice is asked for after a first chunk
        assert client.recv() == b"x"
        sent = hashlib.sha256()
        chunk = bytes(range(256)) * 64

        def send() -> None:  # all of it before reading any: the buffers fill both ways
            for i in range(BIG // len(chunk)):
                piece = chunk[i % 256:] + chunk[:i % 256]
                sent.update(piece)
                client.send(piece)

        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(1)
        got, received = hashlib.sha256(), 0
        while received < BIG:
            data = client.recv()
            assert data, f"ended after {received} of {BIG} bytes"
            got.update(data)
            received += len(data)
        sender.join(20)
        assert got.hexdigest() == sent.hexdigest()
        # The end of our side reaches the origin, after every byte (and well before the idle
        # timeout would have closed the tunnel anyway).
        client.sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + IDLE - 1
        while BIG + 1 not in origin.ended and time.monotonic() < deadline:
            time.sleep(0.05)
        assert BIG + 1 in origin.ended
    # mitmproxy's own close ran: the connection's audit line, once the tunnel ended; and the
    # bytes went socket to socket.
    line = tproxy.wait_audit(lambda e: e.get("event") == "connection_closed"
                             and e.get("target") == f"{NAME}:{origin.port}")
    assert line["sandbox"] == "splice-1" and line["tunnel"] is True and line["spliced"] is True


def test_an_active_tunnel_outlives_the_idle_timeout_and_a_silent_one_is_closed(
    tproxy: Proxy, origin: EchoOrigin, test_ca: OriginCA
) -> None:
    client = Client(tproxy, origin, test_ca)
    with client.sock:
        started = time.monotonic()
        while time.monotonic() - started < IDLE + 1.5:  # past the idle timeout, a chunk often
            client.send(b"ping")
            assert client.recv() == b"ping"
            time.sleep(0.4)
        started = time.monotonic()
        assert client.recv() == b""  # nothing sent for the idle timeout: closed
        assert IDLE - 0.5 < time.monotonic() - started < IDLE + 5


def client_hello() -> bytes:
    """A real ClientHello for NAME: what the proxy checks before a blind tunnel goes upstream."""
    outgoing = ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=NAME)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("spliced", [True, False], ids=["spliced", "before_the_splice"])
def test_after_the_clients_half_close_the_origin_sees_its_end_and_its_reply_comes_back(
    tproxy: Proxy, replier: ReplyAtEnd, spliced: bool
) -> None:
    target = f"{NAME}:{replier.port}"
    # The splice is the proxy's to schedule (after a first chunk, when both sockets are idle):
    # a loaded machine may not have done it within the pause (or, the other case, done it
    # before the end was read), so each case tries again, bounded, until its connection's
    # audit line says it took the path it is about; every try checks everything.
    for _ in range(3):
        before = {e["connection_id"] for e in tproxy.audit()
                  if e.get("event") == "connection_closed"}
        half_close_and_reply(tproxy, replier, spliced)
        line = tproxy.wait_audit(lambda e, before=before: e.get("event") == "connection_closed"
                                 and e.get("target") == target
                                 and e["connection_id"] not in before)
        if line["spliced"] is spliced:
            break
    assert line["spliced"] is spliced and line["tunnel"] is True


def half_close_and_reply(tproxy: Proxy, replier: ReplyAtEnd, spliced: bool) -> None:
    sock, head = open_tunnel(tproxy.port, f"{NAME}:{replier.port}",
                             [("Proxy-Authorization", proxy_auth("splice-1", KEY))])
    assert head.status == 200
    request = client_hello() + f"request, spliced={spliced}".encode()
    with sock:
        sock.settimeout(IDLE + 5)  # every recv below: the reply comes at once, or never
        if spliced:  # the splice is asked for once a first chunk went upstream
            sock.sendall(request[:-8])
            time.sleep(0.5)
            sock.sendall(request[-8:])
            time.sleep(0.3)
            sock.shutdown(socket.SHUT_WR)
        else:  # the end in the ClientHello's segment: read before any splice is tried
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)  # the FIN joins the corked bytes
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        started, reply = time.monotonic(), bytearray()
        while data := sock.recv(65536):
            reply += data
        # All of it, then the origin's end: well before the idle timeout would have closed it.
        assert (len(reply), hashlib.sha256(reply).hexdigest()) == (
            len(REPLY), hashlib.sha256(REPLY).hexdigest())
        assert time.monotonic() - started < IDLE
    # The client's end was passed on as a half-close: the origin read it all, then its EOF.
    assert request in replier.ended
