"""Inside a tunnel only HTTP is spoken: bytes that do not look like HTTP are never relayed raw.

mitmproxy relays raw TCP when a connection's first bytes do not look like HTTP (fewer than
three, no space in the first line, an SSH banner). Relayed raw, a request split as "PO" + "ST
/forbidden ..." went past the rule's methods and paths to the origin. Every case here counts
what reached the origin (connections accepted, bytes read), not only what the client saw.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dnsstub import StubDNS
from tests.harness import SEALGATE, Origin, Proxy, ProxyFactory, RawListener, key_digest
from tests.netns import Netns, netns, run
from tests.security.rawclient import (
    NoResponse,
    connect_answer,
    open_tunnel,
    proxy_auth,
    read_response,
)

KEY = "strict-1-key"
PAUSE = 0.4  # long enough for mitmproxy to decide the layer on the first bytes alone


def rules(*ports: int) -> str:
    return f"""
version: 1
policies:
  strict:
    allow:
      - host: strict.test
        ports: [{", ".join(map(str, ports))}]
        methods: [GET]
        paths: ["/allowed/**"]
      - host: blind.test  # no request-level decision: TLS to it is passed through
        ports: [{", ".join(map(str, ports))}]
    allow_networks: [127.0.0.1/32]
sandboxes:
  strict-1: {{policy: strict, key_sha256: "{key_digest(KEY)}"}}
"""


@pytest.fixture(scope="module")
def plain_origin() -> Iterator[Origin]:
    origin = Origin()
    yield origin
    origin.stop()


@pytest.fixture(scope="module")
def tls_origin() -> Iterator[RawListener]:
    """Counts every TCP connection at accept: an HTTPS origin would not count one whose TLS
    handshake failed, which is how a relayed non-TLS byte stream would arrive."""
    listener = RawListener()
    yield listener
    listener.stop()


@pytest.fixture(scope="module")
def sproxy(
    proxy_with: ProxyFactory, dns: StubDNS, plain_origin: Origin, tls_origin: RawListener,
) -> Iterator[Proxy]:
    dns.set("strict.test", "A 127.0.0.1")
    dns.set("blind.test", "A 127.0.0.1")
    with proxy_with(rules(plain_origin.port, tls_origin.port), name="strict") as proxy:
        yield proxy


@pytest.fixture()
def clean(plain_origin: Origin, tls_origin: RawListener) -> None:
    plain_origin.reset()
    tls_origin.connections = tls_origin.bytes_received = 0


def tunnel(proxy: Proxy, port: int, host: str = "strict.test") -> socket.socket:
    sock, response = open_tunnel(
        proxy.port, f"{host}:{port}", [("Proxy-Authorization", proxy_auth("strict-1", KEY))]
    )
    assert response.status == 200
    return sock


def send_split(sock: socket.socket | ssl.SSLSocket, first: bytes, rest: bytes) -> int | None:
    """`first`, a pause in which mitmproxy decides on those bytes alone, then `rest`; the status
    of the answer, or None if the proxy closed without one."""
    sock.sendall(first)
    time.sleep(PAUSE)
    with contextlib.suppress(OSError):
        sock.sendall(rest)
    try:
        return read_response(sock, timeout=3).status
    except NoResponse:
        return None


FORBIDDEN = b"ST /forbidden HTTP/1.1\r\nHost: strict.test\r\nContent-Length: 0\r\n\r\n"


def test_a_request_allowed_by_the_rule_reaches_the_origin(
    sproxy: Proxy, plain_origin: Origin, clean: None
) -> None:
    """The control: split the same way, an allowed request arrives, so the origin can tell."""
    with tunnel(sproxy, plain_origin.port) as sock:
        status = send_split(sock, b"GE", b"T /allowed/x HTTP/1.1\r\nHost: strict.test\r\n\r\n")
    assert status == 200
    assert [r.path for r in plain_origin.requests] == ["/allowed/x"]


@pytest.mark.parametrize(
    ("first", "rest"),
    [
        (b"PO", FORBIDDEN),
        (b"\r\n", b"POST /forbidden HTTP/1.1\r\nHost: strict.test\r\nContent-Length: 0\r\n\r\n"),
        (b"\x00\x01\x02\xff\xfe", b"POST /forbidden HTTP/1.1\r\n\r\n"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", b"\x00\x00\x01\x0c\x0a\x14"),
        (b"POSTX/forbidden", b" HTTP/1.1\r\nHost: strict.test\r\n\r\n"),
    ],
    ids=["split-method", "leading-crlf", "binary", "ssh-banner", "no-space"],
)
def test_plain_bytes_that_are_not_an_allowed_request_reach_nothing(
    sproxy: Proxy, plain_origin: Origin, clean: None, first: bytes, rest: bytes
) -> None:
    with tunnel(sproxy, plain_origin.port) as sock:
        status = send_split(sock, first, rest)
    assert status in (None, 400, 403)
    time.sleep(0.2)
    assert plain_origin.untouched(), plain_origin.requests
    assert plain_origin.connections == 0


def test_a_tunnel_passed_through_relays_only_tls(
    sproxy: Proxy, tls_origin: RawListener, clean: None
) -> None:
    """A host whose TLS is passed through blind: bytes that are not TLS are not relayed."""
    with tunnel(sproxy, tls_origin.port, "blind.test") as sock:
        status = send_split(sock, b"SSH-2.0-OpenSSH_9.2\r\n", b"\x00\x00\x01\x0c")
    assert status in (None, 400)
    time.sleep(0.2)
    assert (tls_origin.connections, tls_origin.bytes_received) == (0, 0)


@pytest.mark.parametrize("host", ["strict.test", "blind.test"])
def test_a_token_on_the_connect_is_refused(
    sproxy: Proxy, tls_origin: RawListener, clean: None, host: str
) -> None:
    """A policy that accepts no tokens refuses one on the CONNECT (inside a tunnel passed
    through, blind.test, the proxy could not see one at all): refused, nothing dialed."""
    response = connect_answer(
        sproxy.port, f"{host}:{tls_origin.port}",
        [("Proxy-Authorization", proxy_auth("strict-1", KEY)), ("Proxy-Tokenizer", "")],
    )
    assert (response.status, response.reason) == (403, "tokens_not_allowed")
    assert (tls_origin.connections, tls_origin.bytes_received) == (0, 0)


def test_split_method_inside_intercepted_tls_reaches_nothing(
    sproxy: Proxy, tls_origin: RawListener, clean: None
) -> None:
    context = ssl.create_default_context(cafile=str(sproxy.ca))
    with tunnel(sproxy, tls_origin.port) as raw, context.wrap_socket(
        raw, server_hostname="strict.test"
    ) as sock:
        assert sock.selected_alpn_protocol() is None
        status = send_split(sock, b"DE", b"LETE /forbidden HTTP/1.1\r\nHost: strict.test\r\n\r\n")
    assert status == 403
    time.sleep(0.2)
    assert (tls_origin.connections, tls_origin.bytes_received) == (0, 0)


def test_a_switch_to_anything_but_websocket_is_refused(
    tmp_path: Path, proxy_with: ProxyFactory
) -> None:
    """A GET the rule allows, answered 101 to another protocol: what follows would be relayed
    raw to the origin, past every rule. The switch is refused and the connection closed."""
    switcher = _Switcher()
    try:
        with proxy_with(rules(switcher.port), directory=tmp_path) as proxy:
            with tunnel(proxy, switcher.port) as sock:
                sock.sendall(
                    b"GET /allowed/up HTTP/1.1\r\nHost: strict.test\r\n"
                    b"Connection: Upgrade\r\nUpgrade: raw\r\n\r\n"
                )
                with contextlib.suppress(NoResponse):
                    read_response(sock, timeout=3)
                with contextlib.suppress(OSError):
                    time.sleep(0.2)
                    sock.sendall(FORBIDDEN)
                    time.sleep(0.3)
            assert switcher.after_switch == b""
            proxy.wait_audit(lambda e: e.get("reason") == "protocol_not_allowed")
    finally:
        switcher.stop()


class _Switcher:
    """Answers the first request with 101 to a non-WebSocket protocol and records what comes
    after the switch."""

    def __init__(self) -> None:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(5)
        self.port = int(self.sock.getsockname()[1])
        self.after_switch = b""
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(2)
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    if not (data := conn.recv(4096)):
                        return
                    head += data
                conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                             b"Upgrade: raw\r\n\r\n")
                self.after_switch = head.partition(b"\r\n\r\n")[2]
                while data := conn.recv(4096):
                    self.after_switch += data

    def stop(self) -> None:
        self.sock.close()
        self._thread.join(timeout=5)


# -- transparent mode ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox_ns() -> Iterator[Netns]:
    with netns() as ns:
        yield ns


def test_split_method_in_transparent_tls_reaches_nothing(
    tmp_path: Path, dns: StubDNS, sandbox_ns: Netns, tls_origin: RawListener, clean: None
) -> None:
    """The sandbox dials the origin's port on its link; nftables sends it to the transparent
    listener, which names the destination by SNI and intercepts it (the rule limits methods)."""
    proxy = Proxy(tmp_path, rules(tls_origin.port), resolver=dns.address,
                  transparent_host=sandbox_ns.host_ip)
    table = f"sgt_{sandbox_ns.name[4:]}"
    redirect = tmp_path / "redirect.nft"
    redirect.write_text(
        f"table ip {table} {{\n chain pre {{\n  type nat hook prerouting priority dstnat;\n"
        f'  iifname "{sandbox_ns.host_if}" meta l4proto tcp redirect to :{proxy.transparent_port}'
        "\n }\n}\n"
    )
    try:
        run("nft", "-f", str(redirect))
        registered = run(
            *SEALGATE, "sources", "--state", str(proxy.state), "add", sandbox_ns.ns_ip,
            "strict-1", check=False,
        )
        assert registered.returncode == 0, registered.stderr
        client = f"""
import socket, ssl, time
ctx = ssl.create_default_context(cafile={str(proxy.ca)!r})
raw = socket.create_connection(({sandbox_ns.host_ip!r}, {tls_origin.port}), timeout=5)
sock = ctx.wrap_socket(raw, server_hostname="strict.test")
sock.sendall(b"GE")
time.sleep({PAUSE})
try:
    sock.sendall(b"T /forbidden HTTP/1.1\\r\\nHost: strict.test\\r\\n\\r\\n")
    print(sock.recv(200).split(b"\\r\\n")[0].decode())
except OSError as exc:
    print("closed", exc)
"""
        out = sandbox_ns.exec("python3", "-c", client, timeout=20)
        assert "403" in out.stdout or "closed" in out.stdout, (out.stdout, out.stderr)
        time.sleep(0.2)
        assert (tls_origin.connections, tls_origin.bytes_received) == (0, 0)
    finally:
        run("nft", "delete", "table", "ip", table, check=False)
        proxy.stop()

