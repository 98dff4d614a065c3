"""Streams through a sandbox's port (#25's ports): a WebSocket through the port route, a raw TCP
stream in a WebSocket's binary messages (`/tcp/{port}`), on every tier that runs here. What
arrived is checked at the server in the sandbox (`portservers`): messages both ways, the close,
a half-close; an oversized or malformed frame closes cleanly with its code; nothing listening
is the daemon's refusal before any upgrade."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time
from collections.abc import Iterator

import aiohttp
import pytest

from sealgate.reasons import Reason
from sealgate.sandbox.clients.client import DaemonError, Sandbox
from tests.harness import quiet
from tests.integration.tiers import TIERS

from .conftest import Daemon, TierDaemons
from .portservers import async_sandbox as _asb
from .portservers import seen, serve

PORT = 8000
MiB = 1 << 20


@pytest.fixture(scope="module", params=TIERS)
def tierd(request: pytest.FixtureRequest, sandboxd: Daemon,
          tier_daemons: TierDaemons) -> tuple[str, Daemon]:
    tier = str(request.param)
    return tier, sandboxd if tier == "bwrap" else tier_daemons.get(tier)


@pytest.fixture
def served(tierd: tuple[str, Daemon]) -> Iterator[Sandbox]:
    _, daemon = tierd
    with Sandbox.create("ci-bot", daemon=str(daemon.socket)) as sb:
        serve(sb, PORT, lambda: sb.port(PORT, "/ready"))
        yield sb




async def _websocket(sb: Sandbox) -> list[object]:
    async with _asb(sb) as asb, asb.websocket(
            PORT, "/chat?room=1", headers={"Authorization": "Bearer daemon-key"}) as ws:
        got: list[object] = []
        await ws.send_str("hello")
        got.append((await ws.receive(timeout=20)).data)
        big = os.urandom(300_000)  # more than one read of the relay's
        await ws.send_bytes(big)
        got.append((await ws.receive(timeout=20)).data == big)
        await ws.close()
        got.append(ws.close_code)
        return got


def test_a_websocket_through_the_port_route(served: Sandbox) -> None:
    assert asyncio.run(asyncio.wait_for(_websocket(served), 60)) == ["hello", True, 1000]
    log = seen(served)
    assert log[0] == "GET /chat?room=1 HTTP/1.1", log
    assert "authorization" not in log[1] and "upgrade" in log[1], log  # the key stays ours
    assert log[2:] == ["frame 1 5", "frame 2 300000", "frame 8 2"], log


async def _tcp(sb: Sandbox) -> list[object]:
    async with _asb(sb) as asb, asb.tcp(PORT + 1) as ws:
        got: list[object] = []
        await ws.send_bytes(b"abc")
        got.append((await ws.receive(timeout=20)).data)
        await ws.send_bytes(b"")  # the end of sending: the server's answer still comes
        answer = b""
        while (message := await ws.receive(timeout=20)).type is aiohttp.WSMsgType.BINARY:
            answer += message.data
        got += [answer, message.type, ws.close_code]
        return got


def test_raw_tcp_over_a_websocket(served: Sandbox) -> None:
    got = asyncio.run(asyncio.wait_for(_tcp(served), 60))
    assert got == [b"abc", b"bye 3", aiohttp.WSMsgType.CLOSE, 1000], got
    assert seen(served, at_least=1) == ["tcp end 3"]


async def _refused(sb: Sandbox, send: bytes | str) -> int | None:
    async with _asb(sb) as asb, asb.tcp(PORT + 1) as ws:
        await (ws.send_bytes(send) if isinstance(send, bytes) else ws.send_str(send))
        message = await ws.receive(timeout=20)
        assert message.type is aiohttp.WSMsgType.CLOSE, message  # nothing was relayed back
        return ws.close_code


def test_a_text_message_closes_the_tcp_route_cleanly(served: Sandbox) -> None:
    code = asyncio.run(asyncio.wait_for(_refused(served, "text"), 60))
    assert code == 1003  # unsupported data: the stream is binary messages
    assert seen(served, at_least=1) == ["tcp end 0"]  # the server saw a connection and not a byte


def _raw_frame(sb: Sandbox, daemon: Daemon, frame: bytes) -> int:
    """The close code the TCP route answers `frame` with, written on the raw connection."""
    with socket.socket(socket.AF_UNIX) as raw:
        raw.settimeout(20)
        raw.connect(str(daemon.socket))
        key = base64.b64encode(os.urandom(16)).decode()
        raw.sendall(f"GET /v1/sandboxes/{sb.id}/tcp/{PORT + 1} HTTP/1.1\r\nHost: x\r\n"
                    f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}"
                    "\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = raw.recv(4096)
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head
        raw.sendall(frame)
        rest = head.split(b"\r\n\r\n", 1)[1]
        while len(rest) < 4:
            chunk = raw.recv(4096)
            assert chunk, rest
            rest += chunk
    assert rest[0] == 0x88, rest  # a close frame, first and only
    return int.from_bytes(rest[2:4], "big")


def test_a_huge_or_malformed_frame_closes_the_tcp_route_cleanly(
        served: Sandbox, tierd: tuple[str, Daemon]) -> None:
    """A binary frame announcing 2**40 bytes (its header alone is enough to refuse it), and a
    frame no client would send (a reserved opcode): each closed with its code, nothing sent
    on to the server."""
    huge = b"\x82\xff" + (1 << 40).to_bytes(8, "big") + os.urandom(4)
    assert _raw_frame(served, tierd[1], huge) == 1009  # message too big
    assert _raw_frame(served, tierd[1], b"\x83\x80" + os.urandom(4)) == 1002  # protocol error
    assert seen(served, at_least=2) == ["tcp end 0", "tcp end 0"]


def test_a_body_cut_short_by_the_server_is_cut_for_the_caller(served: Sandbox) -> None:
    """Fewer bytes than announced, then the server's close: the caller's connection closes too
    (the cut answer at once, not a wait on a keep-alive connection until its time-out), and the
    client says the answer was cut rather than return its first ten bytes as the whole."""
    began = time.monotonic()
    with pytest.raises(DaemonError, match="cut"):
        served.port(PORT, "/short", call_timeout=30)
    assert time.monotonic() - began < 10


# The number of the agent's shims connecting to a port (`guest/portdial.py`), whose argv has
# the op as an argument of its own.
_DIALS = ("import os; print(sum(1 for p in os.listdir('/proc') if p.isdigit() and "
          "b'\\0connect\\0' in open(f'/proc/{p}/cmdline', 'rb').read()))")


def test_a_server_on_the_sandboxs_own_loopback_only(served: Sandbox) -> None:
    """A server bound to 127.0.0.1 is reached on every tier: on the microVM's, that is its
    guest's own loopback, which the daemon reaches through the agent (`guestdial`), and each
    connection's dial inside ends with it."""
    served.write("site/index.html", b"from the loopback")
    served.start(["python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", "site",
                  "8010"])
    deadline = time.monotonic() + 60
    while True:
        try:
            status, _, body = served.port(8010, "/index.html")
            break
        except DaemonError as exc:
            assert exc.reason is Reason.PORT_UNREACHABLE, exc
            assert time.monotonic() < deadline, exc
            time.sleep(0.2)
    assert (status, body) == (200, b"from the loopback")
    for _ in range(3):
        assert served.port(8010, "/index.html")[2] == b"from the loopback"
    deadline = time.monotonic() + 30
    while (left := served.run(["python3", "-c", _DIALS]).text.strip()) != "0":
        assert time.monotonic() < deadline, f"{left} dials still running"
        time.sleep(0.2)


def test_nothing_listening_is_refused_before_any_upgrade(served: Sandbox) -> None:
    async def refusal(port: int) -> DaemonError:
        async with _asb(served) as asb:
            with pytest.raises(DaemonError) as refused:
                async with asb.tcp(port):
                    pass
            return refused.value

    for port, expected in ((PORT + 2, Reason.PORT_UNREACHABLE), (0, Reason.BAD_REQUEST)):
        refused = asyncio.run(asyncio.wait_for(refusal(port), 60))
        assert refused.reason is expected, (port, refused)


# Accepts a WebSocket, never reads from it, and after a while ends its own sending: the
# daemon's relay ends with bytes for it still waiting to be written.
_DEAF_WS = r"""
import base64, hashlib, re, socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, inherited
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
conn, _ = server.accept()
head = b""
while b"\r\n\r\n" not in head:
    head += conn.recv(4096)
key = re.search(rb"(?i)sec-websocket-key: *(\S+)", head).group(1)
accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
             b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
time.sleep(float(sys.argv[2]))
conn.shutdown(socket.SHUT_WR)
time.sleep(600)
"""


def test_a_relay_that_ends_with_bytes_unwritten_leaves_no_stale_descriptor(
        served: Sandbox, tierd: tuple[str, Daemon]) -> None:
    """Found by review: the port route closed its socket to the server after handing it to
    the relay's streams, whose transport, still holding bytes for a server that did not read,
    went on watching that descriptor's number, which the next connection took. What follows
    such a relay works, and nothing is a traceback in the log."""
    served.start(["python3", "-c", _DEAF_WS, str(PORT + 5), "3"])
    time.sleep(1)

    async def flood() -> None:
        async with _asb(served) as asb, asb.websocket(PORT + 5, "/",
                                                      call_timeout=20) as ws:
            async def send() -> None:
                for _ in range(32):
                    await ws.send_bytes(os.urandom(MiB))

            sending = asyncio.ensure_future(send())
            await ws.receive(timeout=20)  # the server's end: the relay closes
            sending.cancel()

    asyncio.run(asyncio.wait_for(flood(), 30))
    for attempt in range(20):
        status, _, body = served.port(PORT, f"/after/{attempt}")
        assert (status, body) == (200, f"plain GET /after/{attempt} HTTP/1.1".encode())
        assert asyncio.run(asyncio.wait_for(_tcp(served), 60))[1] == b"bye 3"
    assert quiet(tierd[1].log.read_text())
