"""Transparent mode in a pod (#28): `sealgate kube redirect` (the init container's table) and
`sealgate kube forward` (the sidecar, as uid 1337) in a network namespace standing for the
pod's, in front of the real proxy's explicit listener on the namespace's link.

A client in the "pod" that knows nothing of a proxy (no proxy variables, any address it
likes) is still decided by the proxy, as the pod's address's sandbox; what the proxy refuses,
and what is not TCP, reaches nothing: checked at listeners on the other side of the link,
which the namespace could reach directly without the table.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.conftest import session_rules
from tests.harness import SEALGATE, Origin, Proxy, ProxyFactory, RawListener
from tests.netns import Netns, netns, run

pytestmark = pytest.mark.root

_UID = 1337
_ELSEWHERE = "203.0.113.7"  # any address: the table sends every TCP connection to the forwarder


@pytest.fixture(scope="module")
def pod() -> Iterator[Netns]:
    with netns() as ns:
        # A pod's default route (into the test session's namespace, which leads nowhere): the
        # kernel routes a connection before the table redirects it.
        run("ip", "-n", ns.name, "route", "add", "default", "via", ns.host_ip)
        yield ns


@pytest.fixture(scope="module")
def kproxy(pod: Netns, proxy_with: ProxyFactory, origin_http: Origin, origin_https: Origin
           ) -> Iterator[Proxy]:
    with proxy_with(session_rules(origin_http.port, origin_https.port), name="kproxy",
                    listen_host=pod.host_ip) as p:
        added = subprocess.run([*SEALGATE, "sources", "--state", str(p.state), "add",
                                pod.ns_ip, "bot-1"], capture_output=True, text=True, timeout=30)
        assert added.returncode == 0, added.stderr
        yield p


@pytest.fixture(scope="module")
def forwarded(pod: Netns, kproxy: Proxy) -> Iterator[subprocess.Popen[str]]:
    """The init container's table, installed twice (a restarted init container), and the
    sidecar as its exempt uid."""
    for _ in range(2):
        done = pod.exec(*SEALGATE, "kube", "redirect", "--exempt-uid", str(_UID))
        assert done.returncode == 0, done.stderr
    tables = pod.exec("nft", "list", "tables").stdout
    assert tables.count("sealgate_redirect") == 1, tables
    sidecar = subprocess.Popen(
        ["ip", "netns", "exec", pod.name, "setpriv", f"--reuid={_UID}", f"--regid={_UID}",
         "--clear-groups", *SEALGATE, "kube", "forward", "--proxy",
         f"{pod.host_ip}:{kproxy.port}", "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while "127.0.0.1:15001" not in pod.exec("ss", "-Htln").stdout:
        assert sidecar.poll() is None and time.monotonic() < deadline, sidecar.stderr
        time.sleep(0.1)
    yield sidecar
    sidecar.terminate()
    _, stderr = sidecar.communicate(timeout=10)
    assert "Traceback" not in stderr, stderr


def _curl(pod: Netns, *args: str) -> subprocess.CompletedProcess[str]:
    # As root: any uid but the forwarder's goes through the table.
    return pod.exec("curl", "-sS", "--noproxy", "*", "--max-time", "10", "-o", "/dev/stdout",
                    "-w", "\n%{http_code}", *args)


def test_a_client_that_ignores_the_proxy_is_decided_by_it(
        pod: Netns, kproxy: Proxy, forwarded: subprocess.Popen[str], origin_https: Origin,
        origin_http: Origin) -> None:
    """Intercepted TLS (limited.test has path rules) and plain HTTP, dialed at an address
    that is no proxy's: the forwarder names them by SNI and Host, the proxy decides them as
    the pod's sandbox and reaches the origin, which gets exactly the request."""
    port = origin_https.port
    got = _curl(pod, "--cacert", str(kproxy.ca), "--resolve", f"limited.test:{port}:{_ELSEWHERE}",
                f"https://limited.test:{port}/ok/from-pod")
    assert got.stdout.endswith("200"), got
    assert origin_https.requests[-1].path == "/ok/from-pod"
    line = kproxy.wait_audit(lambda e: e.get("path") == "/ok/from-pod")
    assert (line["sandbox"], line["identified_by"]) == ("bot-1", "source"), line
    plain = _curl(pod, "-H", "Host: api.test", f"http://{_ELSEWHERE}:{origin_http.port}/plain-pod")
    assert plain.stdout.endswith("200"), plain
    assert origin_http.requests[-1].path == "/plain-pod"


def test_what_the_proxy_refuses_reaches_nothing(
        pod: Netns, kproxy: Proxy, forwarded: subprocess.Popen[str], origin_https: Origin
        ) -> None:
    """A name outside the policy, a raw connection to an address the pod could dial without
    the table, a UDP datagram, and a connection straight to the forwarder's port: nothing
    arrives at the listener or the origin (each checked there)."""
    origin_https.reset()
    port = origin_https.port
    denied = _curl(pod, "-k", "--resolve", f"other.test:{port}:{_ELSEWHERE}",
                   f"https://other.test:{port}/x")
    assert not denied.stdout.endswith("200"), denied
    assert origin_https.untouched()
    listener = RawListener(pod.host_ip, udp=True)
    try:
        there = f"('{pod.host_ip}', {listener.port})"
        probe = ("import socket\n"
                 f"s = socket.create_connection({there}, timeout=5)\n"
                 "s.sendall(b'hello\\r\\n\\r\\n'); s.settimeout(5)\n"
                 "print(s.recv(100))\n"
                 "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                 f"try:\n    u.sendto(b'x', {there})\nexcept OSError as e:\n"
                 "    print('udp', e.errno)\n")
        ran = pod.exec("python3", "-c", probe)
        assert ran.returncode == 0, ran.stderr
        assert "udp 1" in ran.stdout, ran.stdout  # EPERM: the filter chain's drop
    finally:
        listener.stop()  # counts what is still queued too
    assert (listener.connections, listener.datagrams) == (0, 0)
    # The forwarder's own port, dialed directly: no original destination, so no CONNECT.
    direct = pod.exec("python3", "-c", "import socket\ns = socket.create_connection("
                      "('127.0.0.1', 15001), timeout=5)\ns.sendall(b'GET / HTTP/1.1\\r\\n"
                      "Host: api.test\\r\\n\\r\\n')\ns.settimeout(5)\ntry:\n"
                      "    print(s.recv(100))\nexcept ConnectionResetError:\n    print('reset')")
    assert direct.stdout.strip() in ("b''", "reset"), direct
    for host in ("other.test", pod.host_ip):  # by SNI; unnamed, by the address dialed
        line = kproxy.wait_audit(lambda e, host=host: e.get("method") == "CONNECT"
                                 and e.get("host") == host)
        assert (line["sandbox"], line["decision"], line["reason"]) == (
            "bot-1", "deny", "not_allowed"), line


def test_the_table_reads_as_documented() -> None:
    """`--print` is what `install` applies (the docs quote it)."""
    printed = run(*SEALGATE, "kube", "redirect", "--print", "--dns").stdout
    assert "meta skuid 1337 return" in printed and "udp dport 53 accept" in printed
    assert "policy drop" in printed and "redirect to :15001" in printed
