"""CONNECT on the fast path (proxy/engine/fastconnect.py): an intercepted tunnel's TLS ended and
its HTTP/1.1 requests served without mitmproxy's layers; what it does not serve goes on in
mitmproxy's layers as the same connection (proxy/engine/continued.py): one connection id, one
connection line, every byte once and in order. The client leg resumes TLS sessions per leaf
certificate, never across names; with client-leg TLS options it does not honour, CONNECTs are
mitmproxy's whole."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator

import pytest

from tests.conftest import KEYS, client
from tests.dnsstub import StubDNS
from tests.harness import Origin, OriginCA, Proxy, ProxyFactory, free_port, key_digest
from tests.integration.test_fast_path import counted, counts
from tests.security.rawclient import (
    h2_exchange,
    open_tunnel,
    proxy_auth,
    read_response,
    request_bytes,
    tls_wrap,
)

AUTH = [("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"]))]


def _rules(port: int) -> str:
    return f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{port}]
        methods: [GET, POST]     # intercepted
      - host: limited.test
        ports: [{port}]
        methods: [GET]           # intercepted
      - host: a.svc.test
        ports: [{port}]          # a blind tunnel
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
"""


@contextlib.contextmanager
def _proxy(proxy_with: ProxyFactory, origin: Origin, test_ca: OriginCA, *options: str
           ) -> Iterator[tuple[Proxy, int]]:
    admin = free_port()
    with proxy_with(_rules(origin.port), name="fastconnect",
                    options=["--admin", f"127.0.0.1:{admin}", *options],
                    clean_stderr=True) as p:
        (p.workdir / "trust.pem").write_text(p.ca.read_text() + test_ca.path.read_text())
        yield p, admin


@pytest.fixture(scope="module")
def fast(proxy_with: ProxyFactory, origin_https: Origin, test_ca: OriginCA,
         dns: StubDNS) -> Iterator[tuple[Proxy, int]]:
    with _proxy(proxy_with, origin_https, test_ca) as p:
        yield p


def _tunnel(proxy: Proxy, host: str, port: int) -> socket.socket:
    sock, head = open_tunnel(proxy.port, f"{host}:{port}", AUTH)
    assert head.status == 200
    return sock


def _get(tls: ssl.SSLSocket, host: str, port: int, path: str, extra: bytes = b"") -> int:
    tls.sendall(request_bytes("GET", path, [("Host", f"{host}:{port}")]) + extra)
    return read_response(tls).status


def _lines(proxy: Proxy, paths: set[str]) -> list[dict[str, object]]:
    return [line for line in proxy.audit() if line.get("path") in paths]


def _closed_lines(proxy: Proxy, connection_id: object) -> list[dict[str, object]]:
    proxy.wait_audit(lambda e: e.get("event") == "connection_closed"
                     and e.get("connection_id") == connection_id)
    return [line for line in proxy.audit() if line.get("event") == "connection_closed"
            and line.get("connection_id") == connection_id]


def test_an_intercepted_tunnel_is_the_fast_paths(fast: tuple[Proxy, int],
                                                 origin_https: Origin) -> None:
    """urllib3's CONNECT (HTTP/1.0) and two requests inside: served, each decided and logged
    on the one connection; nothing handed to mitmproxy."""
    proxy, admin = fast
    before, seen = counts(admin), len(origin_https.requests)
    url = f"https://api.test:{origin_https.port}"
    with client(proxy) as c:
        assert c.get(f"{url}/fc-one", timeout=10).status_code == 200
        assert c.post(f"{url}/fc-two", data=b"abc", timeout=10).status_code == 200
    assert [(r.method, r.path, r.body) for r in origin_https.requests[seen:]] == [
        ("GET", "/fc-one", b""), ("POST", "/fc-two", b"abc")]
    assert counted(admin, before, taken=1) == {"taken": 1, "handed_over": 0}
    lines = _lines(proxy, {"/fc-one", "/fc-two"})
    assert [line["decision"] for line in lines] == ["allow", "allow"]
    ids = {line["connection_id"] for line in lines}
    assert len(ids) == 1
    assert len(_closed_lines(proxy, ids.pop())) == 1


def test_a_request_inside_it_does_not_take_goes_on_in_mitmproxy(fast: tuple[Proxy, int],
                                                                origin_https: Origin) -> None:
    """A chunked body inside the TLS: mitmproxy's layers carry on from that request, on the
    decrypted stream, as the same connection; the request after it is served too."""
    proxy, admin = fast
    before, seen = counts(admin), len(origin_https.requests)
    host, port = "api.test", origin_https.port
    with tls_wrap(_tunnel(proxy, host, port), host, proxy.workdir / "trust.pem") as tls:
        assert _get(tls, host, port, "/fc-before") == 200
        tls.sendall(request_bytes("POST", "/fc-odd", [("Host", f"{host}:{port}"),
                                                      ("Transfer-Encoding", "chunked")])
                    + b"3\r\nabc\r\n0\r\n\r\n")
        assert read_response(tls).status == 200
        assert _get(tls, host, port, "/fc-after") == 200
    got = origin_https.requests[seen:]
    assert [(r.path, r.body) for r in got] == [
        ("/fc-before", b""), ("/fc-odd", b"abc"), ("/fc-after", b"")]
    assert counted(admin, before, taken=1, handed_over=1) == {"taken": 1, "handed_over": 1}
    ids = {line["connection_id"] for line in _lines(proxy, {"/fc-before", "/fc-odd",
                                                            "/fc-after"})}
    assert len(ids) == 1
    assert len(_closed_lines(proxy, ids.pop())) == 1


def test_http2_offered_goes_on_in_mitmproxy(fast: tuple[Proxy, int],
                                            origin_https: Origin) -> None:
    """A client offering h2 gets it, from mitmproxy's layers (the fast path speaks HTTP/1.1)."""
    proxy, admin = fast
    before, seen = counts(admin), len(origin_https.requests)
    host, port = "api.test", origin_https.port
    with tls_wrap(_tunnel(proxy, host, port), host, proxy.workdir / "trust.pem",
                  alpn=["h2", "http/1.1"]) as tls:
        assert tls.selected_alpn_protocol() == "h2"
        answer = h2_exchange(tls, [(":method", "GET"), (":scheme", "https"),
                                   (":authority", f"{host}:{port}"), (":path", "/fc-h2")])
    assert answer.status == 200
    assert [r.path for r in origin_https.requests[seen:]] == ["/fc-h2"]
    assert counted(admin, before, taken=1, handed_over=1) == {"taken": 1, "handed_over": 1}


def test_a_blind_tunnel_goes_on_in_mitmproxy(fast: tuple[Proxy, int], origin_https: Origin,
                                             test_ca: OriginCA) -> None:
    """Passed through undecrypted: the client trusts only the origin's CA, and is served."""
    proxy, admin = fast
    before, seen = counts(admin), len(origin_https.requests)
    host, port = "a.svc.test", origin_https.port
    with tls_wrap(_tunnel(proxy, host, port), host, test_ca.path) as tls:
        assert _get(tls, host, port, "/fc-blind") == 200
    assert [r.path for r in origin_https.requests[seen:]] == ["/fc-blind"]
    assert counted(admin, before, taken=1, handed_over=1) == {"taken": 1, "handed_over": 1}


def test_a_client_hello_for_another_name_gets_no_handshake(fast: tuple[Proxy, int],
                                                           origin_https: Origin) -> None:
    proxy, _ = fast
    connections = origin_https.connections
    sock = _tunnel(proxy, "api.test", origin_https.port)
    with pytest.raises((ssl.SSLError, OSError)):
        tls_wrap(sock, "a.svc.test", proxy.workdir / "trust.pem").close()
    sock.close()
    line = proxy.wait_audit(lambda e: e.get("event") == "tls_denied"
                            and e.get("sni") == "a.svc.test")
    assert line["reason"] == "sni_mismatch"
    assert origin_https.connections == connections


def _session_of(proxy: Proxy, host: str, port: int, context: ssl.SSLContext,
                session: ssl.SSLSession | None = None) -> tuple[ssl.SSLSession | None, bool]:
    with context.wrap_socket(_tunnel(proxy, host, port), server_hostname=host,
                             session=session) as tls:
        assert _get(tls, host, port, "/fc-resume") == 200  # a TLS 1.3 ticket comes meanwhile
        return tls.session, tls.session_reused


def test_the_client_leg_resumes_per_name(fast: tuple[Proxy, int],
                                         origin_https: Origin) -> None:
    """A client's next connection to the same name resumes its session with the proxy (no
    certificate sent or checked again); a session offered for another name is not taken."""
    proxy, _ = fast
    context = ssl.create_default_context(cafile=str(proxy.workdir / "trust.pem"))
    port = origin_https.port
    first, reused = _session_of(proxy, "api.test", port, context)
    assert first is not None and not reused
    assert _session_of(proxy, "api.test", port, context, first)[1]
    assert not _session_of(proxy, "limited.test", port, context, first)[1]


def test_mitmproxys_whole_under_client_tls_options_it_does_not_honour(
    proxy_with: ProxyFactory, origin_https: Origin, test_ca: OriginCA, dns: StubDNS
) -> None:
    with _proxy(proxy_with, origin_https, test_ca, "--set", "tls_version_client_min=TLS1_3"
                ) as (proxy, admin):
        before = counts(admin)
        host, port = "api.test", origin_https.port
        with tls_wrap(_tunnel(proxy, host, port), host, proxy.workdir / "trust.pem") as tls:
            assert tls.version() == "TLSv1.3"
            assert _get(tls, host, port, "/fc-mitm") == 200
        assert counted(admin, before, handed_over=1) == {"taken": 0, "handed_over": 1}


@pytest.mark.parametrize("engine", ["fast", "mitmproxy"])
def test_plain_http_inside_a_tunnel_is_answered_as_mitmproxy_answers_it(
    proxy_with: ProxyFactory, origin_https: Origin, test_ca: OriginCA, dns: StubDNS,
    engine: str
) -> None:
    """Bytes that are no ClientHello after a CONNECT 200: mitmproxy's HTTP layer has them, on
    either engine, with the same answer (the origin speaks TLS: no answer it can read)."""
    options = () if engine == "fast" else ("--set", "sealgate_fast_path=false")
    with _proxy(proxy_with, origin_https, test_ca, *options) as (proxy, _):
        host, port = "api.test", origin_https.port
        with _tunnel(proxy, host, port) as sock:
            sock.sendall(request_bytes("GET", "/fc-plain", [("Host", f"{host}:{port}")]))
            assert read_response(sock).status == 502
