"""Attacks on the fast CONNECT path (proxy/engine/fastconnect.py): a hostile client in the
sandbox. Each test checks what reached the origin, not only the statuses it was given."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator

import pytest

from tests.dnsstub import StubDNS
from tests.harness import Origin, OriginCA, Proxy, ProxyFactory
from tests.integration.test_fast_connect import AUTH, _proxy, _tunnel
from tests.security.rawclient import read_response, request_bytes, tls_wrap


@pytest.fixture(scope="module")
def fast(proxy_with: ProxyFactory, origin_https: Origin, test_ca: OriginCA,
         dns: StubDNS) -> Iterator[tuple[Proxy, int]]:
    with _proxy(proxy_with, origin_https, test_ca) as p:
        yield p


def _drain(sock: socket.socket) -> bytes:
    """What the proxy sends until it closes or goes quiet for 3 s (bounded)."""
    sock.settimeout(3)
    received = b""
    for _ in range(64):
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        received += chunk
    return received


def _paths(origin: Origin, seen: int) -> list[str]:
    return [r.path for r in origin.requests[seen:]]


def test_host_header_for_another_name_is_refused(fast: tuple[Proxy, int],
                                                  origin_https: Origin) -> None:
    """Domain fronting: tunnel and SNI for api.test, Host inside names limited.test."""
    proxy, _ = fast
    seen = len(origin_https.requests)
    host, port = "api.test", origin_https.port
    with tls_wrap(_tunnel(proxy, host, port), host, proxy.workdir / "trust.pem") as tls:
        tls.sendall(request_bytes("GET", "/fca-front", [("Host", f"limited.test:{port}")]))
        try:
            status = read_response(tls).status
        except (ConnectionError, OSError):
            status = 0
    assert status != 200
    assert "/fca-front" not in _paths(origin_https, seen)
    line = proxy.wait_audit(lambda e: e.get("event") == "request" and e.get("method") == "GET"
                            and e.get("reason") == "name_mismatch")
    assert line["decision"] == "deny"


def test_plaintext_after_client_hello_is_never_a_request(fast: tuple[Proxy, int],
                                                         origin_https: Origin) -> None:
    """CONNECT, ClientHello and a plaintext request in one write: the plaintext must never be
    taken as decrypted request data."""
    proxy, _ = fast
    seen = len(origin_https.requests)
    host, port = "api.test", origin_https.port
    context = ssl.create_default_context(cafile=str(proxy.workdir / "trust.pem"))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_hostname=host)
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = outgoing.read()
    authority = f"{host}:{port}"
    smuggled = request_bytes("GET", "/fca-smuggled", [("Host", authority)])
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(request_bytes("CONNECT", authority, [("Host", authority), *AUTH])
                     + hello + smuggled)
        received = _drain(sock)
    assert received.startswith(b"HTTP/1.1 200")
    assert "/fca-smuggled" not in _paths(origin_https, seen)


def test_refused_connect_is_not_followed_by_a_tunnel(fast: tuple[Proxy, int],
                                                      origin_https: Origin) -> None:
    """A CONNECT to a port not allowed, with a request pipelined after it: 403, nothing out."""
    proxy, _ = fast
    seen, connections = len(origin_https.requests), origin_https.connections
    authority = f"api.test:{origin_https.port + 1}"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(request_bytes("CONNECT", authority, [("Host", authority), *AUTH])
                     + request_bytes("GET", "/fca-after-403",
                                     [("Host", f"api.test:{origin_https.port}")]))
        received = _drain(sock)
    # refused either before the tunnel (403) or, decided on the CONNECT, inside its TLS: the
    # pipelined plaintext request must never go out
    assert not received.startswith(b"HTTP/1.1 200") or b"fca-after-403" not in received
    assert "/fca-after-403" not in _paths(origin_https, seen)
    assert origin_https.connections == connections


def test_cl_te_smuggle_inside_the_tunnel_is_never_unaudited(fast: tuple[Proxy, int],
                                                             origin_https: Origin) -> None:
    """Content-Length and chunked together, a request hidden in the body: whatever the origin
    got, each request it saw was decided and logged by the proxy (none went out unseen)."""
    proxy, _ = fast
    seen = len(origin_https.requests)
    host, port = "api.test", origin_https.port
    hidden = request_bytes("GET", "/fca-hidden", [("Host", f"{host}:{port}")])
    body = b"0\r\n\r\n" + hidden
    with tls_wrap(_tunnel(proxy, host, port), host, proxy.workdir / "trust.pem") as tls:
        tls.sendall(request_bytes("POST", "/fca-cl-te", [
            ("Host", f"{host}:{port}"), ("Content-Length", str(len(body))),
            ("Transfer-Encoding", "chunked")]) + body)
        _drain(tls)
    got = _paths(origin_https, seen)
    for path in got:
        proxy.wait_audit(lambda e, p=path: e.get("event") == "request" and e.get("path") == p)
    assert set(got) <= {"/fca-cl-te", "/fca-hidden"}
