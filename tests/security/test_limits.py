"""Request heads are bounded while they are read, and idle connections closed.

A head over 64 KiB is refused before its end (never buffered whole), one over 100 fields or with
a target over 8 KiB once it is complete, a head dribbled out slower than the header timeout is
refused at the next byte, and a connection that sends nothing is closed at the idle timeout.
Nothing reaches the origin, and the proxy's memory does not grow with what it refused.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import KEYS, rules_allowing
from tests.harness import Origin, Proxy, ProxyFactory
from tests.security.rawclient import (
    RawResponse,
    h2_get,
    proxy_auth,
    read_response,
    request_bytes,
)

AUTH = ("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"]))


@pytest.fixture(scope="module")
def lproxy(proxy_with: ProxyFactory, origin_http: Origin) -> Iterator[Proxy]:
    with proxy_with(rules_allowing("api.test", origin_http.port), name="limits",
                    options=["--header-timeout", "1.5", "--idle-timeout", "2"],
                    clean_stderr=True) as p:
        yield p


@pytest.fixture()
def origin(origin_http: Origin) -> Origin:
    origin_http.reset()
    return origin_http


def head(origin: Origin, *fields: tuple[str, str], target: str = "/") -> bytes:
    authority = f"api.test:{origin.port}"
    return request_bytes("GET", f"http://{authority}{target}",
                         [("Host", authority), AUTH, *fields])


def refused(sock: socket.socket) -> RawResponse:
    response = read_response(sock, timeout=10)
    assert sock.recv(1) == b""  # and closed
    return response


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_an_endless_header_is_refused_before_its_end(lproxy: Proxy, origin: Origin) -> None:
    before = rss_kib(lproxy.process.pid)
    # What the client's kernel accepts is not what the proxy read: a send buffer left to grow
    # (to tcp_wmem's 4 MiB) holds megabytes the proxy never saw while a loaded machine
    # schedules it late. A small one leaves `sent` to what the proxy took in.
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", lproxy.port))
        start = head(origin).removesuffix(b"\r\n\r\n") + b"\r\nX-Flood: "
        sock.sendall(start)
        sent = len(start)
        chunk = b"a" * 16384
        try:
            while sent < 16 * 1024 * 1024:  # the proxy must stop reading long before this
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        else:
            raise AssertionError("the proxy read 16 MiB of one header")
    assert sent < 4 * 1024 * 1024
    assert rss_kib(lproxy.process.pid) - before < 32 * 1024
    assert origin.untouched()


def test_a_large_head_gets_431(lproxy: Proxy, origin: Origin) -> None:
    with socket.create_connection(("127.0.0.1", lproxy.port), timeout=10) as sock:
        sock.sendall(head(origin, ("X-Big", "b" * 70_000)))
        response = refused(sock)
    assert (response.status, response.reason) == (431, "headers_too_large")
    assert origin.untouched()


@pytest.mark.parametrize(("fields", "status"), [(97, 200), (101, 431)])
def test_at_most_100_fields(lproxy: Proxy, origin: Origin, fields: int, status: int) -> None:
    # Host and Proxy-Authorization are two more.
    extra = [(f"X-F{i}", "v") for i in range(fields - 2)]
    with socket.create_connection(("127.0.0.1", lproxy.port), timeout=10) as sock:
        sock.sendall(head(origin, *extra, ("Connection", "close")))
        response = read_response(sock, timeout=10)
    assert response.status == status
    if status != 200:  # the proxy's refusal (a Python origin refuses 101 fields itself, too)
        assert response.reason == "headers_too_large"
        assert origin.untouched()
    else:
        assert len(origin.requests) == 1


@pytest.mark.parametrize(("length", "status"), [(8000, 200), (9000, 414)])
def test_a_long_target_gets_414(lproxy: Proxy, origin: Origin, length: int, status: int) -> None:
    with socket.create_connection(("127.0.0.1", lproxy.port), timeout=10) as sock:
        sock.sendall(head(origin, ("Connection", "close"), target="/" + "p" * length))
        response = read_response(sock, timeout=10)
    assert response.status == status
    if status != 200:
        assert response.reason == "uri_too_long"
        assert origin.untouched()
    else:
        assert len(origin.requests) == 1


def test_a_head_dribbled_out_gets_408(lproxy: Proxy, origin: Origin) -> None:
    lines = head(origin).split(b"\r\n")
    with socket.create_connection(("127.0.0.1", lproxy.port), timeout=10) as sock:
        started = time.monotonic()
        for line in lines[:-2]:  # a line every 0.6 s, never the blank one
            sock.sendall(line + b"\r\n")
            time.sleep(0.6)
            if time.monotonic() - started > 2.5:
                break
        sock.sendall(b"X-More: 1\r\n")
        response = refused(sock)
    assert (response.status, response.reason) == (408, "request_timeout")
    assert origin.untouched()


def test_a_silent_connection_is_closed_at_the_idle_timeout(
    lproxy: Proxy, origin: Origin
) -> None:
    with socket.create_connection(("127.0.0.1", lproxy.port), timeout=10) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b""
        assert 1.5 < time.monotonic() - started < 6
    assert origin.untouched()


def test_keep_alive_heads_are_each_timed_from_their_first_byte(
    lproxy: Proxy, origin: Origin
) -> None:
    """A connection that waits between requests (within the idle timeout) is not a slow head."""
    with socket.create_connection(("127.0.0.1", lproxy.port), timeout=10) as sock:
        for _ in range(2):
            sock.sendall(head(origin))
            assert read_response(sock, timeout=10).status == 200
            time.sleep(1.7)  # longer than the header timeout, shorter than the idle one
    assert len(origin.requests) == 2


# --- HTTP/2: the same bounds per stream ------------------------------------------------------

@pytest.mark.parametrize(("label", "path", "extra", "status"), [
    ("a target over 8 KiB", "/ok/" + "p" * 9000, [], 414),
    ("more than 100 fields", "/ok/x", [(f"x-f{i}", "v") for i in range(120)], 431),
])
def test_http2_streams_get_the_head_bounds(
    proxy: Proxy, origin_https: Origin, label: str, path: str,
    extra: list[tuple[str, str]], status: int,
) -> None:
    target = f"limited.test:{origin_https.port}"
    origin_https.reset()
    r = h2_get(proxy.port, target, ("bot-1", KEYS["bot-1"]), proxy.ca, path, extra)
    assert r.status == status, (label, r.body[:200])
    assert r.json()["reason"] in ("uri_too_long", "headers_too_large")
    assert not origin_https.requests
