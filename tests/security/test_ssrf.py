"""The SSRF evasion checklist (docs: research/ssrf.md sections 3-4) against the real proxy.

Every case is sent as hand-written bytes, so no client library normalises the trick away, and
every refusal is checked three ways: the status and reason code the sandbox sees, the audit line
(decision deny, nothing pinned, nothing dialed), and the targets themselves. Those are the HTTP(S)
origins on 127.0.0.1 plus a trap on 127.0.0.2 and ::1 at the same ports, so a loopback spelling
that slipped through would be counted wherever it landed.

Two proxies are used. The session proxy (policy `ci`, enforce mode) shows realistic rules. The
module's own proxy puts its sandboxes in *report* mode, so the policy layer lets everything
through (even IP literals, which `*` never matches) and the guard alone decides:
  guard-1  allow_networks [127.0.0.1/32]: the origins are reachable, nothing else is.
  wide-1   allow_networks covering link-local, CGNAT, 192.0.0.0/24, Azure's WireServer, fd00::/8
           and fe80::/10: the cloud metadata endpoints inside them must stay denied.
Nothing here can reach a non-loopback address unless the guard is broken; the test machine has
no route to one either.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import KEYS
from tests.dnsstub import StubDNS
from tests.harness import Origin, Proxy, ProxyFactory, key_digest
from tests.security.rawclient import (
    LoopbackTrap,
    RawResponse,
    connect_answer,
    exchange,
    open_tunnel,
    proxy_auth,
    read_response,
    request_bytes,
    tls_wrap,
)

GUARD = ("guard-1", "guard-1-key")
WIDE = ("wide-1", "wide-1-key")
SESSION = ("bot-1", KEYS["bot-1"])

_WIDE_NETWORKS = (
    "127.0.0.1/32, 169.254.0.0/16, 100.64.0.0/10, 168.63.129.0/24, 192.0.0.0/24,"
    " 'fd00::/8', 'fe80::/10'"
)

# Names the stub resolver answers for this module (all under .ssrf.test, so nothing else in the
# suite shares their cache entries).
_ZONE: dict[str, tuple[str, ...]] = {
    "ok.ssrf.test": ("A 127.0.0.1",),
    "private.ssrf.test": ("A 10.0.0.1",),
    "cgnat.ssrf.test": ("A 100.64.0.1",),
    "zero.ssrf.test": ("A 0.0.0.0",),
    "loop2.ssrf.test": ("A 127.0.0.2",),
    "loop6.ssrf.test": ("AAAA ::1",),
    "mapped-meta.ssrf.test": ("AAAA ::ffff:a9fe:a9fe",),
    "nat64-meta.ssrf.test": ("AAAA 64:ff9b::a9fe:a9fe",),
    "imds.ssrf.test": ("A 169.254.169.254",),
    "ecs.ssrf.test": ("A 169.254.170.2",),
    "imds6.ssrf.test": ("AAAA fd00:ec2::254",),
    "wireserver.ssrf.test": ("A 168.63.129.16",),
    "mixed-v4.ssrf.test": ("A 127.0.0.1", "A 10.1.2.3"),
    "mixed-order.ssrf.test": ("A 10.1.2.3", "A 127.0.0.1"),
    "mixed-family.ssrf.test": ("A 127.0.0.1", "AAAA ::1"),
    "cname-meta.ssrf.test": ("CNAME metadata.google.internal",),
    "cname-private.ssrf.test": ("CNAME private.ssrf.test",),
    "metadata.google.internal": ("A 169.254.169.254",),
}


@dataclass(frozen=True)
class Targets:
    http: Origin
    https: Origin
    trap: LoopbackTrap

    def untouched(self) -> bool:
        return self.http.untouched() and self.https.untouched() and self.trap.connections == 0


@pytest.fixture(scope="module")
def guard_proxy(proxy_with: ProxyFactory, dns: StubDNS) -> Iterator[Proxy]:
    for name, records in _ZONE.items():
        dns.set(name, *records)
    sandboxes = "\n".join(
        f'  {sid}: {{policy: {policy}, key_sha256: "{key_digest(key)}"}}'
        for (sid, key), policy in ((GUARD, "guard"), (WIDE, "wide"))
    )
    rules = f"""
version: 1
policies:
  guard:
    mode: report
    allow: []
    allow_networks: [127.0.0.1/32]
  wide:
    mode: report
    allow: []
    allow_networks: [{_WIDE_NETWORKS}]
sandboxes:
{sandboxes}
default_policy: null
"""
    with proxy_with(rules, name="ssrf-proxy") as proxy:
        yield proxy


@pytest.fixture(scope="module")
def trap(origin_http: Origin, origin_https: Origin) -> Iterator[LoopbackTrap]:
    listener = LoopbackTrap([origin_http.port, origin_https.port])
    yield listener
    listener.stop()


@pytest.fixture()
def targets(origins: tuple[Origin, Origin], trap: LoopbackTrap) -> Targets:
    trap.reset()
    return Targets(origins[0], origins[1], trap)


# -- helpers ---------------------------------------------------------------------------------


def get(
    proxy: Proxy,
    url: str | bytes,
    who: tuple[str, str],
    *,
    host: str | bytes | None = "",
    extra: tuple[tuple[str | bytes, str | bytes], ...] = (),
) -> RawResponse:
    """An absolute-form GET. `host=""` sends the URL's authority as Host, None sends no Host."""
    raw_url = url if isinstance(url, bytes) else url.encode()
    if host == "":
        host = raw_url.split(b"://", 1)[-1].split(b"/", 1)[0]
    headers: list[tuple[str | bytes, str | bytes]] = [] if host is None else [("Host", host)]
    headers += [("Proxy-Authorization", proxy_auth(*who)), ("Connection", "close"), *extra]
    return exchange(proxy.port, request_bytes("GET", raw_url, headers))


def connect(proxy: Proxy, authority: str | bytes, who: tuple[str, str]) -> RawResponse:
    """A CONNECT as a client sees it: refused, or refused inside the tunnel it was given."""
    return connect_answer(proxy.port, authority, [("Proxy-Authorization", proxy_auth(*who))])


def expect_denied(proxy: Proxy, response: RawResponse, status: int, reason: str) -> None:
    """Refused by the proxy with this reason, and the audit line shows nothing was dialed."""
    assert (response.status, response.reason) == (status, reason), response.body[:300]
    body = response.json()
    assert body["reason"] == reason
    line = proxy.wait_audit(lambda e: e.get("request_id") == body["request_id"])
    assert line["decision"] == "deny"
    assert line["reason"] == reason
    assert line["address"] is None
    assert line["connect_ms"] is None


def expect_bad_request(response: RawResponse, *reasons: str) -> None:
    """A 400: the proxy's own (with one of `reasons`) or, for what mitmproxy's HTTP parser
    rejects before any hook runs, `bad_request` (proxy.upstream answers for the parser)."""
    assert response.status == 400, (response.status, response.body[:300])
    assert response.reason in (*reasons, "bad_request"), response.body[:300]
    assert b"Traceback" not in response.body


def ask(
    proxy: Proxy, form: str, host: str, targets: Targets, who: tuple[str, str]
) -> RawResponse:
    """One destination asked for two ways: absolute-form to the HTTP origin's port, or CONNECT
    to the HTTPS origin's."""
    if form == "absolute":
        return get(proxy, f"http://{host}:{targets.http.port}/", who)
    return connect(proxy, f"{host}:{targets.https.port}", who)


# -- A. numeric IPv4 spellings ----------------------------------------------------------------

NUMERIC_V4 = [
    "2130706433",
    "0x7f000001",
    "017700000001",
    "0177.0.0.1",
    "0x7f.1",
    "0x7f.0.0.1",
    "127.1",
    "127.0.1",
    "127.000.000.001",
    "0",
    "0x",
    "425.510.425.510",
    "7147006462",
    "0251.0376.0251.0376",  # 169.254.169.254 in octal
    "2852039166",  # 169.254.169.254 as one number
]


def fullwidth(text: str) -> str:
    """`text` with its ASCII digits in their fullwidth forms (U+FF10-U+FF19)."""
    return text.translate({c: c + 0xFEE0 for c in b"0123456789"})


def dots(text: str, dot: str) -> str:
    return text.replace(".", dot)


IDEOGRAPHIC_STOP, FULLWIDTH_STOP = "\u3002", "\uff0e"
# Not ASCII: mitmproxy's request-line parser refuses these bytes; if it ever stops doing so, the
# proxy must still answer 400 (or, after UTS-46 mapping, treat them as the canonical address).
UNICODE_V4 = [
    fullwidth("127.0.0.1"),
    dots("127.0.0.1", IDEOGRAPHIC_STOP),
    fullwidth("169.254.169.254"),
    dots("127.0.0.1", FULLWIDTH_STOP),
]


@pytest.mark.parametrize("spelling", NUMERIC_V4 + UNICODE_V4)
def test_numeric_host_in_request_line_is_400(
    guard_proxy: Proxy, targets: Targets, spelling: str
) -> None:
    port = targets.http.port
    response = get(guard_proxy, f"http://{spelling}:{port}/", GUARD)
    expect_bad_request(response, "host_numeric")
    if spelling.isascii():
        assert response.reason == "host_numeric"
    assert targets.untouched()


@pytest.mark.parametrize("spelling", NUMERIC_V4 + UNICODE_V4)
def test_numeric_host_as_connect_authority_is_400(
    guard_proxy: Proxy, targets: Targets, spelling: str
) -> None:
    response = connect(guard_proxy, f"{spelling}:{targets.https.port}", GUARD)
    expect_bad_request(response, "host_numeric")
    if spelling.isascii():
        assert response.reason == "host_numeric"
    assert targets.untouched()


@pytest.mark.parametrize(
    ("spelling", "outcome"),
    [
        ("2130706433", "host_numeric"),
        ("0x7f.1", "host_numeric"),
        ("127.1", "host_numeric"),
        ("0", "host_numeric"),
        # UTS-46 maps these to 127.0.0.1 exactly: the same destination as the URI, so allowed.
        (fullwidth("127.0.0.1"), "same"),
        (dots("127.0.0.1", IDEOGRAPHIC_STOP), "same"),
        ("127.0.0.1.", "same"),
        # ...and this one to 127.0.0.2, which is not the URI's host.
        (fullwidth("127.0.0.2"), "name_mismatch"),
    ],
)
def test_numeric_host_header_is_canonicalised(
    guard_proxy: Proxy, targets: Targets, spelling: str, outcome: str
) -> None:
    port = targets.http.port
    response = get(guard_proxy, f"http://127.0.0.1:{port}/h", GUARD, host=f"{spelling}:{port}")
    if outcome == "same":
        assert response.status == 200, response.body[:300]
        assert len(targets.http.requests) == 1
        return
    if outcome == "host_numeric":
        expect_denied(guard_proxy, response, 400, outcome)
    else:
        expect_denied(guard_proxy, response, 403, outcome)
    assert targets.untouched()


@pytest.mark.parametrize("form", ["absolute", "connect"])
def test_trailing_dot_ip_is_the_canonical_address(
    proxy: Proxy, targets: Targets, form: str
) -> None:
    """`127.0.0.1.` is 127.0.0.1: allowed by the session's `127.0.0.1` rule and its network."""
    if form == "absolute":
        response = get(proxy, f"http://127.0.0.1.:{targets.http.port}/dot", SESSION)
        assert response.status == 200, response.body[:300]
        assert targets.http.requests[-1].path == "/dot"
    else:
        assert connect(proxy, f"127.0.0.1.:{targets.https.port}", SESSION).status == 200
    assert targets.trap.connections == 0


# -- canonical IPv4 literals in denied ranges ---------------------------------------------------

IPV4 = [
    ("0.0.0.0", "this_network"),  # reaches localhost on Linux
    ("0.1.2.3", "this_network"),
    ("127.0.0.2", "loopback"),
    ("127.255.255.254", "loopback"),
    ("10.0.0.1", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("100.64.0.1", "cgnat"),
    ("169.254.1.1", "link_local"),
    ("192.0.0.8", "ietf_protocol"),
    ("192.0.2.1", "documentation"),
    ("198.18.0.1", "benchmarking"),
    ("192.88.99.1", "6to4_relay"),
    ("224.0.0.1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "broadcast"),
]


@pytest.mark.parametrize(("host", "reason"), IPV4)
@pytest.mark.parametrize("form", ["absolute", "connect"])
def test_ipv4_literal_in_denied_range(
    guard_proxy: Proxy, targets: Targets, host: str, reason: str, form: str
) -> None:
    response = ask(guard_proxy, form, host, targets, GUARD)
    expect_denied(guard_proxy, response, 403, reason)
    assert targets.untouched()


# -- B/C. IPv6 forms ---------------------------------------------------------------------------

IPV6 = [
    ("[::1]", "loopback"),
    ("[0:0::1]", "loopback"),
    ("[0000:0000:0000:0000:0000:0000:0000:0001]", "loopback"),
    ("[::]", "unspecified"),
    ("[::ffff:127.0.0.2]", "loopback"),  # mapped: judged as 127.0.0.2
    ("[::ffff:7f00:2]", "loopback"),
    ("[::ffff:a9fe:a9fe]", "metadata"),
    ("[::127.0.0.2]", "loopback"),  # IPv4-compatible (deprecated)
    ("[::127.0.0.1]", "loopback"),  # compatible form of an *allowed* address: still denied
    ("[::ffff:0:7f00:1]", "loopback"),  # IPv4-translated form of the allowed 127.0.0.1
    ("[::a9fe:a9fe]", "metadata"),
    ("[64:ff9b::a9fe:a9fe]", "metadata"),  # NAT64 of the metadata address
    ("[64:ff9b::7f00:2]", "loopback"),
    ("[64:ff9b:1::a9fe:a9fe]", "metadata"),  # local-use NAT64
    ("[2002:a9fe:a9fe::1]", "metadata"),  # 6to4
    ("[2002:7f00:2::1]", "loopback"),
    ("[2001:0:102:304::5601:5601]", "metadata"),  # Teredo, client 169.254.169.254
    ("[2001:0:a00:1::f7ff:fffe]", "private"),  # Teredo, server 10.0.0.1
    ("[fe80::1]", "link_local"),
    ("[fe80::a9fe:a9fe]", "metadata"),
    ("[fc00::1]", "unique_local"),
    ("[fec0::1]", "site_local"),
    ("[ff02::1]", "multicast"),
    ("[100::1]", "discard"),
    ("[2001:db8::1]", "documentation"),
]


@pytest.mark.parametrize(("host", "reason"), IPV6)
def test_ipv6_literal_in_request_line(
    guard_proxy: Proxy, targets: Targets, host: str, reason: str
) -> None:
    response = get(guard_proxy, f"http://{host}:{targets.http.port}/", GUARD)
    expect_denied(guard_proxy, response, 403, reason)
    assert targets.untouched()


@pytest.mark.parametrize(("host", "reason"), IPV6)
def test_ipv6_literal_as_connect_authority(
    guard_proxy: Proxy, targets: Targets, host: str, reason: str
) -> None:
    response = connect(guard_proxy, f"{host}:{targets.https.port}", GUARD)
    expect_denied(guard_proxy, response, 403, reason)
    assert targets.untouched()


MALFORMED_V6 = [
    ("[fe80::1%25eth0]", "host_invalid_char"),  # zone id, URI-escaped
    ("[fe80::1%eth0]", "host_invalid_char"),
    ("[::1%lo]", "host_invalid_char"),
    ("::1", "host_ipv6_unbracketed"),
    ("[::1", "host_invalid_char"),
    ("[127.0.0.1]", "host_invalid_char"),  # brackets hold IPv6 only
    ("[example.com]", "host_invalid_char"),  # GHSA-qwrf-gfpj-qvj6
    ("[[::1]]", "host_invalid_char"),
]


@pytest.mark.parametrize(("host", "reason"), MALFORMED_V6)
@pytest.mark.parametrize("form", ["absolute", "connect"])
def test_malformed_ipv6_is_400(
    guard_proxy: Proxy, targets: Targets, host: str, reason: str, form: str
) -> None:
    response = ask(guard_proxy, form, host, targets, GUARD)
    expect_bad_request(response, reason)
    assert targets.untouched()


# -- 4. cloud metadata, by address and by name ------------------------------------------------

METADATA_ADDRESSES = [
    "169.254.169.254",  # AWS/GCP/Azure/OCI/DO/OpenStack IMDS
    "169.254.170.2",  # AWS ECS
    "169.254.170.23",  # AWS EKS Pod Identity
    "169.254.169.253",  # AWS VPC DNS
    "169.254.169.123",  # AWS time sync
    "169.254.0.23",  # Tencent
    "169.254.42.42",  # Scaleway
    "168.63.129.16",  # Azure WireServer: a public address
    "100.100.100.200",  # Alibaba
    "192.0.0.192",  # OCI classic
    "[fd00:ec2::254]",
    "[fd00:ec2::23]",
    "[fd20:ce::254]",
    "[fd00:a9fe:a9fe::1]",
    "[fe80::a9fe:a9fe]",
    "[fd00:42::42]",
    "[::ffff:169.254.169.254]",
    "[::ffff:a9fe:aa02]",  # mapped 169.254.170.2
    "[64:ff9b::a83f:8110]",  # NAT64 of 168.63.129.16
]


@pytest.mark.parametrize("address", METADATA_ADDRESSES)
@pytest.mark.parametrize("form", ["absolute", "connect"])
def test_metadata_address_denied_even_inside_allow_networks(
    guard_proxy: Proxy, targets: Targets, address: str, form: str
) -> None:
    if form == "absolute":
        response = get(guard_proxy, f"http://{address}/latest/meta-data/", WIDE)
    else:
        response = connect(guard_proxy, f"{address}:443", WIDE)
    expect_denied(guard_proxy, response, 403, "metadata")


@pytest.mark.parametrize(
    "name", ["imds.ssrf.test", "ecs.ssrf.test", "imds6.ssrf.test", "wireserver.ssrf.test"]
)
def test_name_resolving_to_metadata_denied_inside_allow_networks(
    guard_proxy: Proxy, name: str
) -> None:
    response = get(guard_proxy, f"http://{name}/latest/meta-data/", WIDE)
    expect_denied(guard_proxy, response, 403, "metadata")


DENIED_NAMES = [
    ("metadata", "metadata_name"),
    ("metadata.google.internal", "metadata_name"),
    ("METADATA.Google.Internal.", "metadata_name"),
    ("computemetadata.metadata.google.internal", "metadata_name"),
    ("metadata.goog", "metadata_name"),
    ("instance-data", "metadata_name"),
    ("instance-data.", "metadata_name"),
    ("foo.internal", "internal_name"),
    ("printer.local", "internal_name"),
    ("host.localdomain", "internal_name"),
    ("router.home.arpa", "internal_name"),
    ("1.0.0.127.in-addr.arpa", "internal_name"),
    ("localhost", "localhost_name"),
    ("LocalHost.", "localhost_name"),
    ("a.localhost", "localhost_name"),
    ("ip6-localhost", "localhost_name"),
    ("intranet", "single_label"),
    ("kubernetes", "single_label"),
]


@pytest.mark.parametrize(("name", "reason"), DENIED_NAMES)
@pytest.mark.parametrize("form", ["absolute", "connect"])
def test_denied_names_are_refused_without_resolving(
    guard_proxy: Proxy, dns: StubDNS, targets: Targets, name: str, reason: str, form: str
) -> None:
    response = ask(guard_proxy, form, name, targets, WIDE)
    expect_denied(guard_proxy, response, 403, reason)
    canonical = name.lower().rstrip(".")
    assert not [q for q in dns.queries if q[0] == canonical], "a denied name was resolved"
    assert targets.untouched()


def test_localhost_denied_even_when_a_rule_names_it(proxy: Proxy, targets: Targets) -> None:
    """The session's `ci` policy lists `localhost` and opens 127.0.0.1: the name stays denied."""
    response = get(proxy, f"http://localhost:{targets.http.port}/", SESSION)
    expect_denied(proxy, response, 403, "localhost_name")
    assert targets.untouched()


# -- F. names that resolve inside --------------------------------------------------------------

INSIDE = [
    ("private.ssrf.test", "private", "10.0.0.1"),
    ("cgnat.ssrf.test", "cgnat", "100.64.0.1"),
    # The host itself whatever allow_networks say (connect() makes 0.0.0.0 the host).
    ("zero.ssrf.test", "host_address", "0.0.0.0"),
    ("loop2.ssrf.test", "loopback", "127.0.0.2"),
    ("loop6.ssrf.test", "loopback", "::1"),
    ("mapped-meta.ssrf.test", "metadata", "a9fe"),
    ("nat64-meta.ssrf.test", "metadata", "a9fe"),
    # Any answer denied denies the name, whichever order the answers come in.
    ("mixed-v4.ssrf.test", "private", "10.1.2.3"),
    ("mixed-order.ssrf.test", "private", "10.1.2.3"),
    ("mixed-family.ssrf.test", "loopback", "::1"),
    ("cname-meta.ssrf.test", "metadata", "169.254"),
    ("cname-private.ssrf.test", "private", "10.0.0.1"),
]


@pytest.mark.parametrize(("name", "reason", "address"), INSIDE)
@pytest.mark.parametrize("form", ["absolute", "connect"])
def test_name_resolving_inside_is_denied(
    guard_proxy: Proxy, targets: Targets, name: str, reason: str, address: str, form: str
) -> None:
    response = ask(guard_proxy, form, name, targets, GUARD)
    expect_denied(guard_proxy, response, 403, reason)
    # No oracle: the sandbox is not told what an internal name resolves to.
    assert address.encode() not in response.body
    assert targets.untouched()


@pytest.mark.parametrize(
    ("name", "reason"),
    [("evil.test", "private"), ("mixed.test", "private"), ("meta.test", "metadata"),
     ("v6meta.test", "metadata")],
)
def test_allowed_names_resolving_inside_are_denied_by_enforcing_policy(
    proxy: Proxy, targets: Targets, name: str, reason: str
) -> None:
    """The session policy allows these names by rule; their addresses still decide."""
    response = get(proxy, f"http://{name}:{targets.http.port}/", SESSION)
    expect_denied(proxy, response, 403, reason)
    assert targets.untouched()


def test_positive_control_name_resolving_to_allowed_network(
    guard_proxy: Proxy, targets: Targets
) -> None:
    response = get(guard_proxy, f"http://ok.ssrf.test:{targets.http.port}/fine", GUARD)
    assert response.status == 200
    assert targets.http.requests[-1].path == "/fine"
    assert targets.trap.connections == 0


# -- G. rebinding ------------------------------------------------------------------------------


def test_rebinding_never_reaches_the_second_address(
    guard_proxy: Proxy, dns: StubDNS, targets: Targets
) -> None:
    """A name that first resolves to an allowed address, then (TTL 0) to a private one.

    The guard resolves on every request and every upstream dial; its cache keeps an answer at
    least 1 s (min_ttl), so within a request both see the same answer, and once it expires the
    new answer is classified before anything uses it. This proves: the first request reaches the
    origin; after the cache expires, a request on the *same* client connection (whose upstream
    keep-alive connection to the old address still exists) is refused with `private` instead of
    being sent down the old connection; a fresh connection is refused too; no audit line ever
    pins or dials the second address; and the resolver really was asked again.
    """
    name = "rebind.ssrf.test"
    dns.sequence(name, ["A 127.0.0.1"], ["A 10.0.0.1"], ttl=0)
    port = targets.http.port
    auth = ("Proxy-Authorization", proxy_auth(*GUARD))

    def request(path: str) -> bytes:
        target = f"http://{name}:{port}{path}"
        return request_bytes("GET", target, [("Host", f"{name}:{port}"), auth])

    with socket.create_connection(("127.0.0.1", guard_proxy.port), timeout=5) as sock:
        sock.sendall(request("/first"))
        assert read_response(sock).status == 200
        assert [r.path for r in targets.http.requests] == ["/first"]
        time.sleep(1.3)  # past the resolver's 1 s minimum TTL
        sock.sendall(request("/second"))
        second = read_response(sock)
    expect_denied(guard_proxy, second, 403, "private")
    third = get(guard_proxy, f"http://{name}:{port}/third", GUARD)
    expect_denied(guard_proxy, third, 403, "private")
    assert [r.path for r in targets.http.requests] == ["/first"]
    assert targets.http.connections == 1
    lines = [e for e in guard_proxy.audit() if e.get("host") == name]
    assert not [e for e in lines if e.get("address") == "10.0.0.1"]
    assert sum(1 for q in dns.queries if q == (name, "A")) >= 2


# -- E/K. hostile host names -------------------------------------------------------------------

HOSTILE = [
    (b"127.0.0.1%00.evil.com", "host_invalid_char"),
    (b"127.0.0.1\x00.evil.com", "host_invalid_char"),
    (b"127.0.0.1\r.evil.com", "host_invalid_char"),
    (b"127.0.0.1 .evil.com", "host_invalid_char"),
    (b"127.0.0.1\t.evil.com", "host_invalid_char"),
    (b"evil.test%2f127.0.0.1", "host_invalid_char"),
    (b"evil.test\\.api.test", "host_invalid_char"),
    (b"a@127.0.0.1", "host_userinfo"),
    (b"api.test@evil.test", "host_userinfo"),
    (b"api.test:x@evil.test", "host_userinfo"),
    ("api.test\uff20evil.test".encode(), "host_userinfo"),  # fullwidth at-sign
    (b"a..b.test", "host_empty_label"),
    (b".api.test", "host_empty_label"),
    (b"api.test..", "host_empty_label"),
    (b".".join([b"a" * 63] * 4)[:254], "host_too_long"),
    (b"x" * 64 + b".test", "host_too_long"),
    (b"x" * 2000 + b".test", "host_too_long"),
    (b"[example.com]", "host_invalid_char"),
    (b"xn--zz.test", "host_idna"),
]


def _ids(cases: list[tuple[bytes, str]]) -> list[str]:
    return [repr(host)[2:42] for host, _ in cases]


@pytest.mark.parametrize(("host", "reason"), HOSTILE, ids=_ids(HOSTILE))
def test_hostile_host_in_request_line_is_400(
    guard_proxy: Proxy, targets: Targets, host: bytes, reason: str
) -> None:
    url = b"http://" + host + b":%d/" % targets.http.port
    expect_bad_request(get(guard_proxy, url, GUARD, host=None), reason)
    assert targets.untouched()


@pytest.mark.parametrize(("host", "reason"), HOSTILE, ids=_ids(HOSTILE))
def test_hostile_host_as_connect_authority_is_400(
    guard_proxy: Proxy, targets: Targets, host: bytes, reason: str
) -> None:
    response = connect(guard_proxy, host + b":%d" % targets.https.port, GUARD)
    expect_bad_request(response, reason)
    assert targets.untouched()


@pytest.mark.parametrize(("host", "reason"), HOSTILE, ids=_ids(HOSTILE))
def test_hostile_host_header_is_400_with_reason(
    guard_proxy: Proxy, targets: Targets, host: bytes, reason: str
) -> None:
    """In a Host header mitmproxy does not pre-filter: the proxy's own parser must refuse it."""
    port = targets.http.port
    response = get(guard_proxy, f"http://127.0.0.1:{port}/", GUARD, host=host + b":%d" % port)
    expect_denied(guard_proxy, response, 400, reason)
    assert targets.untouched()


@pytest.mark.parametrize(("host", "reason"), HOSTILE, ids=_ids(HOSTILE))
def test_hostile_host_inside_tunnel_is_400_with_reason(
    guard_proxy: Proxy, targets: Targets, host: bytes, reason: str
) -> None:
    """Inside an intercepted tunnel the Host header is the request's only other name."""
    port = targets.https.port
    sock, head = open_tunnel(
        guard_proxy.port, f"ok.ssrf.test:{port}", [("Proxy-Authorization", proxy_auth(*GUARD))]
    )
    with sock:
        assert head.status == 200
        with tls_wrap(sock, "ok.ssrf.test", _trust(guard_proxy)) as tls:
            tls.sendall(request_bytes("GET", "/", [("Host", host + b":%d" % port),
                                                   ("Connection", "close")]))
            response = read_response(tls)
    expect_denied(guard_proxy, response, 400, reason)
    assert targets.untouched()


def _trust(proxy: Proxy) -> Path:
    bundle = proxy.workdir / "trust.pem"
    if not bundle.exists():
        bundle.write_text(proxy.ca.read_text())
    return bundle


@pytest.mark.parametrize(
    "headers",
    [
        [("Host", "127.0.0.1:{port}"), ("Host", "evil.test:{port}")],
        [("Host", "evil.test:{port}"), ("Host", "127.0.0.1:{port}")],
        [("Host", "127.0.0.1:{port}"), ("Host", "127.0.0.1:{port}")],
        [("Host", "127.0.0.1:{port}\r\n evil.test")],  # obsolete line folding
        [("Host", "")],
    ],
    ids=["second-differs", "first-differs", "repeated", "folded", "empty"],
)
def test_ambiguous_host_headers_are_400(
    guard_proxy: Proxy, targets: Targets, headers: list[tuple[str, str]]
) -> None:
    """RFC 9112 3.2: more than one Host, or an invalid one, is a 400; never a guess."""
    port = targets.http.port
    extra = tuple((name, value.format(port=port)) for name, value in headers)
    response = get(guard_proxy, f"http://127.0.0.1:{port}/", GUARD, host=None, extra=extra)
    expect_bad_request(
        response, "host_empty", "host_ipv6_unbracketed", "host_invalid_char", "port_invalid",
        "bad_request",
    )
    assert targets.untouched()


# -- L. ports ----------------------------------------------------------------------------------

BAD_PORTS = ["0", "65536", "99999", "-1", "+80", "0080", "", "8o", "0x50"]


@pytest.mark.parametrize("port", BAD_PORTS)
@pytest.mark.parametrize("with_host", [True, False], ids=["with-host", "no-host"])
def test_bad_port_in_request_line_is_400(
    guard_proxy: Proxy, targets: Targets, port: str, with_host: bool
) -> None:
    """Both with a Host header repeating the authority and without one (only the URI counts)."""
    response = get(
        guard_proxy, f"http://127.0.0.1:{port}/", GUARD, host="" if with_host else None
    )
    expect_bad_request(response, "port_invalid", "bad_request")
    assert targets.untouched()


@pytest.mark.parametrize("port", BAD_PORTS)
def test_bad_port_as_connect_authority_is_400(
    guard_proxy: Proxy, targets: Targets, port: str
) -> None:
    expect_bad_request(connect(guard_proxy, f"127.0.0.1:{port}", GUARD), "port_invalid")
    assert targets.untouched()


@pytest.mark.parametrize("form", ["absolute", "absolute-default-port", "connect"])
def test_port_outside_rule_is_not_allowed(proxy: Proxy, targets: Targets, form: str) -> None:
    if form == "absolute":
        response = get(proxy, "http://api.test:1/", SESSION)
    elif form == "absolute-default-port":
        response = get(proxy, "http://api.test/", SESSION)
    else:
        response = connect(proxy, "api.test:1", SESSION)
    expect_denied(proxy, response, 403, "not_allowed")
    assert targets.untouched()


# -- M. schemes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://127.0.0.1:{port}/",
        "gopher://127.0.0.1:{port}/_GET%20/",
        "file:///etc/passwd",
        "dict://127.0.0.1:{port}/info",
        "ldap://127.0.0.1:{port}/",
        "ws://127.0.0.1:{port}/",
        "jar:http://127.0.0.1:{port}/!/",
    ],
)
def test_non_http_scheme_is_400(guard_proxy: Proxy, targets: Targets, url: str) -> None:
    response = get(guard_proxy, url.format(port=targets.http.port), GUARD)
    expect_bad_request(response, "scheme_invalid")
    assert targets.untouched()


# -- DNS failures ------------------------------------------------------------------------------


def test_nxdomain_is_502(proxy: Proxy, targets: Targets) -> None:
    response = get(proxy, f"http://nx.test:{targets.http.port}/", SESSION)
    expect_denied(proxy, response, 502, "dns_nxdomain")
    assert targets.untouched()


def test_unanswered_lookup_is_504_within_bound(proxy: Proxy, targets: Targets) -> None:
    started = time.monotonic()
    response = exchange(
        proxy.port,
        request_bytes(
            "GET",
            f"http://slow.test:{targets.http.port}/",
            [("Host", f"slow.test:{targets.http.port}"),
             ("Proxy-Authorization", proxy_auth(*SESSION)), ("Connection", "close")],
        ),
        timeout=12,
    )
    assert time.monotonic() - started < 10
    expect_denied(proxy, response, 504, "dns_timeout")
    assert targets.untouched()
