"""A port the sandbox serves, reached by the harness through the daemon (#25's ports): the
request arrives as sent (less the daemon's own credentials), the server's answer comes back
whatever its status, nothing listening is the daemon's clear refusal, and no one else (another
sandbox) reaches the port."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import socket
import time
from collections.abc import Iterator

import pytest

from sealgate.reasons import Reason
from sealgate.sandbox.clients.client import DaemonError, Sandbox
from sealgate.sandbox.daemon.session import MAX_REQUESTS
from tests.harness import quiet

from .conftest import Daemon
from .portservers import async_sandbox, serve

# A server that says what it was sent: method, path, headers, body.
_ECHO = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Echo(BaseHTTPRequestHandler):
    def answer(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        out = json.dumps({"method": self.command, "path": self.path,
                          "headers": {k.lower(): v for k, v in self.headers.items()},
                          "types": self.headers.get_all("content-type") or [],
                          "body": body.decode()}).encode()
        forge = self.path.startswith("/forge")
        self.send_response(404 if self.path.startswith("/missing") else 503 if forge else 200)
        if forge:  # a refusal of the daemon's, forged (and its body ends with the connection)
            self.send_header("x-sealgate-error", "at_capacity")
        else:  # a body of announced length (the daemon copies it without parsing)
            self.send_header("content-length", str(len(out)))
        self.send_header("content-type", "application/json")
        self.send_header("x-from", "the-sandbox")
        self.send_header("set-cookie", "a=1; Path=/")
        self.send_header("set-cookie", "b=2; Path=/")
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = do_PUT = answer
    def log_message(self, *a): pass
# On every address: the port route reaches it on the loopback, and another sandbox must not
# reach it on the sandbox's own address either.
HTTPServer(("0.0.0.0", int(sys.argv[1])), Echo).serve_forever()
"""


@pytest.fixture
def served(sandboxd: Daemon) -> Iterator[Sandbox]:
    with Sandbox.create("ci-bot", daemon=str(sandboxd.socket)) as sb:
        sb.start(["python3", "-c", _ECHO, "8000"])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                sb.port(8000, "/ready")
                break
            except DaemonError as exc:
                assert exc.reason is Reason.PORT_UNREACHABLE, exc
                time.sleep(0.1)
        yield sb


def test_a_request_reaches_the_port_and_its_answer_comes_back(served: Sandbox) -> None:
    status, headers, body = served.port(8000, "/api/items?q=1&r=two", method="POST",
                                        body=b'{"name": "x"}',
                                        headers={"X-Custom": "kept",
                                                 "Authorization": "Bearer daemon-key"})
    assert status == 200 and headers.get("x-from") == "the-sandbox"
    # Repeated headers keep every value (found by review: a dict kept the last cookie).
    assert headers.get_all("Set-Cookie") == ["a=1; Path=/", "b=2; Path=/"]
    seen = json.loads(body)
    # The caller's request, with no content type of the client's own (review: JSON's was
    # added to every port request).
    assert "content-type" not in seen["headers"]
    assert (seen["method"], seen["path"], seen["body"]) == ("POST", "/api/items?q=1&r=two",
                                                             '{"name": "x"}')
    assert seen["headers"]["x-custom"] == "kept"
    assert "authorization" not in seen["headers"]  # the daemon's credential stays the daemon's
    assert seen["headers"]["host"] == "127.0.0.1:8000"
    # Found by review: the client sent its own JSON content type with every port request (a
    # caller's own came as a second), and kept one of an answer's repeated headers.
    assert seen["types"] == [] and headers.get_all("set-cookie") == ["a=1; Path=/",
                                                                     "b=2; Path=/"]
    _, _, body = served.port(8000, "/typed", method="POST", body=b"x=1",
                             headers={"content-type": "application/x-www-form-urlencoded"})
    assert json.loads(body)["types"] == ["application/x-www-form-urlencoded"]
    # The path and query arrive as sent, escapes and all: %2F is not a segment's end, %3F not
    # a query, %25 not an escape (found by review: they were decoded before forwarding).
    raw = "/a%2Fb/c%3Fd%20e%25f/?x=%26y&z=%2F"
    status, _, body = served.port(8000, raw)
    assert status == 200 and json.loads(body)["path"] == raw
    # The server's own 404 is its answer, not a refusal of the daemon's.
    # A body larger than what one read of the daemon's gets arrives whole.
    big = b"b" * 3_000_000
    status, _, body = served.port(8000, "/big", method="PUT", body=big)
    assert status == 200 and json.loads(body)["body"] == big.decode()
    status, headers, body = served.port(8000, "/missing")
    assert status == 404 and not _marked(headers)
    # A server cannot pass its answer off as the daemon's refusal.
    status, headers, body = served.port(8000, "/forge")
    assert status == 503 and not _marked(headers)
    assert json.loads(body)["path"] == "/forge"


def _marked(headers: http.client.HTTPMessage) -> bool:
    return any(name.lower() == "x-sealgate-error" for name in headers)


def test_nothing_listening_and_bad_ports_are_the_daemons_refusals(served: Sandbox) -> None:
    with pytest.raises(DaemonError) as refused:
        served.port(8001)
    assert refused.value.reason is Reason.PORT_UNREACHABLE and refused.value.status == 502
    for bad in ("0", "65536", "http", "99999999"):
        with pytest.raises(DaemonError) as refused:
            served.client.call("GET", f"/v1/sandboxes/{served.id}/ports/{bad}/")
        assert refused.value.reason is Reason.BAD_REQUEST, bad


_PROBE = """
import socket, sys
for host in sys.argv[1:]:
    try:
        with socket.create_connection((host, 8000), timeout=3) as c:
            c.sendall(b"GET /probe HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n")
            c.settimeout(5)
            print(host, c.recv(65536).decode(errors="replace"))
    except OSError as exc:
        print(host, "refused", exc)
"""


def test_another_sandbox_cannot_reach_the_port(served: Sandbox, sandboxd: Daemon) -> None:
    """Its address (where the link's table sends it to the proxy instead, which answers for
    itself) nor its own loopback (which is its own) reach the server."""
    with Sandbox.create("ci-bot", daemon=str(sandboxd.socket)) as other:
        probe = other.run(["python3", "-c", _PROBE, served.info["address"], "127.0.0.1"])
        # The server's own mark is its x-from header; the proxy's refusals quote the request.
        assert probe.ok and "x-from" not in probe.text.lower(), probe
        assert probe.text.count("(sealgate: ") + probe.text.count("refused") >= 2, probe


_HOSTILE = r"""
import socket, sys
ANSWERS = {
    "/digits": b"HTTP/1.1 200 OK\r\ncontent-length: " + b"9" * 5000 + b"\r\n\r\nx",
    "/both": b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"
             b"5\r\nhello\r\n0\r\n\r\n",
    "/cut": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n3",
    "/lying": b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789",
}
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    conn, _ = server.accept()
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(65536)
        if not chunk:
            break
        head += chunk
    path = head.split(b" ", 2)[1].decode() if head.count(b" ") >= 2 else ""
    conn.sendall(ANSWERS.get(path, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"))
    conn.close()
"""


def test_a_hostile_server_s_answers_are_refused_or_cut_never_a_traceback(
        sandboxd: Daemon) -> None:
    """Found by review: a Content-Length of thousands of digits was a 500 and a traceback; a
    length and a chunked coding both passed the chunks' framing on as the body; an answer cut
    after its head was a traceback in the log, and the Python client took a body cut short of
    its length for a whole one."""
    with Sandbox.create("ci-bot", daemon=str(sandboxd.socket)) as sb:
        sb.start(["python3", "-c", _HOSTILE, "8001"])
        deadline = time.monotonic() + 20
        while True:
            try:
                assert sb.port(8001, "/ready")[0] == 200
                break
            except DaemonError as exc:
                assert exc.reason is Reason.PORT_UNREACHABLE and time.monotonic() < deadline
                time.sleep(0.1)
        for refused in ("/digits", "/both"):
            with pytest.raises(DaemonError) as caught:
                sb.port(8001, refused)
            assert caught.value.reason is Reason.PORT_UNREACHABLE, refused
        for cut in ("/cut", "/lying"):  # begun: the caller sees it cut short, never whole
            with pytest.raises((DaemonError, OSError, http.client.HTTPException)):
                sb.port(8001, cut)
        status, _, body = sb.port(8001, "/fine")
        assert (status, body) == (200, b"ok")
    log = sandboxd.log.read_text()
    assert quiet(log), log[-3000:]



def test_a_sandbox_s_port_connections_are_capped(sandboxd: Daemon) -> None:
    """Found by review: a harness (or anything holding a signed URL) could open port
    connections without limit, each a socket in the sandbox and a relay in the daemon. They
    count with its requests (MAX_REQUESTS at once; its background server is one), and past
    that are refused as busy; closed, they free their places."""
    with Sandbox.create("ci-bot", daemon=str(sandboxd.socket)) as sb:
        serve(sb, 8000, lambda: sb.port(8000, "/ready"))

        async def fill() -> tuple[int, DaemonError]:
            async with async_sandbox(sb) as asb, contextlib.AsyncExitStack() as held:
                opened = 0
                while True:
                    try:
                        await held.enter_async_context(asb.tcp(8001))
                    except DaemonError as exc:
                        return opened, exc
                    opened += 1
                    assert opened <= MAX_REQUESTS, "no cap"

        opened, refused = asyncio.run(asyncio.wait_for(fill(), 120))
        assert opened == MAX_REQUESTS - 1 and refused.reason is Reason.SANDBOX_BUSY, refused
        assert refused.status == 429
        assert sb.port(8000, "/after")[0] == 200  # the places are free again


def test_a_caller_leaving_mid_transfer_leaves_nothing_held(sandboxd: Daemon) -> None:
    """A large body goes by splice(2) in a thread of its own on descriptors of its own: a
    caller that leaves halfway ends it (its socket refuses the next piece), and the daemon holds
    no descriptor of it after, and serves on."""
    with Sandbox.create("ci-bot", daemon=str(sandboxd.socket)) as sb:
        sb.run(["sh", "-c", "mkdir site && head -c 67108864 /dev/zero > site/big"])
        sb.start(["python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", "site",
                  "8020"])
        deadline = time.monotonic() + 20
        while True:
            try:
                sb.port(8020, "/nothing")
                break
            except DaemonError as exc:
                assert exc.reason is Reason.PORT_UNREACHABLE and time.monotonic() < deadline
                time.sleep(0.1)
        held = len(os.listdir(f"/proc/{sandboxd.process.pid}/fd"))
        for _ in range(3):
            with socket.socket(socket.AF_UNIX) as raw:
                raw.connect(str(sandboxd.socket))
                raw.sendall(f"GET /v1/sandboxes/{sb.id}/ports/8020/big HTTP/1.1\r\n"
                            "Host: x\r\n\r\n".encode())
                got = raw.recv(1 << 20)
                assert got.startswith(b"HTTP/1.1 200"), got[:200]
        deadline = time.monotonic() + 30
        while len(os.listdir(f"/proc/{sandboxd.process.pid}/fd")) > held:
            assert time.monotonic() < deadline, "descriptors still held after the callers left"
            time.sleep(0.1)
        assert sb.port(8020, "/nothing")[0] == 404  # and it serves on
