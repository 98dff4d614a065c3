"""TLS session resumption on the upstream leg: a sandbox's next connection to the same place
resumes the last one's session (seen at the origin: `session_reused`), and never across what
made the first one trustworthy: another sandbox, another name, another address."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from tests.conftest import KEYS, client
from tests.dnsstub import StubDNS
from tests.harness import OriginCA, Proxy, ProxyFactory, key_digest
from tests.rawserver import TwoAddressTLS


class Resuming(TwoAddressTLS):
    """An HTTPS origin on 127.0.0.1 and 127.0.0.2 (one port, one TLS context: a ticket issued
    on one address is good on the other) that answers every request `ok`, and records for each
    connection the address it came in on, the SNI and whether its session was resumed."""

    def __init__(self, ca: OriginCA) -> None:
        super().__init__(ca.issue("resume.test", "other.test"))
        self.seen: list[tuple[str, str | None, bool]] = []
        self._sni: dict[int, str | None] = {}
        self.context.sni_callback = self._note_sni

    def _note_sni(self, conn: ssl.SSLObject | ssl.SSLSocket, name: str | None,
                  _: ssl.SSLContext) -> None:
        self._sni[id(conn)] = name

    def serve(self, c: ssl.SSLSocket, peer: tuple[str, int]) -> None:
        self.seen.append((c.getsockname()[0], self._sni.pop(id(c), None), c.session_reused))
        buf = b""
        for _ in range(100):  # requests on one connection
            while b"\r\n\r\n" not in buf:
                if not (data := c.recv(65536)):
                    return
                buf += data
            _, _, buf = buf.partition(b"\r\n\r\n")
            # Closing: a connection kept for the next client connection would spare the
            # handshake this module is about (test_upstream_pool.py has the keeping).
            c.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n"
                      b"\r\nok")


@pytest.fixture(scope="module")
def origin(test_ca: OriginCA, dns: StubDNS) -> Iterator[Resuming]:
    dns.set("resume.test", "A 127.0.0.1", ttl=0)  # re-resolved by every dial
    dns.set("other.test", "A 127.0.0.1")
    server = Resuming(test_ca)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxy(proxy_with: ProxyFactory, origin: Resuming) -> Iterator[Proxy]:
    rules = f"""
version: 1
policies:
  ci:
    allow:
      - host: resume.test
        ports: [{origin.port}]
        methods: [GET]
      - host: other.test
        ports: [{origin.port}]
        methods: [GET]
    allow_networks: [127.0.0.0/8]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
  rep-1: {{policy: ci, key_sha256: "{key_digest(KEYS['rep-1'])}"}}
"""
    with proxy_with(rules, name="resumption") as p:
        yield p


def test_a_sandboxs_next_connection_resumes_and_others_never_do(
    proxy: Proxy, origin: Resuming, dns: StubDNS
) -> None:
    def one(host: str, sandbox: str = "bot-1") -> tuple[str, str | None, bool]:
        before = len(origin.seen)
        with client(proxy, sandbox) as c:
            r = c.get(f"https://{host}:{origin.port}/x", timeout=20)
            assert (r.status_code, r.text) == (200, "ok")
        assert len(origin.seen) == before + 1  # one new upstream connection each time
        return origin.seen[-1]

    first = one("resume.test")
    assert first == ("127.0.0.1", "resume.test", False)
    # The same sandbox, name and address: resumed, each time.
    assert one("resume.test") == ("127.0.0.1", "resume.test", True)
    assert one("resume.test") == ("127.0.0.1", "resume.test", True)
    # Another sandbox never offers bot-1's session (it gets one of its own, then resumes it).
    assert one("resume.test", "rep-1") == ("127.0.0.1", "resume.test", False)
    assert one("resume.test", "rep-1") == ("127.0.0.1", "resume.test", True)
    # Another name on the same address and port: its own session.
    assert one("other.test") == ("127.0.0.1", "other.test", False)
    # The name re-resolves elsewhere: the server there would take the ticket (one context),
    # but the session belongs to the address the guard checked before, so it is not offered.
    dns.set("resume.test", "A 127.0.0.2", ttl=0)
    time.sleep(1.2)  # the proxy's resolver keeps any answer for at least a second
    try:
        assert one("resume.test") == ("127.0.0.2", "resume.test", False)
        assert one("resume.test") == ("127.0.0.2", "resume.test", True)
    finally:
        dns.set("resume.test", "A 127.0.0.1", ttl=0)


def test_a_sandboxs_client_resumes_its_session_with_the_proxy(
    proxy: Proxy, origin: Resuming
) -> None:
    """The client leg: a client that keeps its session (curl, Node, Go with a cache) resumes
    with the proxy's leaf for the name, and the request inside is decided as always."""
    import base64

    auth = base64.b64encode(f"bot-1:{KEYS['bot-1']}".encode()).decode()
    context = ssl.create_default_context(cafile=str(proxy.ca))
    session: ssl.SSLSession | None = None
    reused = []
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as raw:
            raw.sendall(f"CONNECT resume.test:{origin.port} HTTP/1.1\r\nHost: resume.test:"
                        f"{origin.port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
            assert raw.recv(4096).startswith(b"HTTP/1.1 200")
            with context.wrap_socket(raw, server_hostname="resume.test",
                                     session=session) as tls:
                tls.sendall(b"GET /x HTTP/1.1\r\nHost: resume.test\r\n\r\n")
                answer = b""
                while not answer.endswith(b"ok"):
                    if not (data := tls.recv(4096)):
                        break
                    answer += data
                assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
                reused.append(tls.session_reused)
                session = tls.session  # read after data: TLS 1.3 tickets follow the handshake
    assert reused == [False, True, True]


def test_clients_of_a_default_policy_resume_only_their_own_sessions(
    proxy_with: ProxyFactory, origin: Resuming
) -> None:
    """Found by review: every client no sandbox was proven for (served by the default policy)
    shared one tenant, "", so one such client's upstream connection resumed another's session
    and the origin could link them by its ticket. Its source address stands for it now."""
    rules = f"""
version: 1
policies:
  anon:
    allow:
      - host: resume.test
        ports: [{origin.port}]
        methods: [GET]
    allow_networks: [127.0.0.0/8]
default_policy: anon
"""

    def one(p: Proxy, source: str) -> tuple[str, str | None, bool]:
        before = len(origin.seen)
        context = ssl.create_default_context(cafile=str(p.ca))
        target = f"resume.test:{origin.port}"
        with socket.create_connection(("127.0.0.1", p.port), timeout=10,
                                      source_address=(source, 0)) as raw:
            raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            assert raw.recv(4096).startswith(b"HTTP/1.1 200")
            with context.wrap_socket(raw, server_hostname="resume.test") as tls:
                tls.sendall(b"GET /x HTTP/1.1\r\nHost: resume.test\r\nConnection: close\r\n\r\n")
                answer = b""
                while data := tls.recv(4096):
                    answer += data
                assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok"), answer
        assert len(origin.seen) == before + 1
        return origin.seen[-1]

    with proxy_with(rules, name="resumption-anon") as p:
        assert one(p, "127.0.0.3")[2] is False
        assert one(p, "127.0.0.3")[2] is True  # its own session, resumed
        assert one(p, "127.0.0.4")[2] is False  # another client's: never offered
