"""Servers the port tests start inside a sandbox (standard library only: the sandbox's python3 is
the host's), and what they write down of what reached them, so a test checks at the server.

Port A answers HTTP (`plain <request line>`, with headers that reach past its own path on a
browser's origin, and a Referrer-Policy that would send its URL anywhere; `/short` a body cut
short of its length) and
accepts a WebSocket, echoing its messages;
port A+1 echoes raw TCP and, at the client's end of sending, says how many bytes it got and
closes. Every request line and every frame goes to /workspace/seen.log as it arrives.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

import aiohttp

from sealgate.reasons import Reason
from sealgate.sandbox.clients.aclient import AsyncSandbox
from sealgate.sandbox.clients.client import DaemonError, Sandbox

SERVERS = r"""
import base64, hashlib, socketserver, sys, threading
SEEN = open("/workspace/seen.log", "a", buffering=1)
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

class Web(socketserver.StreamRequestHandler):
    def handle(self):
        line = self.rfile.readline(65536).decode("latin-1").rstrip("\r\n")
        SEEN.write(line + "\n")
        headers = {}
        while (h := self.rfile.readline(65536).decode("latin-1").rstrip("\r\n")):
            name, _, value = h.partition(":")
            headers[name.strip().lower()] = value.strip()
        SEEN.write("headers " + " ".join(sorted(headers)) + "\n")
        if line.startswith("GET /short "):  # announces more than it sends, then closes
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
            return
        if headers.get("upgrade", "").lower() != "websocket":
            body = ("plain " + line).encode()
            # What a page may set for its whole origin, which a signed URL shares with every
            # sandbox's: the daemon must not pass these on to a browser.
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n"
                             b"x-from: the-sandbox\r\nservice-worker-allowed: /\r\n"
                             b"clear-site-data: \"*\"\r\nreferrer-policy: unsafe-url\r\n"
                             b"\r\n%s" % (len(body), body))
            return
        accept = base64.b64encode(hashlib.sha1(
            (headers["sec-websocket-key"] + GUID).encode()).digest()).decode()
        self.wfile.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                          "Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept +
                          "\r\nx-from: the-sandbox\r\n\r\n").encode())
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            n = head[1] & 127
            if n >= 126:
                n = int.from_bytes(self.rfile.read(2 if n == 126 else 8), "big")
            mask = self.rfile.read(4) if head[1] & 128 else bytes(4)
            data = self.rfile.read(n)
            pad = (mask * (n // 4 + 1))[:n]
            data = (int.from_bytes(data, "big") ^ int.from_bytes(pad, "big")).to_bytes(n, "big")
            op = head[0] & 15
            SEEN.write(f"frame {op} {n}\n")
            size = bytes([n]) if n < 126 else b"\x7e" + n.to_bytes(2, "big") if n < 65536 \
                else b"\x7f" + n.to_bytes(8, "big")
            self.wfile.write(bytes([0x80 | op]) + size + data)
            self.wfile.flush()
            if op == 8:
                return

class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        got = 0
        while (data := self.request.recv(65536)):
            got += len(data)
            self.request.sendall(data)
        SEEN.write(f"tcp end {got}\n")
        self.request.sendall(b"bye %d" % got)

socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.daemon_threads = True
port = int(sys.argv[1])
echo = socketserver.ThreadingTCPServer(("0.0.0.0", port + 1), Echo)
threading.Thread(target=echo.serve_forever, daemon=True).start()
socketserver.ThreadingTCPServer(("0.0.0.0", port), Web).serve_forever()
"""


def serve(sb: Sandbox, port: int, ready: Callable[[], object]) -> None:
    """The servers started in `sb` on `port` and `port + 1`; back once `ready()` got through
    (port_unreachable until then), and the log of what arrived emptied of that."""
    sb.start(["python3", "-c", SERVERS, str(port)])
    deadline = time.monotonic() + 30
    while True:
        try:
            ready()
            break
        except DaemonError as exc:
            assert exc.reason is Reason.PORT_UNREACHABLE, exc
            assert time.monotonic() < deadline, exc
            time.sleep(0.1)
    sb.run(["sh", "-c", ": > /workspace/seen.log"])


def seen(sb: Sandbox, at_least: int = 0) -> list[str]:
    """What reached the servers so far, a line each; waited for (at most 10 s) until there
    are `at_least` lines, as a server writes a connection's end after the daemon closed it."""
    deadline = time.monotonic() + 10
    while len(lines := sb.read("seen.log").decode().splitlines()) < at_least \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    return lines


@contextlib.asynccontextmanager
async def async_sandbox(sb: Sandbox) -> AsyncIterator[AsyncSandbox]:
    """The same sandbox through the asyncio client (left alive: the sync one deletes it)."""
    where = sb.client.daemon
    http = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=where))
    try:
        yield AsyncSandbox(http, "http://sandboxd", {}, sb.info, where)
    finally:
        await http.close()
