"""Requests the daemon's HTTP parser cannot read, written as raw bytes on its real unix socket
and its TCP listener: each is refused in the API's own shape (`{"error", "detail"}` as JSON,
the reason's status), the connection is closed after it, the daemon logs no traceback for
any of them (nothing a caller sends may put one in its log), and it serves on.

These refusals are made before any handler or middleware runs (aiohttp's protocol answers
them itself), so they are tested here on the wire rather than through a client.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import Proxy, free_port, quiet
from tests.sandboxd.conftest import Daemon, start_daemon

Connect = Callable[[], socket.socket]
# A create reads its body before anything else: a body that cannot be read is what it meets.
CHUNKED_CREATE = (b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")

# What a caller may send that is not HTTP the daemon reads, and the reason it is refused with.
MALFORMED: list[tuple[str, bytes, str]] = [
    ("bad method", b"G@T /v1/health HTTP/1.1\r\nHost: x\r\n\r\n", "bad_request"),
    ("HTTP/9.9", b"GET /v1/health HTTP/9.9\r\nHost: x\r\n\r\n", "bad_request"),
    ("no version", b"GET /v1/health\r\n\r\n", "bad_request"),
    ("8 KiB request line", b"GET /" + b"a" * 8192 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
     "too_large"),
    ("8 KiB header", b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Long: " + b"b" * 8192
     + b"\r\n\r\n", "too_large"),
    ("garbage", b"\x00\x01\x02 not http\r\n\r\n", "bad_request"),
    ("TLS on a plain listener", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),
     "bad_request"),
    ("header without colon", b"GET /v1/health HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n",
     "bad_request"),
    ("negative length", b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
     "bad_request"),
    ("length and chunked", b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "bad_request"),
    ("bad chunk size", CHUNKED_CREATE + b"zz\r\n{}\r\n0\r\n\r\n", "bad_request"),
]


class Refusal:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1]) if lines[0].startswith("HTTP/") else 0
        self.headers = {k.strip().lower(): v.strip() for k, _, v in
                        (line.partition(":") for line in lines[1:])}

    def __repr__(self) -> str:
        return f"Refusal({self.raw[:400]!r})"


def exchange(connect: Connect, data: bytes, *, shut: bool = False) -> bytes:
    """Send `data`, optionally half-close, and read until the daemon closes the connection."""
    with connect() as raw:
        raw.sendall(data)
        if shut:
            raw.shutdown(socket.SHUT_WR)
        return until_closed(raw)


def until_closed(raw: socket.socket) -> bytes:
    """What the daemon sends until it closes the connection (a timeout fails the test)."""
    answer = b""
    while chunk := raw.recv(65536):
        answer += chunk
    return answer


def one_answer(raw: socket.socket) -> bytes:
    """One whole answer with a Content-Length, the connection left open."""
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < int(
            Refusal(answer).headers.get("content-length", "0")):
        chunk = raw.recv(65536)
        assert chunk, f"closed after {answer!r}"
        answer += chunk
    return answer


def refused_as_json(raw: bytes, reason: str) -> None:
    answer = Refusal(raw)
    status = {"bad_request": 400, "too_large": 413}[reason]
    assert answer.status == status, answer
    assert answer.headers.get("content-type", "").startswith("application/json"), answer
    body = json.loads(answer.body)
    assert set(body) == {"error", "detail"} and body["error"] == reason, answer
    assert isinstance(body["detail"], str) and body["detail"], answer


def unix(daemon: Daemon) -> Connect:
    def connect() -> socket.socket:
        raw = socket.socket(socket.AF_UNIX)
        raw.settimeout(10)
        raw.connect(str(daemon.socket))
        return raw
    return connect


@pytest.fixture(scope="module")
def tcp_daemon(dproxy: Proxy, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[Daemon, int]]:
    where: Path = tmp_path_factory.mktemp("sandboxd-tcp")
    key_file = where / "key"
    key_file.write_text(secrets.token_urlsafe(24))
    key_file.chmod(0o600)
    port = free_port()
    daemon = start_daemon(dproxy, where, "--pool", "0", "--no-selftest",
                          "--listen", f"127.0.0.1:{port}", "--key-file", str(key_file))
    yield daemon, port
    daemon.stop()


def tcp(port: int) -> Connect:
    def connect() -> socket.socket:
        return socket.create_connection(("127.0.0.1", port), timeout=10)
    return connect


def each_malformed_request_is_refused_as_json(daemon: Daemon, connect: Connect) -> None:
    logged = len(daemon.log.read_bytes())
    for name, data, reason in MALFORMED:
        try:
            refused_as_json(exchange(connect, data), reason)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    # A bad request after a good one on the same connection (aiohttp logs this case as an
    # error where the first request of a connection is only a debug note).
    with connect() as raw:
        raw.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert one_answer(raw).startswith(b"HTTP/1.1 ")
        raw.sendall(MALFORMED[0][1])
        refused_as_json(until_closed(raw), "bad_request")
    # Requests cut short: no answer is owed, but nothing may be logged for them either.
    for cut in (b"GET /v1/health HTTP/1.1\r\nHost: x\r\n", b"GET /v1/hea",
                b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"sa",
                CHUNKED_CREATE + b"5\r\n{\"arg"):
        assert exchange(connect, cut, shut=True) in (b"", ), cut
    log = daemon.log.read_bytes()[logged:].decode(errors="replace")
    assert quiet(log) and "Error handling request" not in log, log[-4000:]
    assert daemon.client.health()["ready"]


def test_malformed_requests_on_the_unix_socket(sandboxd: Daemon) -> None:
    each_malformed_request_is_refused_as_json(sandboxd, unix(sandboxd))


def test_malformed_requests_on_the_tcp_listener(tcp_daemon: tuple[Daemon, int]) -> None:
    """Refused as on the socket, before the key is asked for: nothing was read to check."""
    daemon, port = tcp_daemon
    each_malformed_request_is_refused_as_json(daemon, tcp(port))
    well_formed = Refusal(exchange(tcp(port), b"GET /v1/health HTTP/1.1\r\nHost: x\r\n"
                                             b"Connection: close\r\n\r\n"))
    assert (well_formed.status, json.loads(well_formed.body)["error"]) == (401, "unauthorized")
