"""A request refused at its head is answered before its body, and a client that goes on to write
the whole body (as requests and http.client do) reads the refusal instead of a reset.

The proxy reads and drops what the client still sends (proxy/linger.py) until the body ends, and
only within bounds: past `--linger-bytes` or `--linger-timeout` an HTTP/1 connection is closed
and an HTTP/2 stream reset, the connection's other streams going on. On every path (plain HTTP,
an intercepted tunnel, base-URL mode, HTTP/2; transparent mode in test_transparent.py), with a
declared length or chunked, nothing reaches the origin: no connection, no byte.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest
import requests

from tests.conftest import KEYS
from tests.harness import Origin, Proxy, ProxyFactory, key_digest
from tests.security.bodyclient import H2Upload, through
from tests.security.rawclient import (
    body_pieces,
    proxy_auth,
    read_response,
    request_bytes,
    upload_whole,
)

AUTH = ("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"]))
BIG = 16 * 1024 * 1024  # well past socket buffers (a few MiB on loopback) and the budget


def _rules(http_port: int, https_port: int) -> str:
    # api.test's methods make its tunnels intercepted; PUT is refused at the head (403).
    # closed-1 has one request, then a request a minute (its refusals are held a second).
    allow = f"""
    allow:
      - host: api.test
        ports: [{http_port}, {https_port}]
        methods: [GET, POST]
    allow_networks: [127.0.0.1/32]"""
    return f"""
version: 1
policies:
  ci:{allow}
    budgets:
      max_request_bytes: 1000
  slow:{allow}
    budgets:
      requests_per_second: 0.016
      burst: 1
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
  closed-1: {{policy: slow, key_sha256: "{key_digest(KEYS['closed-1'])}"}}
default_policy: null
"""


# Both check on the way out that neither sealgate's code nor mitmproxy's handling of a
# connection raised (mitmproxy's error records on stderr).
@pytest.fixture(scope="module")
def rproxy(proxy_with: ProxyFactory, origin_http: Origin, origin_https: Origin
           ) -> Iterator[Proxy]:
    with proxy_with(_rules(origin_http.port, origin_https.port), name="refused",
                    mitmproxy_errors=True, clean_stderr=True) as p:
        yield p


@pytest.fixture(scope="module")
def tight(proxy_with: ProxyFactory, origin_http: Origin, origin_https: Origin
          ) -> Iterator[Proxy]:
    """Lingering bounded at 2 MiB and 1 s."""
    with proxy_with(_rules(origin_http.port, origin_https.port), name="tight",
                    options=["--linger-bytes", str(2 * 1024 * 1024), "--linger-timeout", "1"],
                    mitmproxy_errors=True, clean_stderr=True) as p:
        yield p


@pytest.fixture()
def origins(origin_http: Origin, origin_https: Origin) -> tuple[Origin, Origin]:
    origin_http.reset()
    origin_https.reset()
    return origin_http, origin_https


def untouched(origins: tuple[Origin, Origin]) -> bool:
    """Nothing of a refused request went anywhere: not a connection, not a byte."""
    return all((o.connections, o.bytes_received, o.requests) == (0, 0, []) for o in origins)


def _head(target: str, authority: str, *, chunked: bool, size: int = BIG) -> bytes:
    framing = ("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(size))
    # Chunked (no length to refuse) goes as a PUT, which the rules refuse at the head.
    return request_bytes("PUT" if chunked else "POST", target, [("Host", authority), AUTH,
                                                                framing])


@contextlib.contextmanager
def _through(proxy: Proxy, path: str, origins: tuple[Origin, Origin]
             ) -> Iterator[tuple[socket.socket, str, str]]:
    """A connection to the proxy for `path`, and the target and authority to write."""
    with through(proxy, path, origins[0].port, origins[1].port, AUTH) as (sock, base, authority):
        yield sock, base + "/up", authority


def test_a_50_mb_upload_over_the_budget_reads_its_413(
    rproxy: Proxy, origins: tuple[Origin, Origin]
) -> None:
    """requests writes the whole body before it reads: through an intercepted tunnel its next
    write after a close failed with a TLS EOF, and the 413 was never read."""
    session = requests.Session()
    session.trust_env = False
    session.proxies = {"https": rproxy.url("bot-1", KEYS["bot-1"])}
    session.verify = str(rproxy.ca)
    r = session.post(f"https://api.test:{origins[1].port}/upload", data=b"x" * 50_000_000,
                     timeout=30)
    assert r.status_code == 413
    assert r.headers["X-Sealgate-Error"] == "request_too_large"
    assert r.json()["error"]["code"] == "request_too_large"
    assert untouched(origins)


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
@pytest.mark.parametrize("path", ["plain", "tunnel", "base-url"])
def test_a_client_writing_its_whole_body_reads_the_refusal(
    rproxy: Proxy, origins: tuple[Origin, Origin], path: str, chunked: bool
) -> None:
    with _through(rproxy, path, origins) as (sock, target, authority):
        head = _head(target, authority, chunked=chunked)
        response = upload_whole(sock, head, BIG, chunked=chunked)
    assert (response.status, response.reason) == ((403, "not_allowed") if chunked
                                                  else (413, "request_too_large"))
    assert untouched(origins)


def test_expect_100_continue_gets_the_refusal_instead(
    rproxy: Proxy, origins: tuple[Origin, Origin]
) -> None:
    with socket.create_connection(("127.0.0.1", rproxy.port), timeout=10) as sock:
        sock.sendall(_head(f"http://api.test:{origins[0].port}/up", f"api.test:{origins[0].port}",
                           chunked=False).replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"))
        response = read_response(sock, timeout=10)  # no body sent at all
        assert sock.recv(1) == b""  # closed at once: no body is coming
    assert (response.status, response.reason) == (413, "request_too_large")
    assert untouched(origins)


def test_a_body_within_the_budget_still_goes(rproxy: Proxy, origin_http: Origin) -> None:
    origin_http.reset()
    authority = f"api.test:{origin_http.port}"
    with socket.create_connection(("127.0.0.1", rproxy.port), timeout=10) as sock:
        sock.sendall(request_bytes("POST", f"http://{authority}/up", [
            ("Host", authority), AUTH, ("Content-Length", "900"), ("Expect", "100-continue")]))
        interim = b""
        while not interim.endswith(b"\r\n\r\n") and len(interim) < 4096:
            interim += sock.recv(1)
        assert interim.startswith(b"HTTP/1.1 100"), interim  # invited: it is within budget
        sock.sendall(b"y" * 900)
        assert read_response(sock, timeout=10).status == 200
    assert [len(s.body) for s in origin_http.requests] == [900]


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
def test_a_body_past_the_byte_bound_is_cut_off(
    tight: Proxy, origins: tuple[Origin, Origin], chunked: bool
) -> None:
    """The refusal is read before the body; then at most 2 MiB of it (and what the sockets'
    buffers hold) is taken before the connection is closed."""
    with _through(tight, "plain", origins) as (sock, target, authority):
        sock.sendall(_head(target, authority, chunked=chunked, size=64 * 1024 * 1024))
        response = read_response(sock, timeout=10)
        sent = 0
        with contextlib.suppress(OSError):
            for piece in body_pieces(64 * 1024 * 1024, chunked=chunked):
                sock.sendall(piece)
                sent += len(piece)
    assert response.status == (403 if chunked else 413)
    assert sent < 32 * 1024 * 1024  # of 64 MiB: 2 MiB and what the socket buffers held
    assert untouched(origins)


def test_a_body_still_coming_after_the_time_bound_is_cut_off(
    tight: Proxy, origins: tuple[Origin, Origin]
) -> None:
    with _through(tight, "tunnel", origins) as (sock, target, authority):
        sock.sendall(_head(target, authority, chunked=False))
        assert read_response(sock, timeout=10).status == 413
        started = time.monotonic()
        with contextlib.suppress(OSError):
            while time.monotonic() - started < 8:  # 16 KiB every 0.1 s: under the byte bound
                sock.sendall(b"s" * 16384)
                time.sleep(0.1)
    assert time.monotonic() - started < 4
    assert untouched(origins)


def test_a_body_that_came_while_its_refusal_was_held_is_dropped_past_the_bound(
    tight: Proxy, origins: tuple[Origin, Origin]
) -> None:
    """A spent budget's refusal is held a second (proxy/budget.py), and the body that arrives
    meanwhile waits for it in mitmproxy's queue: once answered, the bound is passed in the middle
    of that queue, and the rest of it must be dropped too (mitmproxy raised on each event left,
    in the proxy's log only). The client still reads its 429."""
    authority = f"api.test:{origins[0].port}"
    who = ("Proxy-Authorization", proxy_auth("closed-1", KEYS["closed-1"]))
    with socket.create_connection(("127.0.0.1", tight.port), timeout=10) as sock:
        sock.sendall(request_bytes("GET", f"http://{authority}/first", [("Host", authority), who]))
        assert read_response(sock, timeout=10).status == 200  # the policy's one request
    size = 8 * 1024 * 1024  # within the policy's 10 MiB per request: refused for the rate
    with socket.create_connection(("127.0.0.1", tight.port), timeout=10) as sock:
        head = request_bytes("POST", f"http://{authority}/up", [
            ("Host", authority), who, ("Content-Length", str(size))])
        response = upload_whole(sock, head, size, chunked=False)  # all in the held second
    assert (response.status, response.reason) == (429, "budget_exceeded")
    assert [s.path for s in origins[0].requests] == ["/first"]
    assert origins[0].bytes_received == 0
    assert "has crashed" not in tight.stderr()


# -- HTTP/2: the refused stream is answered at once, the connection goes on ---------------------


def test_http2_a_refused_upload_is_answered_before_its_body_and_the_connection_goes_on(
    rproxy: Proxy, origins: tuple[Origin, Origin]
) -> None:
    """Answered whole (END_STREAM) before a byte of the body was sent: a refused HTTP/2 body
    was read (and held in memory) in full first. Then the body is dropped as it comes, the
    stream is never reset, and the connection's next request goes to the origin."""
    client = H2Upload(rproxy, f"api.test:{origins[1].port}", AUTH)
    with client.tls:
        stream = client.start("POST", "/up", BIG)
        status, body = client.answer(stream)
        assert status == 413 and b'"reason":"request_too_large"' in body
        assert client.sendbody_pieces(stream, BIG) == BIG
        status, body = client.answer(client.start("GET", "/after", None))
        assert not client.reset(stream)
    assert (status, body) == (200, b"hello from origin\n")
    # Only the GET reached the origin, and no byte of the refused body.
    assert [s.path for s in origins[1].requests] == ["/after"]
    assert origins[1].bytes_received == 0


def test_http2_a_body_past_the_bound_has_its_stream_reset(
    tight: Proxy, origins: tuple[Origin, Origin]
) -> None:
    client = H2Upload(tight, f"api.test:{origins[1].port}", AUTH)
    with client.tls:
        stream = client.start("POST", "/up", 64 * 1024 * 1024)
        assert client.answer(stream)[0] == 413
        sent = client.sendbody_pieces(stream, 64 * 1024 * 1024)
        status, _ = client.answer(client.start("GET", "/after", None))
    assert client.reset(stream) and sent < 32 * 1024 * 1024  # of 64 MiB, seen late: buffers
    assert status == 200  # the connection's other streams go on
    assert [s.path for s in origins[1].requests] == ["/after"]
    assert origins[1].bytes_received == 0
