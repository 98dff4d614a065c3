"""A dead or black-holed upstream: a clear JSON answer in bounded time, never the address."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import KEYS, client
from tests.dnsstub import StubDNS
from tests.harness import Origin, OriginCA, Proxy, ProxyFactory, free_port, key_digest
from tests.netns import require_root_net, run
from tests.rawserver import RawServer
from tests.security.rawclient import h2_get


@pytest.fixture(scope="module")
def dead_port() -> int:
    return free_port()  # nothing listens here


@pytest.fixture(scope="module")
def fproxy(proxy_with: ProxyFactory, dead_port: int) -> Iterator[Proxy]:
    rules = f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{dead_port}]
        methods: [GET]  # decided per request: HTTPS is intercepted
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
"""
    with proxy_with(rules, name="failures", options=["--connect-timeout", "1"]) as p:
        yield p


def test_refused_upstream_is_a_json_502(fproxy: Proxy, dead_port: int) -> None:
    r = client(fproxy).get(f"http://api.test:{dead_port}/", timeout=10)
    assert r.status_code == 502
    assert r.json()["reason"] == "connect_failed"
    assert r.headers["X-Sealgate-Error"] == "connect_failed"
    assert "127.0.0.1" not in r.text


def test_black_holed_upstream_times_out(
    fproxy: Proxy, dead_port: int, tmp_path: Path
) -> None:
    require_root_net()
    table = f"sgt_drop_{dead_port}"
    rules = tmp_path / "drop.nft"
    rules.write_text(
        f"table ip {table} {{\n chain out {{\n  type filter hook output priority 0;\n"
        f"  ip daddr 127.0.0.1 tcp dport {dead_port} drop\n }}\n}}\n"
    )
    run("nft", "-f", str(rules))
    try:
        started = time.monotonic()
        r = client(fproxy).get(f"http://api.test:{dead_port}/", timeout=20)
        assert time.monotonic() - started < 8
    finally:
        run("nft", "delete", "table", "ip", table, check=False)
    assert r.status_code == 504
    assert r.json()["reason"] == "connect_timeout"


def test_refused_upstream_over_http2_is_the_same_json_502(fproxy: Proxy, dead_port: int) -> None:
    target = f"api.test:{dead_port}"
    r = h2_get(fproxy.port, target, ("bot-1", KEYS["bot-1"]), fproxy.ca, "/")
    assert r.status == 502, r.body[:300]
    assert r.json()["reason"] == "connect_failed"
    assert r.reason == "connect_failed"
    assert b"127.0.0.1" not in r.body


class Resetter(RawServer):
    """Accepts, reads the request, and closes without a byte of response."""

    requests = 0

    def handle(self, conn: socket.socket) -> None:
        conn.settimeout(2)
        if conn.recv(65536):
            self.requests += 1
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.fixture(scope="module")
def tproxy(
    proxy_with: ProxyFactory, dns: StubDNS, origin_https: Origin, test_ca: OriginCA,
) -> Iterator[tuple[Proxy, Resetter]]:
    resetter = Resetter(tls=test_ca.issue("api.test"))
    dns.set("wrongname.test", "A 127.0.0.1")  # the origin, whose certificate names api.test
    rules = f"""
version: 1
policies:
  ci:
    allow:
      - host: wrongname.test
        ports: [{origin_https.port}]
        methods: [GET]
      - host: api.test
        ports: [{resetter.port}]
        methods: [GET]
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
"""
    with proxy_with(rules, name="tls-failures") as p:
        yield p, resetter
    resetter.stop()


def test_an_upstream_certificate_for_another_name_is_upstream_tls_failed(
    tproxy: tuple[Proxy, Resetter], origin_https: Origin
) -> None:
    p, _ = tproxy
    origin_https.reset()
    r = client(p).get(f"https://wrongname.test:{origin_https.port}/x", timeout=10)
    assert (r.status_code, r.json()["reason"]) == (502, "upstream_tls_failed")
    assert "127.0.0.1" not in r.text and not origin_https.requests
    line = p.wait_audit(lambda e: e.get("host") == "wrongname.test" and e.get("path") == "/x")
    assert line["reason"] == "upstream_tls_failed"


def test_an_upstream_that_resets_before_answering_is_upstream_reset(
    tproxy: tuple[Proxy, Resetter]
) -> None:
    p, resetter = tproxy
    r = client(p).get(f"https://api.test:{resetter.port}/reset", timeout=10)
    assert (r.status_code, r.json()["reason"]) == (502, "upstream_reset")
    assert resetter.requests >= 1  # it was sent, then cut
    line = p.wait_audit(lambda e: e.get("path") == "/reset" and e.get("reason"))
    assert line["reason"] == "upstream_reset"


@pytest.fixture(scope="module")
def mute() -> Iterator[socket.socket]:
    """A listener nobody accepts on: the kernel completes TCP handshakes, nothing speaks TLS (an
    origin's accept loop that stopped, or is late under load)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def mproxy(proxy_with: ProxyFactory, mute: socket.socket) -> Iterator[Proxy]:
    rules = f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{mute.getsockname()[1]}]
        methods: [GET]
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
"""
    with proxy_with(rules, name="mute-tls", options=["--connect-timeout", "1"]) as p:
        yield p


def test_an_upstream_that_never_starts_tls_is_a_connect_timeout(
    mproxy: Proxy, mute: socket.socket
) -> None:
    """TCP is up at once, so the dial's bound is met; the proxy's TLS handshake with the upstream
    has the same bound, instead of holding the request in silence until the idle timeout."""
    port = mute.getsockname()[1]
    started = time.monotonic()
    r = client(mproxy).get(f"https://api.test:{port}/mute", timeout=20)
    # The bound is 2 s; the margin is for a loaded machine, far below the 20 s the client would
    # wait (and the 60 s idle timeout) without it.
    assert time.monotonic() - started < 15
    assert (r.status_code, r.json()["reason"]) == (504, "connect_timeout")
    assert "127.0.0.1" not in r.text
    line = mproxy.wait_audit(lambda e: e.get("path") == "/mute")
    assert line["reason"] == "connect_timeout"
