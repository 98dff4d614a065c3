"""The fast path (proxy/engine/fastpath.py): which connections it serves and which it hands to
mitmproxy's layers, whole or from a message boundary on, with every byte the client sent
reaching the origin once and in order; counted in the metrics; and turned off by its option.
What the fast path does with a request (refusals, injection, scrubbing, kept connections) is
the pipeline's and is tested through base-URL mode elsewhere (test_client_modes,
test_upstream_pool, the SDK and security suites)."""

from __future__ import annotations

import base64
import contextlib
import re
import socket
import time
from collections.abc import Iterator

import pytest
import requests

from tests.conftest import KEYS, client, rules_allowing
from tests.harness import Origin, OriginCA, Proxy, ProxyFactory, free_port

AUTH = "Proxy-Authorization: Basic " + base64.b64encode(
    f"bot-1:{KEYS['bot-1']}".encode()).decode()


@pytest.fixture(scope="module")
def origin(test_ca: OriginCA) -> Iterator[Origin]:
    server = Origin(tls=test_ca.issue("api.test"))
    yield server
    server.stop()


@contextlib.contextmanager
def _proxy(proxy_with: ProxyFactory, origin: Origin, *options: str) -> Iterator[tuple[Proxy, int]]:
    admin = free_port()
    rules = rules_allowing("api.test", origin.port)
    with proxy_with(rules, name="fast", options=["--admin", f"127.0.0.1:{admin}", *options],
                    clean_stderr=True) as p:
        yield p, admin


@pytest.fixture(scope="module")
def fast(proxy_with: ProxyFactory, origin: Origin) -> Iterator[tuple[Proxy, int]]:
    with _proxy(proxy_with, origin) as p:
        yield p


@pytest.fixture(scope="module")
def slow(proxy_with: ProxyFactory, origin: Origin) -> Iterator[tuple[Proxy, int]]:
    with _proxy(proxy_with, origin, "--set", "sealgate_fast_path=false") as p:
        yield p


def counts(admin: int) -> dict[str, float]:
    """sealgate_fast_path_connections_total by outcome, as the admin endpoint has them now
    (the workers' figures are written once a second)."""
    text = requests.get(f"http://127.0.0.1:{admin}/metrics", timeout=5).text
    found = re.findall(r'^sealgate_fast_path_connections_total\{outcome="(\w+)"\} (\S+)$', text,
                       re.MULTILINE)
    return {outcome: float(value) for outcome, value in found}


def counted(admin: int, before: dict[str, float], **expected: int) -> dict[str, float]:
    """Wait (bounded) until the counts have grown by `expected`; what they grew by."""
    grown: dict[str, float] = {}
    for _ in range(40):
        now = counts(admin)
        grown = {k: now.get(k, 0) - before.get(k, 0) for k in ("taken", "handed_over")}
        if all(grown[k] >= v for k, v in expected.items()):
            break
        time.sleep(0.1)
    return grown


def base(proxy: Proxy, origin: Origin, path: str, method: str = "GET", body: bytes = b"",
         extra: str = "") -> bytes:
    """One base-URL request as bytes, with a Content-Length body (or `extra` framing)."""
    head = (f"{method} /_/api.test:{origin.port}{path} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{proxy.port}\r\n{AUTH}\r\n{extra}")
    if body and not extra:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def answers(sock: socket.socket, count: int) -> list[bytes]:
    """`count` responses with Content-Length bodies read off `sock` (bounded)."""
    got: list[bytes] = []
    buf = b""
    for _ in range(200):
        while b"\r\n\r\n" in buf and len(got) < count:
            head, _, rest = buf.partition(b"\r\n\r\n")
            declared = re.search(rb"(?i)content-length: (\d+)", head)
            length = int(declared.group(1)) if declared else 0  # a 100 Continue has none
            if len(rest) < length:
                break
            got.append(head.split(b"\r\n")[0] + b" " + rest[:length])
            buf = rest[length:]
        if len(got) == count:
            return got
        if not (data := sock.recv(65536)):
            break
        buf += data
    raise AssertionError(f"{len(got)} of {count} answers: {got} then {buf[:200]!r}")


def test_base_url_connections_are_the_fast_paths(fast: tuple[Proxy, int],
                                                 origin: Origin) -> None:
    proxy, admin = fast
    before, seen = counts(admin), len(origin.requests)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(base(proxy, origin, "/one") + base(proxy, origin, "/two", "POST", b"abc"))
        s.sendall(base(proxy, origin, "/three"))  # pipelined with the two before
        got = answers(s, 3)
    assert all(a.startswith(b"HTTP/1.1 200") for a in got), got
    assert [(r.method, r.path, r.body) for r in origin.requests[seen:]] == [
        ("GET", "/one", b""), ("POST", "/two", b"abc"), ("GET", "/three", b"")]
    assert counted(admin, before, taken=1) == {"taken": 1, "handed_over": 0}
    lines = [line for line in proxy.audit() if line.get("path") in ("/one", "/two", "/three")]
    assert len({line["connection_id"] for line in lines}) == 1
    assert all(line["base_url"] and line["decision"] == "allow" for line in lines)


def test_a_connection_it_does_not_take_goes_to_mitmproxy_whole(fast: tuple[Proxy, int],
                                                               origin: Origin) -> None:
    """An absolute-form `https://` request: handed over before a byte was acted on, and served
    as ever. An absolute-form `http://` one is the fast path's, refused by the same rules. A
    CONNECT is the fast path's (test_fast_connect.py); these rules pass it through blind, which
    goes on in mitmproxy's layers."""
    proxy, admin = fast
    before = counts(admin)
    with client(proxy) as c:
        assert c.get(f"https://api.test:{origin.port}/tunnelled", timeout=10).status_code == 200
    for scheme in ("https", "http"):
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
            s.sendall(f"GET {scheme}://127.0.0.1:9/plain HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"
                      f"{AUTH}\r\nConnection: close\r\n\r\n".encode())
            assert s.recv(65536).startswith(b"HTTP/1.1 403")  # refused by the rules
    assert counted(admin, before, taken=2, handed_over=2) == {"taken": 2, "handed_over": 2}


@pytest.mark.parametrize("odd", [
    pytest.param(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", id="chunked"),
    pytest.param(b"Content-Length: 100000\r\n\r\n" + b"x" * 100_000, id="large"),
    pytest.param(b"Content-Length: 3\r\nExpect: 100-continue\r\n\r\nabc", id="expect"),
])
def test_a_request_it_does_not_take_hands_the_rest_over(
    fast: tuple[Proxy, int], origin: Origin, odd: bytes
) -> None:
    """A request the fast path does not take in the middle of its connection: the rest of the
    connection goes to mitmproxy from that request on, its bytes and what follows intact."""
    proxy, admin = fast
    before, seen = counts(admin), len(origin.requests)
    head, _, rest = odd.partition(b"\r\n\r\n")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(base(proxy, origin, "/before"))
        assert answers(s, 1)[0].startswith(b"HTTP/1.1 200")
        s.sendall(base(proxy, origin, "/odd", "POST", extra=head.decode() + "\r\n") + rest)
        got = answers(s, 2 if b"Expect" in head else 1)
        assert got[-1].startswith(b"HTTP/1.1 200"), got
        s.sendall(base(proxy, origin, "/after"))
        assert answers(s, 1)[0].startswith(b"HTTP/1.1 200")
    requests_ = origin.requests[seen:]
    assert [r.path for r in requests_] == ["/before", "/odd", "/after"]
    sent = b"abc" if b"abc" in rest else b"x" * 100_000
    assert requests_[1].body == sent
    assert counted(admin, before, taken=1, handed_over=1) == {"taken": 1, "handed_over": 1}


def test_off_by_its_option(slow: tuple[Proxy, int], origin: Origin) -> None:
    proxy, admin = slow
    seen = len(origin.requests)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(base(proxy, origin, "/mitm"))
        assert answers(s, 1)[0].startswith(b"HTTP/1.1 200")
    assert [r.path for r in origin.requests[seen:]] == ["/mitm"]
    time.sleep(1.2)  # a second's figures
    assert counts(admin).get("taken", 0) == 0


def gauge(admin: int, name: str) -> float:
    text = requests.get(f"http://127.0.0.1:{admin}/metrics", timeout=5).text
    found = re.search(rf"^sealgate_{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else -1.0


def test_its_upstream_connections_are_in_the_gauges(proxy_with: ProxyFactory,
                                                    origin: Origin) -> None:
    """The fast path's kept upstream connection counts as open and idle, as pool.py's do (a
    proxy of its own: no connection of mitmproxy's pool to count instead)."""
    with _proxy(proxy_with, origin) as (proxy, admin):
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
            s.sendall(base(proxy, origin, "/gauged"))
            assert answers(s, 1)[0].startswith(b"HTTP/1.1 200")
        for _ in range(40):  # the workers' figures are written once a second
            if gauge(admin, "upstream_connections_idle") >= 1:
                break
            time.sleep(0.1)
        assert gauge(admin, "upstream_connections_idle") >= 1
        assert gauge(admin, "upstream_connections_open") >= 1


def test_a_client_connection_keeps_its_upstream_connection(fast: tuple[Proxy, int],
                                                           origin: Origin) -> None:
    """More client connections busy at once than the pool keeps per key (16): each keeps the
    upstream connection it rode for its next request, as mitmproxy's do. Through the pool per
    request, the ones past 16 were closed after every answer and dialed again (at c=64 the
    fast path ran at 0.67x intercepted)."""
    proxy, _ = fast
    clients, rounds = 24, 3
    before = origin.connections
    socks = [socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
             for _ in range(clients)]
    try:
        for n in range(rounds):  # every client's request in flight before any is read
            for i, s in enumerate(socks):
                s.sendall(base(proxy, origin, f"/lease{i}-{n}"))
            for s in socks:
                assert answers(s, 1)[0].startswith(b"HTTP/1.1 200")
    finally:
        for s in socks:
            s.close()
    assert origin.connections - before <= clients


def test_a_client_that_reads_nothing_is_closed_after_the_idle_timeout(
    proxy_with: ProxyFactory, test_ca: OriginCA
) -> None:
    """An answer far larger than the sockets hold, to a client that never reads: once nothing
    can be written for `--idle-timeout`, the fast path closes the connection (Wire.drain),
    instead of holding it and its upstream for as long as the client likes."""
    idle = 1.5
    big = Origin(tls=test_ca.issue("api.test"))
    big.response_chunks = [b"x" * 65536] * 512  # 32 MiB, streamed
    try:
        rules = rules_allowing("api.test", big.port)
        with proxy_with(rules, name="fast-idle", options=["--idle-timeout", str(idle)]) as proxy:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.settimeout(10)
                s.connect(("127.0.0.1", proxy.port))
                s.sendall(base(proxy, big, "/big"))
                time.sleep(idle * 3)  # the bound under test is a time: nothing is read meanwhile
                got, ended = 0, False
                for _ in range(100_000):  # what was buffered, then the end
                    data = s.recv(65536)
                    if not data:
                        ended = True
                        break
                    got += len(data)
            assert ended and got < 512 * 65536, got
    finally:
        big.stop()
