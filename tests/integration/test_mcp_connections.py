"""`sealgate mcp serve`'s connections bounded per caller and in time (mcp/sdk/conngate.py).
Review found that one caller holding a few hundred idle connections (or half-sent heads) made
every other caller's requests 503 for as long as it held them: uvicorn timed nothing before a
complete head and counted everyone against one limit. Real server, raw sockets on loopback;
a caller is its address (127.0.0.1 the flooder, 127.0.0.2 everyone else)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.mcp.options import HEAD_SECONDS, PER_PEER
from tests.conftest import KEYS
from tests.dnsstub import StubDNS
from tests.harness import OriginCA, key_digest
from tests.mcpkit import McpServer, basic, needs_mcp_venv, rpc, rpc_headers

pytestmark = needs_mcp_venv()

RULES = f"""
version: 1
policies:
  ci:
    allow: []
    tools:
      - name: ping
        description: A tool that is never called here.
        method: GET
        url: https://api.test:443/ping
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, dns: StubDNS, test_ca: OriginCA
           ) -> Iterator[McpServer]:
    started = McpServer(Path(tmp_path_factory.mktemp("mcp-conns")), RULES, resolver=dns.address,
                        upstream_ca=test_ca.path)
    yield started
    started.stop()
    assert "Traceback" not in started.stderr()


def _list(server: McpServer, source: str) -> int:
    """A tools/list from `source`: its status."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10,
                                      source_address=(source, 0))
    try:
        # A refused connection is answered and closed unread: http.client sends the head and the
        # body apart, and under load the body can meet the reset the head caused. The answer
        # came first and is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.request("POST", "/mcp", json.dumps(rpc("tools/list")), {
                "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                "Authorization": basic("bot-1", KEYS["bot-1"]), **rpc_headers("tools/list")})
        return conn.getresponse().status
    finally:
        conn.close()


def _idle(server: McpServer, source: str, n: int) -> list[socket.socket]:
    held = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10,
                                        source_address=(source, 0))
        held.append(sock)
    return held


def _answer(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before it closed the connection (bounded; b"" if it did not)."""
    sock.settimeout(0.2)
    got = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        if not chunk:
            return got or b"<closed>"
        got += chunk
    return got


def test_one_address_cannot_take_the_others_room(server: McpServer) -> None:
    held = _idle(server, "127.0.0.1", PER_PEER + 8)
    try:
        # Past the cap: answered 503 and closed at once, never read.
        # Bounded generously: each returns as soon as its connection is closed, and under load
        # the server may accept late (the refusal is written the moment it accepts).
        refused = [_answer(sock, 15) for sock in held[PER_PEER:]]
        assert all(r.startswith(b"HTTP/1.1 503") and b"too many connections" in r
                   for r in refused), refused[:2]
        assert _list(server, "127.0.0.2") == 200  # another caller is served meanwhile
        assert _list(server, "127.0.0.1") == 503  # the flooder's own room is full
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while _list(server, "127.0.0.1") != 200:  # its room back once it let go
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_head_never_finished_is_cut_at_its_deadline(server: McpServer) -> None:
    """Half a head, then a byte now and then: closed HEAD_SECONDS after the connection
    began, however it trickles; an idle one likewise."""
    trickle, silent = _idle(server, "127.0.0.3", 2)
    started = time.monotonic()
    try:
        trickle.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\n")
        closed: dict[str, float] = {}
        deadline = started + HEAD_SECONDS + 10
        for sock in (trickle, silent):
            sock.settimeout(0.5)
        while len(closed) < 2 and time.monotonic() < deadline:
            for sock, name in ((trickle, "trickle"), (silent, "silent")):
                if name in closed:
                    continue
                try:
                    if name == "trickle":
                        sock.sendall(b"X")
                    if sock.recv(4096) == b"":
                        closed[name] = time.monotonic() - started
                except TimeoutError:
                    pass
                except OSError:  # reset: closed too
                    closed[name] = time.monotonic() - started
    finally:
        trickle.close()
        silent.close()
    assert set(closed) == {"trickle", "silent"}, closed
    assert all(HEAD_SECONDS - 1 < seconds < HEAD_SECONDS + 5 for seconds in closed.values()), \
        closed
