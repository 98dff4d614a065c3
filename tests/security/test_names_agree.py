"""One connection, one destination: the CONNECT authority, TLS SNI, Host and URI must agree.

A client can name its destination up to four times (CONNECT authority, SNI, absolute URI, Host).
The policy and the guard judge one of them, and an upstream (a CDN, a virtual host) routes on
another; if they may differ, the check is on the wrong name (domain fronting, research/ssrf.md
3.I and 3.J). Every case here is sent as raw bytes through the session proxy, whose `ci` policy
tunnels `api.test` blind (no method or path limits) and intercepts `limited.test` (GET /ok/**
only), plus a report-mode proxy of its own where no rule could name the target port (the
proxy's own listen port, a bare listener's).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KEYS
from tests.harness import Origin, Proxy, ProxyFactory, RawListener, key_digest
from tests.security.rawclient import (
    NoResponse,
    RawResponse,
    connect_answer,
    exchange,
    open_tunnel,
    proxy_auth,
    read_response,
    request_bytes,
    tls_wrap,
)

SESSION = ("bot-1", KEYS["bot-1"])
REPORT = ("report-1", "report-1-key")

AuditLine = dict[str, Any]


@pytest.fixture(scope="module")
def report_proxy(proxy_with: ProxyFactory) -> Iterator[Proxy]:
    """Report mode: the policy lets every name and port through (a rule cannot list the proxy's
    own port, chosen at start-up, nor a RawListener's), so the guard and the name checks decide.
    """
    rules = f"""
version: 1
policies:
  report:
    mode: report
    allow: []
    allow_networks: [127.0.0.1/32]
sandboxes:
  {REPORT[0]}: {{policy: report, key_sha256: "{key_digest(REPORT[1])}"}}
default_policy: null
"""
    with proxy_with(rules, name="names-agree") as p:
        yield p


def through_tunnel(
    proxy: Proxy,
    authority: str,
    sni: str | None,
    cafile: Path,
    *,
    target: str = "/",
    host: str | None = None,
    who: tuple[str, str] = SESSION,
) -> RawResponse | None:
    """CONNECT, TLS with `sni`, one request. None: the proxy killed the connection instead."""
    sock, head = open_tunnel(proxy.port, authority, [("Proxy-Authorization", proxy_auth(*who))])
    with sock:
        assert head.status == 200, head.body[:300]
        headers = [("Host", host)] if host is not None else []
        try:
            with tls_wrap(sock, sni, cafile) as tls:
                tls.sendall(request_bytes("GET", target, [*headers, ("Connection", "close")]))
                return read_response(tls)
        except (ssl.SSLError, NoResponse, ConnectionError):
            return None


def audit_mark(proxy: Proxy) -> int:
    return len(proxy.audit())


def wait_new(proxy: Proxy, mark: int, predicate: Callable[[AuditLine], bool]) -> AuditLine:
    """The first audit line after `mark` matching `predicate` (the session log is shared)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in proxy.audit()[mark:]:
            if predicate(line):
                return line
        time.sleep(0.05)
    raise AssertionError(f"no matching audit line after #{mark}: {proxy.audit()[mark:]}")


def expect_denied(response: RawResponse | None, status: int, reason: str) -> None:
    assert response is not None, "connection closed without an answer"
    assert (response.status, response.reason) == (status, reason), response.body[:300]


# -- SNI vs CONNECT ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "sni"),
    [
        ("api.test", "sni-fronted.test"),  # the rule tunnels api.test blind
        ("api.test", "api.test.sni-suffix.test"),
        ("limited.test", "sni-limited.test"),  # the rule intercepts limited.test
        ("127.0.0.1", "sni-for-ip.test"),  # an IP-literal target takes no SNI
    ],
)
def test_sni_other_than_connect_target_kills_the_connection(
    proxy: Proxy, origins: tuple[Origin, Origin], trust: Path, name: str, sni: str
) -> None:
    _, https_origin = origins
    authority = f"{name}:{https_origin.port}"
    mark = audit_mark(proxy)
    response = through_tunnel(proxy, authority, sni, trust, target="/ok/sni",
                              host=authority)
    line = wait_new(proxy, mark, lambda e: e["event"] == "tls_denied" and e.get("sni") == sni)
    assert line["reason"] == "sni_mismatch"
    assert line["target"] == authority
    # Killed, not intercepted: no inner request was read, nothing was dialed upstream.
    assert response is None, f"the connection was not killed: {response}"
    assert not [e for e in proxy.audit()[mark:] if e.get("path") == "/ok/sni"]
    assert https_origin.untouched()


def test_sni_mismatch_dials_nothing(report_proxy: Proxy) -> None:
    """The same, proven at the TCP level: a bare listener as the CONNECT target sees no dial."""
    listener = RawListener()
    try:
        authority = f"api.test:{listener.port}"
        mark = audit_mark(report_proxy)
        response = through_tunnel(
            report_proxy, authority, "sni-raw.test", report_proxy.ca, host=authority, who=REPORT
        )
        line = wait_new(report_proxy, mark, lambda e: e["event"] == "tls_denied")
        assert (line["reason"], line["sni"]) == ("sni_mismatch", "sni-raw.test")
        dialed = (listener.connections, listener.bytes_received)
        assert dialed == (0, 0), f"the proxy dialed the target: (connections, bytes) {dialed}"
        assert response is None, f"the connection was not killed: {response}"
    finally:
        listener.stop()


@pytest.mark.parametrize("sni", ["api.test", "API.Test", "api.test."])
def test_sni_spelling_of_the_target_is_tunnelled(
    proxy: Proxy, origins: tuple[Origin, Origin], trust: Path, sni: str
) -> None:
    """Positive control: the check compares canonical names, and a blind tunnel sees no GET."""
    _, https_origin = origins
    authority = f"api.test:{https_origin.port}"
    mark = audit_mark(proxy)
    response = through_tunnel(proxy, authority, sni, trust, target="/blind", host=authority)
    assert response is not None and response.status == 200
    assert [r.path for r in https_origin.requests] == ["/blind"]
    closed = wait_new(
        proxy, mark, lambda e: e["event"] == "connection_closed" and e.get("target") == authority
    )
    assert closed["tunnel"] is True
    assert not [e for e in proxy.audit()[mark:] if e.get("path") == "/blind"]


@pytest.mark.parametrize(
    ("host", "status"),
    [("api.test:{port}", 200), ("other.test:{port}", 403), ("127.0.0.1:{port}", 403)],
)
def test_no_sni_is_intercepted_and_host_checked(
    proxy: Proxy, origins: tuple[Origin, Origin], trust: Path, host: str, status: int
) -> None:
    """Without SNI only the Host header says which name is meant: the tunnel is intercepted."""
    _, https_origin = origins
    port = https_origin.port
    mark = audit_mark(proxy)
    response = through_tunnel(
        proxy, f"api.test:{port}", None, trust, target="/nosni", host=host.format(port=port)
    )
    if status == 200:
        assert response is not None and response.status == 200
        assert [r.path for r in https_origin.requests] == ["/nosni"]
    else:
        expect_denied(response, 403, "name_mismatch")
        assert https_origin.untouched()
    line = wait_new(proxy, mark, lambda e: e["event"] == "request" and e.get("method") == "GET")
    assert line["decision"] == ("allow" if status == 200 else "deny")


# -- Host inside an intercepted tunnel ---------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("other.test:{port}", 403),
        ("api.test:{port}", 403),
        ("127.0.0.1:{port}", 403),  # the same address under another name
        ("limited.test:{other}", 403),
        ("limited.test:443", 403),
        ("limited.test.evil.test:{port}", 403),
        ("limited.test:{port}", 200),
        ("LIMITED.Test.:{port}", 200),
        ("limited.test", 200),  # no port: the tunnel's
        ("\u24db\u24d8\u24dc\u24d8\u24e3\u24d4\u24d3.\u24e3\u24d4\u24e2\u24e3:{port}", 200),
        (None, 200),  # no Host at all: the tunnel's name
    ],
)
def test_inner_host_must_name_the_connect_target(
    proxy: Proxy, origins: tuple[Origin, Origin], trust: Path, host: str | None, status: int
) -> None:
    http_origin, https_origin = origins
    port = https_origin.port
    inner = None if host is None else host.format(port=port, other=http_origin.port)
    response = through_tunnel(
        proxy, f"limited.test:{port}", "limited.test", trust, target="/ok/inner", host=inner
    )
    if status == 200:
        assert response is not None and response.status == 200, response
        assert [r.path for r in https_origin.requests] == ["/ok/inner"]
    else:
        expect_denied(response, 403, "name_mismatch")
        assert https_origin.untouched() and http_origin.untouched()


@pytest.mark.parametrize(
    ("uri_host", "status"), [("evil.test:{port}", 403), ("other.test:{port}", 403),
                             ("limited.test:{port}", 200)]
)
def test_absolute_uri_inside_tunnel_must_name_the_connect_target(
    proxy: Proxy, origins: tuple[Origin, Origin], trust: Path, uri_host: str, status: int
) -> None:
    """An origin receiving absolute-form routes on the URI (RFC 9112 3.2.2), not on Host.

    So a request inside the limited.test tunnel whose URI names another host must not be
    forwarded as it is: the Host header agreeing with the tunnel is not enough.
    """
    _, https_origin = origins
    port = https_origin.port
    response = through_tunnel(
        proxy, f"limited.test:{port}", "limited.test", trust,
        target=f"https://{uri_host.format(port=port)}/ok/abs", host=f"limited.test:{port}",
    )
    if status == 200:
        assert response is not None and response.status == 200
        return
    forwarded = [r.path for r in https_origin.requests]
    assert https_origin.untouched(), f"forwarded to the origin as {forwarded}"
    expect_denied(response, 403, "name_mismatch")


# -- absolute-form URI vs Host -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri_host", "host", "status"),
    [
        ("api.test:{port}", "evil.test:{port}", 403),
        ("evil.test:{port}", "api.test:{port}", 403),
        ("api.test:{port}", "api.test:{other}", 403),
        ("api.test:{port}", "api.test", 403),  # no port: 80, not the URI's port
        ("127.0.0.1:{port}", "api.test:{port}", 403),
        ("api.test:{port}", "127.0.0.1:{port}", 403),
        ("api.test:{port}", "\u24d4\u24e5\u24d8\u24db.\u24e3\u24d4\u24e2\u24e3:{port}", 403),
        ("api.test:{port}", "API.Test.:{port}", 200),
        ("api.test:{port}", "\u24d0\u24df\u24d8.\u24e3\u24d4\u24e2\u24e3:{port}", 200),
    ],
)
def test_absolute_uri_and_host_header_must_agree(
    proxy: Proxy, origins: tuple[Origin, Origin], uri_host: str, host: str, status: int
) -> None:
    http_origin, https_origin = origins
    port, other = http_origin.port, https_origin.port
    data = request_bytes(
        "GET",
        f"http://{uri_host.format(port=port, other=other)}/agree",
        [("Host", host.format(port=port, other=other)),
         ("Proxy-Authorization", proxy_auth(*SESSION)), ("Connection", "close")],
    )
    response = exchange(proxy.port, data)
    if status == 200:
        assert response.status == 200, response.body[:300]
        assert [r.path for r in http_origin.requests] == ["/agree"]
    else:
        expect_denied(response, 403, "name_mismatch")
        assert http_origin.untouched() and https_origin.untouched()


# -- ports -------------------------------------------------------------------------------------


@pytest.mark.parametrize("port", ["1", "443", "{proxy}"])
def test_connect_to_port_outside_rule_is_403(
    proxy: Proxy, origins: tuple[Origin, Origin], port: str
) -> None:
    response = connect_answer(
        proxy.port, f"api.test:{port.format(proxy=proxy.port)}",
        [("Proxy-Authorization", proxy_auth(*SESSION))],
    )
    expect_denied(response, 403, "not_allowed")
    assert origins[0].untouched() and origins[1].untouched()


@pytest.mark.parametrize(
    ("form", "host"),
    [
        ("connect", "api.test"),
        ("connect", "127.0.0.1"),
        ("connect", "[::ffff:127.0.0.1]"),  # mapped form of the listen address
        ("absolute", "api.test"),
        ("absolute", "127.0.0.1"),
        ("absolute", "[::ffff:127.0.0.1]"),
    ],
)
def test_proxy_own_listen_port_is_a_loop(report_proxy: Proxy, form: str, host: str) -> None:
    """The proxy must not dial itself: a looped request would arrive stripped of its identity."""
    mark = audit_mark(report_proxy)
    authority = f"{host}:{report_proxy.port}"
    auth = [("Proxy-Authorization", proxy_auth(*REPORT))]
    if form == "connect":
        response = connect_answer(report_proxy.port, authority, auth)
    else:
        response = exchange(
            report_proxy.port,
            request_bytes("GET", f"http://{authority}/loop",
                          [("Host", authority), *auth, ("Connection", "close")]),
        )
    expect_denied(response, 403, "proxy_loop")
    # Give a looped request time to arrive and be logged, then make sure none did.
    wait_new(report_proxy, mark, lambda e: e.get("reason") == "proxy_loop")
    time.sleep(0.2)
    arrived = [e for e in report_proxy.audit()[mark:] if e.get("sandbox") != REPORT[0]
               and e["event"] == "request"]
    assert not arrived, f"the proxy connected to itself: {arrived}"
