"""Connection caps: per source address and per worker, applied as a connection is accepted.

Over a cap the connection is closed before any protocol is spoken (nothing to parse, no TLS),
the connections already open keep working, a closed one frees its place, and the refusals are
counted in one audit line per reason per second, not one per connection.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from tests.conftest import KEYS, rules_allowing
from tests.harness import Origin, Proxy, ProxyFactory
from tests.security.rawclient import proxy_auth, read_response, request_bytes

PER_SOURCE, TOTAL = 5, 8


@pytest.fixture()
def cproxy(proxy_with: ProxyFactory, origin_http: Origin) -> Iterator[Proxy]:
    with proxy_with(rules_allowing("api.test", origin_http.port), name="caps",
                    options=["--max-connections-per-source", str(PER_SOURCE),
                             "--max-connections", str(TOTAL)]) as p:
        yield p


def dial(proxy: Proxy, source: str) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(5)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", proxy.port))
    return sock


def closed_at_once(sock: socket.socket) -> bool:
    """The proxy closed it without a byte (it sent nothing: nothing was asked)."""
    sock.settimeout(2)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return False


def served(proxy: Proxy, origin: Origin, sock: socket.socket) -> int:
    authority = f"api.test:{origin.port}"
    sock.sendall(request_bytes("GET", f"http://{authority}/cap", [
        ("Host", authority), ("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"])),
    ]))
    return read_response(sock).status


def test_one_source_holds_at_most_its_cap(cproxy: Proxy, origin_http: Origin) -> None:
    origin_http.reset()
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(dial(cproxy, "127.0.0.1")) for _ in range(PER_SOURCE)]
        time.sleep(0.3)  # accepted and counted
        extra = stack.enter_context(dial(cproxy, "127.0.0.1"))
        assert closed_at_once(extra)
        assert served(cproxy, origin_http, held[0]) == 200  # the open ones still work
        other = stack.enter_context(dial(cproxy, "127.0.0.2"))  # another source has room
        assert served(cproxy, origin_http, other) == 200
        held.pop().close()
        time.sleep(0.3)
        again = stack.enter_context(dial(cproxy, "127.0.0.1"))  # a place was freed
        assert served(cproxy, origin_http, again) == 200
    line = cproxy.wait_audit(lambda e: e["event"] == "connections_refused")
    assert (line["reason"], line["count"]) == ("source_at_capacity", 1)


def test_the_worker_holds_at_most_its_cap(cproxy: Proxy, origin_http: Origin) -> None:
    with contextlib.ExitStack() as stack:
        for i in range(TOTAL):
            stack.enter_context(dial(cproxy, f"127.0.0.{10 + i}"))
        time.sleep(0.3)
        refused = [stack.enter_context(dial(cproxy, f"127.0.1.{i}")) for i in range(20)]
        assert all(closed_at_once(s) for s in refused)
    time.sleep(1.2)
    lines = [e for e in cproxy.audit() if e["event"] == "connections_refused"]
    assert sum(e["count"] for e in lines) == 20
    assert {e["reason"] for e in lines} == {"proxy_at_capacity"}
    assert len(lines) <= 3  # per second, not per connection
