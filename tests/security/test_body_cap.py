"""A request body without a declared length (chunked over HTTP/1, HTTP/2 without content-length)
is held to its request's `max_request_bytes` as it streams (proxy/bodycap.py). A declared length
over the cap is refused at the head; one under it is held to by the parsers (h11, h2), checked
here too.

The bound at the origin: at most the cap in body bytes, and never the request's end. The data
event that takes the count past the cap is not forwarded, so what went before it is all that
goes (the cap or less); the upstream request is then aborted (HTTP/1: its connection closed
before the last chunk; HTTP/2: its stream reset). The client reads the 413 request_too_large
refusal if nothing of an answer has reached it, and the rest of its body is dropped within the
linger bounds; once an answer has begun, its connection (HTTP/1) or stream (HTTP/2) is ended.
The origins here (tests.strictorigin) read the framing strictly and record exactly that.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import h2.events
import pytest

from tests.dnsstub import StubDNS
from tests.harness import OriginCA, Proxy, free_port, key_digest
from tests.integration.test_metrics import scrape_until, total
from tests.security.bodyclient import PATHS, H2Upload, through
from tests.security.rawclient import (
    body_pieces,
    proxy_auth,
    read_response,
    request_bytes,
    upload_whole,
)
from tests.strictorigin import Arrival, H1Origin, H2Origin

CAP = 100_000
BIG = 16 * 1024 * 1024  # past socket buffers, and 160 times the cap
KEYS = {"bot-1": "cap-bot-key", "meter-1": "cap-meter-key"}
AUTH = ("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"]))
METER = ("Proxy-Authorization", proxy_auth("meter-1", KEYS["meter-1"]))


class World:
    def __init__(self, directory: Path, test_ca: OriginCA, dns: StubDNS) -> None:
        cert = test_ca.issue("api.test")
        self.h1, self.h1s, self.h2s = H1Origin(None), H1Origin(cert), H2Origin(cert)
        ports = [self.h1.port, self.h1s.port, self.h2s.port]
        # Methods make api.test's tunnels intercepted.
        allow = f"""
    allow:
      - host: api.test
        ports: {ports}
        methods: [GET, POST, PUT]
    allow_networks: [127.0.0.1/32]"""
        rules = f"""
version: 1
policies:
  ci:{allow}
    budgets: {{max_request_bytes: {CAP}}}
  metered:{allow}
    budgets: {{max_request_bytes: {CAP}, max_total_bytes: 200000}}
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
  meter-1: {{policy: metered, key_sha256: "{key_digest(KEYS['meter-1'])}"}}
default_policy: null
"""
        self.metrics = free_port()
        self.proxy = Proxy(directory, rules, resolver=dns.address, upstream_ca=test_ca.path,
                           mitmproxy_errors=True,
                           extra_args=["--metrics-listen", f"127.0.0.1:{self.metrics}"])

    def stop(self) -> None:
        self.proxy.stop()
        for origin in (self.h1, self.h1s, self.h2s):
            origin.stop()


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    world = World(tmp_path_factory.mktemp("bodycap"), test_ca, dns)
    yield world
    world.stop()
    # No exception in sealgate's code, nor in mitmproxy's handling of a connection.
    stderr = world.proxy.stderr()
    assert "Traceback" not in stderr and "has crashed" not in stderr, stderr


def _path(name: str) -> str:
    return f"/{name}-{uuid.uuid4().hex[:8]}"


def _line(w: World, path: str) -> dict[str, object]:
    """The request's one audit line."""
    w.proxy.wait_audit(lambda e: e.get("event") == "request" and e.get("path") == path)
    lines = [e for e in w.proxy.audit() if e.get("event") == "request" and e.get("path") == path]
    assert len(lines) == 1, lines
    return lines[0]


def _cut_off(arrivals: list[Arrival]) -> bool:
    """What reached the origin: at most the cap, and never the request's end."""
    return len(arrivals) == 1 and arrivals[0].body <= CAP and not arrivals[0].ended


def _chunked(target: str, authority: str, who: tuple[str, str] = AUTH) -> bytes:
    return request_bytes("POST", target, [("Host", authority), who,
                                          ("Transfer-Encoding", "chunked")])


@pytest.mark.parametrize("path", PATHS)
def test_a_chunked_body_over_the_cap_goes_no_further_and_is_refused(
    w: World, path: str
) -> None:
    """16 MiB under a 100 kB cap, written whole before the answer is read: all of it reached
    the origin, which answered 200."""
    name = _path("over")
    origin = w.h1 if path == "plain" else w.h1s
    with through(w.proxy, path, w.h1.port, w.h1s.port, AUTH) as (sock, base, authority):
        response = upload_whole(sock, _chunked(base + name, authority), BIG, chunked=True)
    assert (response.status, response.reason) == (413, "request_too_large")
    assert _cut_off(origin.arrived(name))
    line = _line(w, name)
    assert (line["decision"], line["reason"], line["status"]) == ("deny", "request_too_large",
                                                                  413)


@pytest.mark.parametrize("upstream", ["http1", "http2"])
def test_http2_a_body_without_a_length_over_the_cap_is_refused_as_it_streams(
    w: World, upstream: str
) -> None:
    """Over HTTP/2 the refusal is the stream's whole answer while the body still comes; the
    rest is dropped (the stream is not reset) and the connection serves the next request. An
    HTTP/1 upstream had its connection closed before the last chunk, an HTTP/2 one its stream
    reset."""
    origin = w.h1s if upstream == "http1" else w.h2s
    name = _path("h2")
    client = H2Upload(w.proxy, f"api.test:{origin.port}", AUTH)
    with client.tls:
        stream = client.start("POST", name, None, streamed=True)
        assert client.sendbody_pieces(stream, BIG) == BIG
        status, body = client.answer(stream)
        assert (status, b'"reason":"request_too_large"' in body) == (413, True), body
        after = client.answer(client.start("GET", name + "/after", None))
        assert not client.reset(stream)
    assert after == (200, b"ok\n")
    arrivals = origin.arrived(name)
    assert _cut_off(arrivals)
    assert arrivals[0].reset == (upstream == "http2")
    assert _line(w, name)["reason"] == "request_too_large"


def test_a_body_over_the_cap_after_the_answer_began_has_its_connection_closed(w: World) -> None:
    """The origin answers before it reads the body, and the answer streams to the client: a
    refusal can no longer be the answer, so once the body passes the cap the client's
    connection is closed in the middle of it (no last chunk: the client sees the answer broken
    off, never whole)."""
    name = _path("early") + "/early"
    with through(w.proxy, "plain", w.h1.port, w.h1s.port, AUTH) as (sock, base, authority):
        sock.sendall(_chunked(base + name, authority) + b"%x\r\n%s\r\n" % (CAP, b"e" * CAP))
        head = b""
        while b"early\r\n" not in head:  # the answer has begun: its head and first chunk
            data = sock.recv(65536)
            assert data, head
            head += data
        with contextlib.suppress(OSError):
            for piece in body_pieces(BIG, chunked=True):
                sock.sendall(piece)
        rest = b""
        with contextlib.suppress(OSError):
            while data := sock.recv(65536):
                rest += data
    assert head.startswith(b"HTTP/1.1 200") and b"0\r\n\r\n" not in head + rest
    assert _cut_off(w.h1.arrived(name))
    line = _line(w, name)
    assert (line["decision"], line["reason"], line["status"]) == ("deny", "request_too_large",
                                                                  200)


def test_an_answer_still_read_whole_gives_way_to_the_refusal(w: World) -> None:
    """The origin has begun an answer with a Content-Length, which the proxy reads whole before
    it sends any of it: nothing has reached the client, so the refusal is its answer, and the
    origin's is dropped."""
    name = _path("held") + "/held"
    with through(w.proxy, "plain", w.h1.port, w.h1s.port, AUTH) as (sock, base, authority):
        sock.sendall(_chunked(base + name, authority) + b"%x\r\n%s\r\n" % (CAP, b"e" * CAP))
        deadline = time.monotonic() + 10
        while not any(a.answered for a in w.h1.arrivals if a.path == name):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)  # for the proxy to read the answer's head
        response = upload_whole(sock, b"", BIG, chunked=True)
    assert (response.status, response.reason) == (413, "request_too_large")
    assert _cut_off(w.h1.arrived(name))
    assert _line(w, name)["status"] == 413


def test_http2_a_body_over_the_cap_after_the_answer_began_has_its_stream_reset(
    w: World
) -> None:
    name = _path("h2-early") + "/early"
    client = H2Upload(w.proxy, f"api.test:{w.h1s.port}", AUTH)
    with client.tls:
        stream = client.start("POST", name, None, streamed=True)
        client.conn.send_data(stream, b"e" * 10_000)
        client.tls.sendall(client.conn.data_to_send())
        while stream not in client.seen:  # the answer's head
            client.pump()
        sent = client.sendbody_pieces(stream, BIG)
        while not client.reset(stream):
            client.pump()
    assert sent < BIG and client.status(stream) == 200
    assert not any(isinstance(e, h2.events.StreamEnded) for e in client.seen[stream])
    assert _cut_off(w.h1s.arrived(name))
    assert _line(w, name)["reason"] == "request_too_large"


@pytest.mark.parametrize(("size", "status"), [(CAP, 200), (CAP + 1, 413)],
                         ids=["at-the-cap", "one-over"])
@pytest.mark.parametrize("path", ["plain", "tunnel", "http2"])
def test_a_body_up_to_the_cap_passes_whole(
    w: World, path: str, size: int, status: int
) -> None:
    """The cap is the most a body may be: exactly the cap arrives whole, one byte more is
    refused with the cap's bytes at the origin."""
    name = _path("edge")
    origin = w.h1 if path == "plain" else w.h1s
    if path == "http2":
        client = H2Upload(w.proxy, f"api.test:{origin.port}", AUTH)
        with client.tls:
            stream = client.start("PUT", name, None, streamed=True)
            client.sendbody_pieces(stream, size)
            got = client.answer(stream)[0]
    else:
        pieces = [b"p" * 25_000] * (size // 25_000) + [b"q" * (size % 25_000)]
        with through(w.proxy, path, w.h1.port, w.h1s.port, AUTH) as (sock, base, authority):
            sock.sendall(_chunked(base + name, authority))
            for piece in filter(None, pieces):
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sock.sendall(b"0\r\n\r\n")
            got = read_response(sock, timeout=10).status
    arrivals = origin.arrived(name)
    assert got == status
    if status == 200:
        assert [(a.body, a.ended) for a in arrivals] == [(CAP, True)]
    else:
        assert _cut_off(arrivals)


def test_the_total_budget_counts_what_was_forwarded(w: World) -> None:
    """meter-1 has 200,000 bytes in total. A 16 MiB upload cut off at its 100,000-byte cap
    counts only what went upstream (all 16 MiB were counted before, and the next request
    refused), so two to four uploads of 64 KiB go after it before the total is spent: the
    total admits a request while less than it has been used."""
    def upload(name: str, size: int) -> tuple[int, str | None]:
        with through(w.proxy, "plain", w.h1.port, w.h1s.port, METER) as (sock, base, authority):
            response = upload_whole(sock, _chunked(base + name, authority, METER), size,
                                    chunked=True)
        return response.status, response.reason

    assert upload(_path("meter"), BIG) == (413, "request_too_large")
    passed = 0
    while (answer := upload(_path("meter"), 65536)) == (200, None) and passed < 6:
        passed += 1
    assert answer == (429, "budget_exceeded") and 2 <= passed <= 4, (answer, passed)
    text = scrape_until(w.metrics, lambda t: total(
        t, "sealgate_requests_total", decision="deny", reason="budget_exceeded") >= 1)
    assert total(text, "sealgate_requests_total", decision="deny",
                 reason="request_too_large") >= 1


@pytest.mark.parametrize("protocol", ["http1", "http2"])
def test_a_declared_length_that_lies_is_held_to_by_the_parsers(w: World, protocol: str) -> None:
    """What the cap leaves to the parsers: a body with a Content-Length never goes past it.
    HTTP/1 reads the declared bytes as the body (what follows is a next request, malformed);
    h2 ends the connection at a DATA frame past the declared length, and nothing is sent."""
    name = _path("lies")
    if protocol == "http1":
        with through(w.proxy, "plain", w.h1.port, w.h1s.port, AUTH) as (sock, base, authority):
            sock.sendall(request_bytes("POST", base + name, [
                ("Host", authority), AUTH, ("Content-Length", "1000")]) + b"x" * 50_000)
            assert read_response(sock, timeout=10).status == 200
        assert [(a.body, a.ended) for a in w.h1.arrived(name)] == [(1000, True)]
        return
    client = H2Upload(w.proxy, f"api.test:{w.h1s.port}", AUTH)
    with client.tls:
        stream = client.start("POST", name, 1000)
        client.conn.send_data(stream, b"x" * 1000)
        client.conn.send_data(stream, b"x" * 10_000)  # h2 checks lengths it receives only
        client.tls.sendall(client.conn.data_to_send())
        with contextlib.suppress(ConnectionError):  # until the connection's end, or its close
            while not any(isinstance(e, h2.events.ConnectionTerminated)
                          for e in client.seen.get(0, [])):
                client.pump()
    assert stream not in client.seen  # no answer: the connection ended
    assert not [a for a in w.h1s.arrivals if a.path == name]
