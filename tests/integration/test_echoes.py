"""A credential the upstream echoes is masked wherever it comes back: response headers,
trailers, server-sent events (without holding events back), WebSocket messages.

The origin (tests/echoorigin.py) echoes the injected Authorization value; each test checks that
the mask arrived where the echo was (so the echo happened and the test can fail) and that the
secret is nowhere in what the client read.
"""

from __future__ import annotations

import re
import ssl
import statistics
import time
from collections.abc import Iterator

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Message,
    Ping,
    Pong,
    Request,
    TextMessage,
)
from wsproto.extensions import PerMessageDeflate

from tests.dnsstub import StubDNS
from tests.echoorigin import EchoOrigin
from tests.harness import OriginCA, Proxy, ProxyFactory, key_digest
from tests.security.rawclient import h2_through_tunnel, open_tunnel, proxy_auth, read_response

SECRET = "sk-echo-canary-5e4d3c2b1a09"
KEY = "echo-1-key"
MASK = b"[REDACTED]"


@pytest.fixture(scope="module")
def origin(test_ca: OriginCA) -> Iterator[EchoOrigin]:
    server = EchoOrigin(test_ca.issue("echo.test"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def eproxy(proxy_with: ProxyFactory, origin: EchoOrigin, dns: StubDNS) -> Iterator[Proxy]:
    dns.set("echo.test", "A 127.0.0.1")
    rules = f"""
version: 1
policies:
  echo:
    allow:
      - host: echo.test
        ports: [{origin.port}]
        inject:
          - secret: file:echo_key
            as: bearer
    allow_networks: [127.0.0.1/32]
sandboxes:
  echo-1: {{policy: echo, key_sha256: "{key_digest(KEY)}"}}
"""
    with proxy_with(rules, name="echo", secrets={"echo_key": SECRET},
                    canaries=(SECRET,)) as proxy:
        yield proxy


def connect(proxy: Proxy, origin: EchoOrigin) -> ssl.SSLSocket:
    sock, response = open_tunnel(
        proxy.port, f"echo.test:{origin.port}",
        [("Proxy-Authorization", proxy_auth("echo-1", KEY))],
    )
    assert response.status == 200
    context = ssl.create_default_context(cafile=str(proxy.ca))
    context.set_alpn_protocols(["http/1.1"])
    return context.wrap_socket(sock, server_hostname="echo.test")


def get(sock: ssl.SSLSocket, path: str, *headers: str) -> None:
    lines = [f"GET {path} HTTP/1.1", "Host: echo.test", *headers]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())


def test_an_echo_in_response_headers_is_masked(eproxy: Proxy, origin: EchoOrigin) -> None:
    with connect(eproxy, origin) as sock:
        get(sock, "/headers")
        response = read_response(sock)
    assert response.status == 200
    assert SECRET not in str(response.headers)
    assert MASK in response.headers["x-echo"].encode()
    assert response.headers["www-authenticate"].startswith("Bearer [REDACTED]")


def test_an_echo_in_the_reason_phrase_or_a_header_name_does_not_reach_the_client(
    eproxy: Proxy, origin: EchoOrigin
) -> None:
    with connect(eproxy, origin) as sock:
        get(sock, "/status")
        sock.settimeout(5)
        raw = b""
        while b"\r\n\r\n" not in raw and len(raw) < 65536:
            if not (chunk := sock.recv(65536)):
                break
            raw += chunk
    assert raw.startswith(b"HTTP/1.1 401 Bearer [REDACTED]"), raw
    assert SECRET.encode() not in raw
    assert b"x-kept: yes" in raw.lower()


def test_an_echo_in_response_trailers_is_masked(eproxy: Proxy, origin: EchoOrigin) -> None:
    """Over HTTP/2 (mitmproxy implements HTTP/1 trailers not at all: such a response breaks
    off, which leaks nothing): the trailer is scrubbed like a header."""
    response, protocol = h2_through_tunnel(
        eproxy.port, f"echo.test:{origin.port}", ("echo-1", KEY), eproxy.ca,
        [(":method", "GET"), (":scheme", "https"), (":authority", f"echo.test:{origin.port}"),
         (":path", "/trailers")],
    )
    assert (protocol, response.status, response.body) == ("h2", 200, b"hello")
    assert response.headers["x-echo"].startswith("Bearer [REDACTED]")
    assert response.trailers["x-echo"].startswith("Bearer [REDACTED]")
    assert SECRET not in str(response)


def test_an_empty_data_frame_does_not_flush_a_held_secret(
    eproxy: Proxy, origin: EchoOrigin
) -> None:
    """An empty HTTP/2 DATA frame between two halves of an echoed secret (streamed: no length)."""
    response, protocol = h2_through_tunnel(
        eproxy.port, f"echo.test:{origin.port}", ("echo-1", KEY), eproxy.ca,
        [(":method", "GET"), (":scheme", "https"), (":authority", f"echo.test:{origin.port}"),
         (":path", "/split")],
    )
    assert (protocol, response.status) == ("h2", 200)
    assert response.body == b"x " + (MASK * 3)[: len(SECRET)] + b" y", response.body


def test_server_sent_events_are_not_held_back(eproxy: Proxy, origin: EchoOrigin) -> None:
    """Each event reaches the client as soon as it was written (the scrubber once held the
    last secret-length bytes of every chunk, so each event arrived with the next one), and the
    event that echoes the credential arrives masked."""
    seen: dict[int, float] = {}
    data = b""
    with connect(eproxy, origin) as sock:
        get(sock, "/sse")
        deadline = time.monotonic() + 10
        while len(seen) < origin.events and time.monotonic() < deadline:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            chunk = sock.recv(65536)
            if not chunk:
                break
            now = time.monotonic()
            data += chunk
            for number in map(int, re.findall(rb"data: event-(\d+)[^\n]*\n\n", data)):
                seen.setdefault(number, now)
    assert sorted(seen) == list(range(origin.events)), data
    assert SECRET.encode() not in data
    assert b"data: event-2 Bearer [REDACTED]" in data
    delays = [seen[n] - origin.written[n] for n in seen]
    # The target is under 20 ms; held back, every delay was the 300 ms event interval.
    assert statistics.median(delays) < 0.02, delays
    assert max(delays) < 0.15, delays


@pytest.mark.parametrize("deflate", [False, True], ids=["plain", "permessage-deflate"])
def test_an_echo_in_websocket_messages_is_masked(
    eproxy: Proxy, origin: EchoOrigin, deflate: bool
) -> None:
    """Text and binary messages, and one whose frames split the secret: each server message
    reaches the client masked, framing intact."""
    ws = WSConnection(ConnectionType.CLIENT)
    extensions = [PerMessageDeflate()] if deflate else []
    messages: list[bytes] = []
    kinds: list[str] = []
    control: list[bytes] = []  # ping and pong payloads, then the close reason
    parts: list[bytes] = []
    accepted = None
    with connect(eproxy, origin) as sock:
        sock.sendall(ws.send(Request(host="echo.test", target="/ws", extensions=extensions)))
        deadline = time.monotonic() + 5
        closed = False
        while not closed and time.monotonic() < deadline:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            data = sock.recv(65536)
            if not data:
                break
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    accepted = event
                elif isinstance(event, Message):
                    parts.append(
                        event.data.encode() if isinstance(event, TextMessage) else event.data
                    )
                    if event.message_finished:
                        kinds.append(type(event).__name__)
                        messages.append(b"".join(parts))
                        parts.clear()
                elif isinstance(event, Ping | Pong):
                    control.append(bytes(event.payload))
                elif isinstance(event, CloseConnection):
                    control.append((event.reason or "").encode())
                    closed = True
    assert accepted is not None
    assert bool(accepted.extensions) == deflate
    assert len(messages) == 4, messages
    assert not any(SECRET.encode() in m for m in messages), messages
    assert messages[0].startswith(b"you sent Bearer [REDACTED]")
    assert MASK in messages[1] and messages[1][:2] == b"\x00\x01"
    assert messages[2].startswith(b"split [REDACTED]") and messages[2].endswith(b" end")
    assert len(messages[2]) == len(f"split {SECRET} end")
    assert messages[3] == b"bye"
    assert kinds == ["TextMessage", "BytesMessage", "TextMessage", "TextMessage"]
    # Control frames too: relayed by mitmproxy without a hook, masked as they go.
    masked = (MASK * 3)[: len(SECRET)]
    assert control == [b"ping " + masked, b"pong " + masked, b"done " + masked], control
