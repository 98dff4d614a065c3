"""A tunnel that is to start with TLS gets --handshake-timeout to finish the handshake: a CONNECT
that never sends a ClientHello, or trickles one byte by byte, is closed then, long before the
idle timeout; a handshake that finished is never cut by it, intercepted or blind."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from tests.conftest import KEYS
from tests.dnsstub import StubDNS
from tests.harness import Origin, OriginCA, Proxy, ProxyFactory, key_digest
from tests.security.rawclient import (
    open_tunnel,
    proxy_auth,
    read_response,
    request_bytes,
    tls_wrap,
)

DEADLINE, IDLE = 1.0, 30.0


@pytest.fixture(scope="module")
def hproxy(proxy_with: ProxyFactory, origin_https: Origin, dns: StubDNS,
           test_ca: OriginCA) -> Iterator[Proxy]:
    dns.set("blind.svc.test", "A 127.0.0.1")
    rules = f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{origin_https.port}]
        methods: [GET]     # intercepted
      - host: blind.svc.test
        ports: [{origin_https.port}]   # a blind tunnel
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
"""
    with proxy_with(rules, name="handshake",
                    options=["--handshake-timeout", str(DEADLINE), "--idle-timeout", str(IDLE)]
                    ) as p:
        # The client trusts the proxy's CA (intercepted) and the origin's (blind).
        (p.workdir / "trust.pem").write_text(p.ca.read_text() + test_ca.path.read_text())
        yield p


def tunnel(p: Proxy, host: str, port: int) -> socket.socket:
    sock, head = open_tunnel(p.port, f"{host}:{port}",
                             [("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"]))])
    assert head.status == 200
    return sock


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the proxy closed `sock` (reading whatever it sent), or None if it did not
    within `seconds`."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - started
    return None


def client_hello(sni: str) -> bytes:
    """The first flight of a real TLS client: its ClientHello record."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=sni)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_a_connect_that_never_starts_tls_is_closed_at_the_deadline(
    hproxy: Proxy, origin_https: Origin
) -> None:
    with tunnel(hproxy, "api.test", origin_https.port) as sock:
        took = closed_within(sock, IDLE / 2)
    assert took is not None and took < DEADLINE + 3
    line = hproxy.wait_audit(lambda e: e.get("event") == "handshake_timeout")
    assert line["count"] >= 1


@pytest.mark.parametrize("host", ["api.test", "blind.svc.test"])
def test_a_client_hello_trickled_byte_by_byte_is_cut_off(
    hproxy: Proxy, origin_https: Origin, host: str
) -> None:
    hello = client_hello(host)
    with tunnel(hproxy, host, origin_https.port) as sock:
        started = time.monotonic()
        cut = False
        for byte in hello[: int(IDLE * 4)]:  # one byte every 0.25 s: never idle
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                cut = True
                break
            if closed_within(sock, 0.25) is not None:
                cut = True
                break
        assert cut, "the trickled handshake was never cut"
        assert time.monotonic() - started < DEADLINE + 3


@pytest.mark.parametrize("host", ["api.test", "blind.svc.test"])
def test_a_finished_handshake_is_never_cut_by_the_deadline(
    hproxy: Proxy, origin_https: Origin, host: str
) -> None:
    sock = tunnel(hproxy, host, origin_https.port)
    with tls_wrap(sock, host, hproxy.workdir / "trust.pem") as tls:
        time.sleep(DEADLINE * 2.5)
        authority = f"{host}:{origin_https.port}"
        tls.sendall(request_bytes("GET", "/after-the-deadline", [("Host", authority)]))
        assert read_response(tls).status == 200
