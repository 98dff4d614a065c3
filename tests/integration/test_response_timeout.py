"""An upstream that takes a request and does not answer: 504 `upstream_timeout` once the response
timeout has passed (the proxy's, or the rule's for a long-polling API), the upstream's connection
dropped, and answered requests never hit by a timer left behind."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import KEYS, client
from tests.dnsstub import StubDNS
from tests.harness import OriginCA, Proxy, ProxyFactory, key_digest
from tests.rawserver import RawServer
from tests.security.rawclient import h2_get

TIMEOUT = 1.0  # the proxy's --response-timeout here


class Slow(RawServer):
    """An HTTPS origin that answers `/wait/<seconds>` after that long, `/never` never (until the
    peer closes), anything else at once; it records each request and when the peer hung up."""

    def __init__(self, tls: tuple[Path, Path]) -> None:
        self.paths: list[str] = []
        self.hung_up: list[float] = []  # monotonic times the peer closed a held connection
        super().__init__(tls)

    def handle(self, conn: socket.socket) -> None:
        buf = b""
        for _ in range(10_000):  # requests on one keep-alive connection
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            self.paths.append(path)
            if path == "/never":
                if not conn.recv(1):  # the proxy gave up on it
                    self.hung_up.append(time.monotonic())
                return
            if path.startswith("/wait/"):
                time.sleep(float(path.rsplit("/", 1)[1]))
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


@pytest.fixture(scope="module")
def slow(test_ca: OriginCA, dns: StubDNS) -> Iterator[Slow]:
    dns.set("longpoll.test", "A 127.0.0.1")
    origin = Slow(test_ca.issue("api.test", "longpoll.test"))
    yield origin
    origin.stop()


@pytest.fixture(scope="module")
def rproxy(proxy_with: ProxyFactory, slow: Slow) -> Iterator[Proxy]:
    rules = f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{slow.port}]
        methods: [GET]
      - host: longpoll.test
        ports: [{slow.port}]
        methods: [GET]
        response_timeout: 4
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
"""
    with proxy_with(rules, name="response-timeout",
                    options=["--response-timeout", str(TIMEOUT)]) as p:
        yield p


def test_an_upstream_that_never_answers_is_a_504_upstream_timeout(
    rproxy: Proxy, slow: Slow
) -> None:
    before = len(slow.hung_up)
    started = time.monotonic()
    r = client(rproxy).get(f"https://api.test:{slow.port}/never", timeout=20)
    took = time.monotonic() - started
    assert (r.status_code, r.json()["reason"]) == (504, "upstream_timeout")
    assert r.json()["error"]["type"] == "upstream_unavailable"
    assert "127.0.0.1" not in r.text
    assert TIMEOUT <= took < TIMEOUT + 3
    # The request did reach the origin, and the proxy then dropped the connection it was on.
    assert "/never" in slow.paths
    for _ in range(50):
        if len(slow.hung_up) > before:
            break
        time.sleep(0.05)
    assert len(slow.hung_up) > before
    line = rproxy.wait_audit(lambda e: e.get("path") == "/never" and e.get("reason"))
    assert line["reason"] == "upstream_timeout"
    assert line["decision"] == "allow"  # allowed and forwarded; the upstream failed it


def test_a_rule_gives_a_long_polling_api_its_own_timeout(rproxy: Proxy, slow: Slow) -> None:
    r = client(rproxy).get(f"https://longpoll.test:{slow.port}/wait/2", timeout=20)
    assert (r.status_code, r.text) == (200, "ok")  # past the proxy's 1 s, within the rule's 4
    r = client(rproxy).get(f"https://api.test:{slow.port}/wait/2", timeout=20)
    assert (r.status_code, r.json()["reason"]) == (504, "upstream_timeout")


def pending_deadlines(p: Proxy) -> float:
    """The workers' `response_deadlines_pending`, from snapshots written after now."""
    since = time.time()
    directory = p.state / "metrics"
    for _ in range(60):
        snaps = [json.loads(f.read_text()) for f in directory.glob("*.json")
                 if f.stat().st_mtime > since + 0.05]
        if snaps:
            return float(sum(s["gauges"]["response_deadlines_pending"] for s in snaps))
        time.sleep(0.05)
    raise AssertionError("no metrics snapshot within 3 s")


def test_answered_requests_leave_no_timer_behind(rproxy: Proxy, slow: Slow) -> None:
    """A met deadline's timer ends at once (the rule's 4 s deadlines would still be asleep
    here), and deadlines met on a keep-alive connection fire nothing into its later requests."""
    with client(rproxy) as c:
        for i in range(30):
            got = c.get(f"https://longpoll.test:{slow.port}/quick/{i}", timeout=10)
            assert got.status_code == 200
        assert pending_deadlines(rproxy) == 0
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client(rproxy).get,
                                  f"https://longpoll.test:{slow.port}/wait/2.5", timeout=10)
            time.sleep(0.3)
            assert pending_deadlines(rproxy) == 1  # the gauge does count a waiting request
            assert waiting.result().status_code == 200
        for i in range(30):
            assert c.get(f"https://api.test:{slow.port}/quick/{i}", timeout=10).status_code == 200
        time.sleep(TIMEOUT * 1.5)  # every one of those deadlines would have fired by now
        r = c.get(f"https://api.test:{slow.port}/wait/0.5", timeout=10)
        assert (r.status_code, r.text) == (200, "ok")


def test_over_http2_the_stream_gets_the_json_504(rproxy: Proxy, slow: Slow) -> None:
    target = f"api.test:{slow.port}"
    r = h2_get(rproxy.port, target, ("bot-1", KEYS["bot-1"]), rproxy.ca, "/never")
    assert r.status == 504, r.body[:300]
    assert r.json()["reason"] == "upstream_timeout"


def test_a_client_that_leaves_takes_its_timer_with_it(rproxy: Proxy, slow: Slow) -> None:
    """The deadline of a request whose client hung up is cancelled with the connection (the
    stream's end calls it off; the handler's disconnect cancels its timers besides), not left
    to wait out the rule's 4 s holding the connection's state."""
    import requests

    before = len(slow.paths)
    with client(rproxy) as c, pytest.raises(requests.exceptions.ReadTimeout):
        c.get(f"https://longpoll.test:{slow.port}/never", timeout=(5, 0.8))
    left = time.monotonic()
    assert slow.paths[before:] == ["/never"]  # it did reach the origin, and waited
    while pending_deadlines(rproxy) != 0 and time.monotonic() - left < 2.0:
        time.sleep(0.05)
    # Well within the 3 s the timer has left: it went with the client, it did not fire.
    assert pending_deadlines(rproxy) == 0 and time.monotonic() - left < 2.5
