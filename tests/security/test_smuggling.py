"""A request the rules allowed must not carry a second one to the origin, least of all with the
injected credential in it.

HTTP/2 does not refuse CR, LF or NUL in field values, mitmproxy writes an HTTP/2 request into
HTTP/1 verbatim, and HTTP/1 parsers split lines on a bare CR: a header value, a path's query or a
cookie could end the forwarded request and begin another, to a path and Host of the sandbox's
choosing, with the credential sealgate appends last. An HTTP/2 body without a length, written
into HTTP/1 without framing, would do the same. The origin here records every byte it gets over
HTTP/1.1 TLS, so a test sees exactly what arrived.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dnsstub import StubDNS
from tests.harness import OriginCA, Proxy, ProxyFactory, key_digest
from tests.security.rawclient import (
    NoResponse,
    RawResponse,
    h2_exchange,
    open_tunnel,
    proxy_auth,
    read_response,
    tls_wrap,
)

SECRET = "sk-smuggle-canary-7c6b5a4d"
KEY = "smuggle-1-key"


class RecordingOrigin:
    """HTTPS, HTTP/1.1 only; answers every request head with an empty 200 and keeps the raw
    bytes of every connection."""

    def __init__(self, cert: tuple[Path, Path]) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(str(cert[0]), str(cert[1]))
        self.context.set_alpn_protocols(["http/1.1"])
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        self.received.clear()

    @property
    def data(self) -> bytes:
        return b"".join(self.received)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(2)
        index = len(self.received)
        self.received.append(b"")
        with contextlib.suppress(OSError), self.context.wrap_socket(raw, server_side=True) as s:
            answered = 0
            while data := s.recv(65536):
                self.received[index] += data
                heads = self.received[index].count(b"\r\n\r\n")
                while answered < heads:
                    s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    answered += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture(scope="module")
def origin(test_ca: OriginCA) -> Iterator[RecordingOrigin]:
    server = RecordingOrigin(test_ca.issue("strict.test"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sproxy(proxy_with: ProxyFactory, origin: RecordingOrigin, dns: StubDNS) -> Iterator[Proxy]:
    dns.set("strict.test", "A 127.0.0.1")
    rules = f"""
version: 1
policies:
  strict:
    allow:
      - host: strict.test
        ports: [{origin.port}]
        methods: [GET, POST]
        paths: ["/allowed/**"]
        inject:
          - secret: file:key
            as: bearer
    allow_networks: [127.0.0.1/32]
    budgets: {{max_total_bytes: 300000}}
sandboxes:
  strict-1: {{policy: strict, key_sha256: "{key_digest(KEY)}"}}
"""
    with proxy_with(rules, name="smuggle", secrets={"key": SECRET}) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def lax_proxy(proxy_with: ProxyFactory, sproxy: Proxy) -> Iterator[Proxy]:
    """mitmproxy's own HTTP/2 header validation off (an option an operator may set): what it
    would refuse reaches sealgate's checks."""
    with proxy_with(sproxy.rules.read_text(), name="smuggle-lax", secrets={"key": SECRET},
                    options=["--set", "validate_inbound_headers=false"]) as proxy:
        yield proxy


@pytest.fixture()
def clean(origin: RecordingOrigin) -> None:
    origin.reset()


def h2(proxy: Proxy, origin: RecordingOrigin, headers: list[tuple[str, str]],
       body: bytes = b"") -> RawResponse:
    sock, head = open_tunnel(proxy.port, f"strict.test:{origin.port}",
                             [("Proxy-Authorization", proxy_auth("strict-1", KEY))])
    with sock:
        assert head.status == 200
        with tls_wrap(sock, "strict.test", proxy.ca, alpn=["h2"]) as tls:
            assert tls.selected_alpn_protocol() == "h2"
            return h2_exchange(tls, headers, body)


def base(path: str, method: str = "GET") -> list[tuple[str, str]]:
    return [(":method", method), (":scheme", "https"), (":authority", "strict.test"),
            (":path", path)]


SMUGGLED = "\r\n\r\nDELETE /admin/everything HTTP/1.1\r\nHost: strict.test"


@pytest.mark.parametrize(
    "headers",
    [
        [*base("/allowed/x"), ("x-a", "b" + SMUGGLED)],
        [*base("/allowed/x"), ("x-a", "b" + SMUGGLED.replace("\r\n", "\n"))],
        [*base("/allowed/x"), ("cookie", "a=1" + SMUGGLED)],
        [*base("/allowed/x?q=1 HTTP/1.1\r\nHost: strict.test\r\n\r\nDELETE /admin/q")],
        [*base("/allowed/x"), ("x-a", "nul\x00here")],
        [*base("/allowed/x"), ("x-a", "vertical\x0btab")],
    ],
    ids=["crlf-value", "lf-value", "crlf-cookie", "crlf-path-query", "nul-value", "vt-value"],
)
def test_http2_fields_cannot_end_the_forwarded_request(
    sproxy: Proxy, origin: RecordingOrigin, clean: None, headers: list[tuple[str, str]]
) -> None:
    with contextlib.suppress(NoResponse):
        response = h2(sproxy, origin, headers)
        assert response.status == 400, response
    time.sleep(0.2)
    assert origin.received == [], origin.data


@pytest.mark.parametrize(
    "headers",
    [
        [*base("/allowed/x"), ("x:y", "1")],
        [*base("/allowed/x"), ("content-length ", "0")],
        [*base("/allowed/x", "POST"), ("transfer-encoding", "identity")],
    ],
    ids=["colon-in-name", "space-in-name", "h2-transfer-encoding"],
)
def test_http2_fields_mitmproxy_would_refuse_are_refused_without_it(
    lax_proxy: Proxy, origin: RecordingOrigin, clean: None, headers: list[tuple[str, str]]
) -> None:
    """With the h2 library's own checks on, these never reach a hook; with them off, a name
    that is not a token or a Transfer-Encoding would reach an HTTP/1 origin and frame it."""
    with contextlib.suppress(NoResponse):
        response = h2(lax_proxy, origin, headers, b"DELETE /admin HTTP/1.1\r\n\r\n")
        assert response.status == 400, response
    time.sleep(0.2)
    assert origin.received == [], origin.data


def test_a_bare_cr_in_an_http1_field_is_refused(
    sproxy: Proxy, origin: RecordingOrigin, clean: None
) -> None:
    sock, head = open_tunnel(sproxy.port, f"strict.test:{origin.port}",
                             [("Proxy-Authorization", proxy_auth("strict-1", KEY))])
    smuggled = b"DELETE /admin/bare-cr HTTP/1.1\r\nHost: strict.test\r\nContent-Length: 0\r\n\r\n"
    with sock, tls_wrap(sock, "strict.test", sproxy.ca, alpn=["http/1.1"]) as tls:
        assert head.status == 200
        tls.sendall(b"GET /allowed/a HTTP/1.1\r\nHost: strict.test\r\nX-A: a\rContent-Length: 0"
                    b"\r\nContent-Length: %d\r\n\r\n%s" % (len(smuggled), smuggled))
        with contextlib.suppress(NoResponse):
            assert read_response(tls).status == 400
    time.sleep(0.2)
    assert origin.received == [], origin.data


def test_an_http2_body_without_a_length_is_framed_for_http1(
    sproxy: Proxy, origin: RecordingOrigin, clean: None
) -> None:
    """The body reaches the origin as the body of the allowed request, never as a request."""
    body = b"DELETE /admin/body HTTP/1.1\r\nHost: strict.test\r\nContent-Length: 0\r\n\r\n"
    response = h2(sproxy, origin, base("/allowed/x", "POST"), body)
    assert response.status == 200
    time.sleep(0.2)
    data = origin.data
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /allowed/x HTTP/1.1"), data
    assert f"Bearer {SECRET}".encode() in head
    # Framed: chunked (the length is unknown when the head goes out), the DELETE only as data.
    assert b"transfer-encoding: chunked" in head.lower(), data
    assert rest == b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body), data


def test_an_http2_body_without_a_length_counts_against_the_budget(
    sproxy: Proxy, origin: RecordingOrigin, clean: None
) -> None:
    """Streamed and metered like a chunked HTTP/1 body, not buffered uncounted."""
    part = b"x" * 15_000  # one DATA frame (max 16 KiB), one request each
    for _ in range(21):
        with contextlib.suppress(NoResponse):
            h2(sproxy, origin, base("/allowed/big", "POST"), part)
    after = h2(sproxy, origin, base("/allowed/after"))
    assert (after.status, after.reason) == (429, "budget_exceeded")
