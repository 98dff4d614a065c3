"""Transparent mode: a sandbox in its own network namespace, redirected by nftables.

The sandbox dials the host side of its link; an nftables REDIRECT on the host sends every TCP
connection from its veth to the proxy's transparent listener, which recovers the original
destination, attributes the connection by source address (registered through the control API)
and names the destination by SNI or Host, never by the address the sandbox chose.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import session_rules
from tests.harness import ROOT, SEALGATE, Origin, OriginCA, Proxy, ProxyFactory
from tests.netns import Netns, in_netns, netns, run
from tests.security.rawclient import request_bytes, tls_wrap, upload_whole

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def sandbox_ns() -> Iterator[Netns]:
    with netns() as ns:
        yield ns


@pytest.fixture(scope="module")
def tproxy(
    sandbox_ns: Netns, proxy_with: ProxyFactory, origin_http: Origin, origin_https: Origin,
) -> Iterator[Proxy]:
    with proxy_with(session_rules(origin_http.port, origin_https.port), name="tproxy",
                    transparent_host=sandbox_ns.host_ip) as p:
        table = f"sgt_{sandbox_ns.name[4:]}"
        rules = (
            f"table ip {table} {{\n chain pre {{\n  type nat hook prerouting priority dstnat;\n"
            f'  iifname "{sandbox_ns.host_if}" meta l4proto tcp redirect to :{p.transparent_port}\n'
            " }\n}\n"
        )
        rules_file = p.workdir / "redirect.nft"
        rules_file.write_text(rules + "\n")
        try:
            run("nft", "-f", str(rules_file))
            yield p
        finally:
            run("nft", "delete", "table", "ip", table, check=False)


def sources(p: Proxy, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SEALGATE, "sources", "--state", str(p.state), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )


def curl(ns: Netns, *args: str) -> subprocess.CompletedProcess[str]:
    return ns.exec("curl", "-sS", "--max-time", "10", "-o", "/dev/stdout", "-w", "\n%{http_code}",
                   *args)


def test_unregistered_source_gets_default_policy(
    tproxy: Proxy, sandbox_ns: Netns, origins: tuple[Origin, Origin]
) -> None:
    http_origin, _ = origins
    sources(tproxy, "rm", sandbox_ns.ns_ip)
    out = curl(sandbox_ns, "-H", "Host: api.test", f"http://{sandbox_ns.host_ip}:{http_origin.port}/t")
    assert out.stdout.endswith("407"), out
    assert http_origin.untouched()


def test_registered_source_plain_http(
    tproxy: Proxy, sandbox_ns: Netns, origins: tuple[Origin, Origin]
) -> None:
    http_origin, _ = origins
    added = sources(tproxy, "add", sandbox_ns.ns_ip, "bot-1")
    assert added.returncode == 0, added.stderr
    out = curl(sandbox_ns, "-H", "Host: api.test",
               f"http://{sandbox_ns.host_ip}:{http_origin.port}/transparent")
    assert out.stdout.endswith("200"), out
    assert http_origin.requests[-1].path == "/transparent"
    line = tproxy.wait_audit(lambda e: e.get("path") == "/transparent")
    assert line["sandbox"] == "bot-1"
    assert line["identified_by"] == "source"


def test_registered_source_https_by_sni(
    tproxy: Proxy, sandbox_ns: Netns, origins: tuple[Origin, Origin], workdir: Path
) -> None:
    _, https_origin = origins
    assert sources(tproxy, "add", sandbox_ns.ns_ip, "bot-1").returncode == 0
    # limited.test has path rules, so it is intercepted: the client must trust the proxy CA.
    out = curl(
        sandbox_ns, "--cacert", str(tproxy.ca),
        "--resolve", f"limited.test:{https_origin.port}:{sandbox_ns.host_ip}",
        f"https://limited.test:{https_origin.port}/ok/tls",
    )
    assert out.stdout.endswith("200"), out
    assert https_origin.requests[-1].path == "/ok/tls"


def test_sni_outside_policy_is_refused(
    tproxy: Proxy, sandbox_ns: Netns, origins: tuple[Origin, Origin]
) -> None:
    _, https_origin = origins
    assert sources(tproxy, "add", sandbox_ns.ns_ip, "bot-1").returncode == 0
    out = curl(
        sandbox_ns, "-k", "--resolve", f"other.test:{https_origin.port}:{sandbox_ns.host_ip}",
        f"https://other.test:{https_origin.port}/",
    )
    assert not out.stdout.endswith("200")
    assert https_origin.untouched()
    tproxy.wait_audit(lambda e: e["event"] == "tls_denied" and e["reason"] == "not_allowed")


def test_passed_through_tls_goes_to_the_sni_name_not_the_dialed_address(
    tproxy: Proxy, sandbox_ns: Netns, origins: tuple[Origin, Origin], test_ca: OriginCA
) -> None:
    """api.test has no method or path rule, so its TLS is passed through undecrypted. The
    sandbox dials the host side of its link with SNI api.test: the proxy must connect to what
    api.test resolves to (the origin), never to the address the sandbox chose (which could be
    any server of the attacker's with an allowed name in the SNI)."""
    _, https_origin = origins
    assert sources(tproxy, "add", sandbox_ns.ns_ip, "bot-1").returncode == 0
    out = curl(
        sandbox_ns, "--cacert", str(test_ca.path),
        "--resolve", f"api.test:{https_origin.port}:{sandbox_ns.host_ip}",
        f"https://api.test:{https_origin.port}/passed-through",
    )
    assert out.stdout.endswith("200"), out
    assert https_origin.requests[-1].path == "/passed-through"


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_refused_upload_written_whole_reads_its_refusal(
    tproxy: Proxy, sandbox_ns: Netns, origins: tuple[Origin, Origin], tls: bool
) -> None:
    """Redirected, a request refused at its head (a body over the 10 MiB budget over HTTP; a
    POST where only GET is allowed over intercepted TLS) is answered while the client writes
    the body; the client writes it all, then reads the refusal (proxy/linger.py)."""
    assert sources(tproxy, "add", sandbox_ns.ns_ip, "bot-1").returncode == 0
    origin = origins[1] if tls else origins[0]
    host = "limited.test" if tls else "api.test"
    sock = in_netns(sandbox_ns.name, lambda: socket.create_connection(
        (sandbox_ns.host_ip, origin.port), timeout=10))
    with tls_wrap(sock, host, tproxy.ca) if tls else sock as conn:
        size = 16 * 1024 * 1024
        head = request_bytes("POST", "/ok/up", [("Host", f"{host}:{origin.port}"),
                                                ("Content-Length", str(size))])
        response = upload_whole(conn, head, size, chunked=False)
    assert (response.status, response.reason) == (
        (403, "not_allowed") if tls else (413, "request_too_large"))
    assert origin.untouched() and origin.bytes_received == 0


def test_a_chunked_upload_over_the_cap_is_cut_off_redirected(
    tproxy: Proxy, sandbox_ns: Netns, origins: tuple[Origin, Origin]
) -> None:
    """Redirected, a chunked body (no length to refuse at the head) is held to the policy's
    10 MiB cap as it streams (proxy/bodycap.py): the client reads its 413, and the origin got
    no more than the cap (tests/security/test_body_cap.py checks, with origins that read the
    framing strictly, that it never got the request's end). All 16 MiB went before."""
    assert sources(tproxy, "add", sandbox_ns.ns_ip, "bot-1").returncode == 0
    origin = origins[0]
    with in_netns(sandbox_ns.name, lambda: socket.create_connection(
            (sandbox_ns.host_ip, origin.port), timeout=10)) as conn:
        head = request_bytes("POST", "/up", [("Host", f"api.test:{origin.port}"),
                                             ("Transfer-Encoding", "chunked")])
        response = upload_whole(conn, head, 16 * 1024 * 1024, chunked=True)
    assert (response.status, response.reason) == (413, "request_too_large")
    assert origin.bytes_received <= 10 * 1024 * 1024
