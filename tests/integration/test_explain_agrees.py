"""`sealgate rules explain` must say what the running proxy does: for every reason the policy
decision (`proxy.policy.decide`) can give, one request is asked of `explain` and sent through a
real proxy, and both give the same decision and reason code.

The proxy is this module's own, with rules written for the cases (an enforcing policy, one that
accepts sealed tokens, a report-mode one where no rule is needed and the name and address checks
decide), a file secret store for the rules that inject, and its own origins: an HTTP origin on
127.0.0.1, a bare listener on another port, and a trap on the other loopback addresses (127.0.0.2,
::1) on the origin's port, so that a denied request is shown to have reached nothing.

`test_every_reason_has_a_case` keeps the list whole: the reasons are read from the code (every
`Reason` decide.py names, every name reason `denied_name` returns, every class of the
denied-address table in each address family), so a reason or address class added later without a
case here fails.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Any

import pytest
import requests

import sealgate.proxy.policy.decide as decide_module
from sealgate.hostname import canonical_host, denied_name
from sealgate.proxy.net.addresses import (
    DENIED_RANGES,
    METADATA_ADDRESSES,
    IPNetwork,
    classify,
    embedded_ipv4,
)
from sealgate.proxy.policy.explain import explain
from sealgate.proxy.policy.rulesfile import load_rules
from sealgate.reasons import Reason
from tests.dnsstub import StubDNS
from tests.harness import Origin, Proxy, ProxyFactory, RawListener, key_digest
from tests.security.rawclient import LoopbackTrap, connect_answer, proxy_auth

SECRET = "agree-canary-5c4b3a29"
KEYS = {"agree-enf": "agree-enf-key", "agree-tok": "agree-tok-key", "agree-rep": "agree-rep-key"}
PUBLIC_V4 = IPv4Address("93.184.216.34")  # public: not in the denied-address table


def _rules(http: int, bare: int) -> str:
    return f"""
version: 1
policies:
  enforcing:
    mode: enforce
    allow:
      - host: api.test
        ports: [{http}]
      - host: tunnel.test
        ports: [{bare}]
      - host: limited.test
        ports: [{http}]
        methods: [GET]
        paths: ["/ok/**"]
      - host: localhost
        ports: [{http}]
      - host: secret.test
        ports: [{http}]
        inject:
          - secret: file:agree_key
            as: bearer
      - host: 93.184.216.34
        ports: [{http}]
        plain_http: true
        inject:
          - secret: file:agree_key
            as: bearer
      - host: 127.0.0.1
        ports: [{http}]
        paths: ["/plain/**"]
        plain_http: true
        inject:
          - secret: file:agree_key
            as: bearer
      - host: 127.0.0.1
        ports: [{http}]
    allow_networks: [127.0.0.1/32]
  tokens-on:
    mode: enforce
    tokens: true
    allow:
      - host: api.test
        ports: [{http}, {bare}]
    allow_networks: [127.0.0.1/32]
  reporting:
    mode: report
    allow: []
    allow_networks: [127.0.0.1/32]
sandboxes:
  agree-enf: {{policy: enforcing, key_sha256: "{key_digest(KEYS['agree-enf'])}"}}
  agree-tok: {{policy: tokens-on, key_sha256: "{key_digest(KEYS['agree-tok'])}"}}
  agree-rep: {{policy: reporting, key_sha256: "{key_digest(KEYS['agree-rep'])}"}}
default_policy: null
"""


# -- the cases --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    sandbox: str | None  # None: no Proxy-Authorization (unidentified traffic)
    method: str
    url: str  # "{http}": the origin's port, "{bare}": the bare listener's
    decision: str
    reason: str | None
    tokens: bool = False  # Proxy-Tokenizer on the request (explain: tokens=)
    connect: bool = False  # sent as a CONNECT to the URL's authority (explain: an https URL)

    def target(self, ports: dict[str, int]) -> str:
        return self.url.format(**ports)


ENF, TOK, REP = "agree-enf", "agree-tok", "agree-rep"

DECISION_CASES = [
    Case("allow", ENF, "GET", "http://api.test:{http}/agree/1", "allow", None),
    Case("allow-rule-path", ENF, "GET", "http://limited.test:{http}/ok/agree2", "allow", None),
    Case("allow-literal", ENF, "GET", "http://127.0.0.1:{http}/agree7", "allow", None),
    Case("allow-plain-http-inject", ENF, "GET", "http://127.0.0.1:{http}/plain/agree", "allow",
         None),
    # identity: no Proxy-Authorization and default_policy null
    Case("unidentified", None, "GET", "http://api.test:{http}/agree/anon", "deny",
         "identity_required"),
    Case("unidentified-connect", None, "GET", "https://api.test:{bare}/", "deny",
         "identity_required", connect=True),
    # enforce misses: host, port, method, path; the miss comes before the address check
    Case("miss-host", ENF, "GET", "http://unlisted.test:{http}/agree6", "deny", "not_allowed"),
    Case("miss-port", ENF, "GET", "http://api.test:{bare}/agree/port", "deny", "not_allowed"),
    Case("miss-method", ENF, "POST", "http://limited.test:{http}/ok/agree3", "deny",
         "not_allowed"),
    Case("miss-path", ENF, "GET", "http://limited.test:{http}/nope/agree4", "deny",
         "not_allowed"),
    Case("miss-metadata-literal", ENF, "GET", "http://169.254.169.254:{http}/agree9", "deny",
         "not_allowed"),
    Case("miss-connect", ENF, "GET", "https://unlisted.test:{bare}/", "deny", "not_allowed",
         connect=True),
    # report mode: a miss is allowed and logged
    Case("report-miss", REP, "GET", "http://127.0.0.1:{http}/agree8", "report", "not_allowed"),
    # a rule matches, the name is never reachable
    Case("name-rule-localhost", ENF, "GET", "http://localhost:{http}/agree5", "deny",
         "localhost_name"),
    # tokens: on a policy that accepts none, on a request or a CONNECT (one that accepts them
    # takes them on a CONNECT for every request in the tunnel: tests/integration/test_base_url.py)
    Case("tokens-policy", ENF, "GET", "http://api.test:{http}/agree/tok", "deny",
         "tokens_not_allowed", tokens=True),
    Case("tokens-connect", ENF, "GET", "https://tunnel.test:{bare}/", "deny", "tokens_not_allowed",
         tokens=True, connect=True),
    # credentials over plain HTTP: a rule's inject without plain_http; a plain_http rule to a
    # public literal outside allow_networks (refused before any dial); a sealed token
    Case("inject-plain-http", ENF, "GET", "http://secret.test:{http}/agree/inj", "deny",
         "insecure_upstream"),
    Case("inject-public-literal", ENF, "GET", "http://93.184.216.34:{http}/agree/pub", "deny",
         "insecure_upstream"),
    Case("tokens-plain-http", TOK, "GET", "http://api.test:{http}/agree/tokplain", "deny",
         "insecure_upstream", tokens=True),
]

# Report mode: no rule is needed, so the name check decides.
NAMES = {
    "localhost": "localhost_name",
    "a.localhost": "localhost_name",
    "metadata.google.internal": "metadata_name",
    "db.internal": "internal_name",
    "printer.local": "internal_name",
    "kubernetes": "single_label",
}

# One literal per reason and address family of the denied table; report mode, so the address
# check decides. 127.0.0.1 is opened by allow_networks: the other loopback addresses are not,
# and they (and 0.0.0.0, ::, which reach the host) would reach the trap or the origin if dialed.
ADDRESSES = {
    "0.0.0.0": "this_network",
    "10.1.2.3": "private",
    "100.64.1.2": "cgnat",
    "127.0.0.2": "loopback",
    "169.254.1.1": "link_local",
    "192.0.0.8": "ietf_protocol",
    "192.0.2.1": "documentation",
    "192.31.196.1": "as112",
    "192.52.193.1": "amt",
    "192.88.99.1": "6to4_relay",
    "198.18.0.1": "benchmarking",
    "224.0.0.1": "multicast",
    "240.0.0.1": "reserved",
    "255.255.255.255": "broadcast",
    "169.254.169.254": "metadata",
    "4000::1": "ipv6_not_global_unicast",
    "::": "unspecified",
    "::1": "loopback",
    "::5db8:d822": "ipv4_compatible",  # ::93.184.216.34: deprecated even when public
    "::ffff:0:5db8:d822": "ipv4_translated",
    "100::1": "discard",
    "2001:100::1": "ietf_protocol",
    "2001:0:5db8:d822::a247:27dd": "ietf_protocol",  # Teredo, public server and client
    "2001:db8::1": "documentation",
    "2002:5db8:d822::1": "6to4",
    "2620:4f:8000::1": "as112",
    "5f00::1": "srv6_sid",
    "fc00::1": "unique_local",
    "fe80::1": "link_local",
    "fec0::1": "site_local",
    "ff02::1": "multicast",
    "fd00:ec2::254": "metadata",
    # Mapped and NAT64 forms are judged as the IPv4 address they carry, so the codes of their
    # own ranges (ipv4_mapped, nat64) are never answered: a denied one inside each such range.
    "::ffff:127.0.0.2": "loopback",
    "64:ff9b::a9fe:a9fe": "metadata",  # 169.254.169.254
    "64:ff9b:1::a00:1": "private",  # 10.0.0.1
}


def _authority(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


NAME_CASES = [
    Case(f"name-{name}", REP, "GET", f"http://{name}:{{http}}/agree/name/{i}", "deny", reason)
    for i, (name, reason) in enumerate(NAMES.items())
]
ADDRESS_CASES = [
    Case(f"address-{ip}", REP, "GET", f"http://{_authority(ip)}:{{http}}/agree/addr/{i}",
         "deny", reason)
    for i, (ip, reason) in enumerate(ADDRESSES.items())
]
ADDRESS_CASES.append(
    Case("address-connect-private", REP, "GET", "https://10.1.2.3:{bare}/", "deny", "private",
         connect=True)
)
CASES = DECISION_CASES + NAME_CASES + ADDRESS_CASES


# -- what the code can answer -----------------------------------------------------------------


def _named_reasons(source: Any) -> set[str]:
    """Every `Reason.MEMBER` the source of a module or function names."""
    tree = ast.parse(inspect.getsource(source))
    return {
        Reason[node.attr].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id == "Reason" and node.attr in Reason.__members__
    }


def _decide_reasons() -> set[str]:
    """Every `Reason.MEMBER` decide.py names (policy_for, decide, Decision.secure_for)."""
    return _named_reasons(decide_module)


def _name_reasons() -> set[str]:
    """Every reason `denied_name` returns."""
    return _named_reasons(denied_name)


def _judged_as_embedded(network: IPNetwork) -> bool:
    """A range that lets a public IPv4 address through in its embedded form (mapped, NAT64):
    its addresses are answered with the embedded address's reason, never with its own."""
    if network.version != 6:
        return False
    probe = IPv6Address(int(network[0]) | int(PUBLIC_V4))
    return embedded_ipv4(probe) == PUBLIC_V4 and classify(probe) is None


def _address_classes() -> set[tuple[str, int]]:
    """(reason, address family) for every class of the denied table that can be answered."""
    classes = {(r.reason, r.network.version) for r in DENIED_RANGES
               if not _judged_as_embedded(r.network)}
    return classes | {(Reason.METADATA, ip.version) for ip in METADATA_ADDRESSES}


def test_every_reason_has_a_case() -> None:
    """The cases cover every reason decide can give and every class of the address table, in
    both families; a range judged by its embedded IPv4 has a literal inside it instead."""
    address_classes = _address_classes()
    required = _decide_reasons() | _name_reasons() | {reason for reason, _ in address_classes}
    assert {"identity_required", "not_allowed", "tokens_not_allowed",
            "insecure_upstream"} <= required  # the reading of decide.py found its reasons
    for code in required:
        Reason.of(code)  # a code the enum does not know would be a bug of its own
    covered = {c.reason for c in CASES}
    assert required <= covered, f"reasons without a case: {sorted(required - covered)}"
    for case in CASES:
        assert case.reason is None or Reason.of(case.reason)

    literals = {ip_address(ip): reason for ip, reason in ADDRESSES.items()}
    have = {(reason, ip.version) for ip, reason in literals.items()}
    assert address_classes <= have, f"classes without a literal: {sorted(address_classes - have)}"
    for r in DENIED_RANGES:
        if _judged_as_embedded(r.network):
            assert any(ip in r.network for ip in literals), f"no literal inside {r.network}"
    # Each literal is what the table says it is (a typo here would test nothing).
    assert {str(ip): classify(ip) for ip in literals} == {str(ip): r for ip, r in literals.items()}
    for name, reason in NAMES.items():
        assert denied_name(canonical_host(name)) == reason, name

    # Every branch of the rules step the issue names: host, port, method, path, report.
    ids = {c.id for c in CASES}
    assert {"miss-host", "miss-port", "miss-method", "miss-path", "report-miss"} <= ids


# -- the proxy --------------------------------------------------------------------------------


@dataclass
class Rig:
    proxy: Proxy
    origin: Origin
    bare: RawListener
    trap: LoopbackTrap
    dns: StubDNS

    @property
    def ports(self) -> dict[str, int]:
        return {"http": self.origin.port, "bare": self.bare.port}


@pytest.fixture(scope="module")
def rig(proxy_with: ProxyFactory, dns: StubDNS) -> Iterator[Rig]:
    origin, bare = Origin(), RawListener()
    trap = LoopbackTrap([origin.port])
    try:
        with proxy_with(_rules(origin.port, bare.port), name="explain-agrees",
                        secrets={"agree_key": SECRET}) as proxy:
            yield Rig(proxy, origin, bare, trap, dns)
    finally:
        trap.stop()
        bare.stop()
        origin.stop()


def _session(proxy: Proxy, sandbox: str | None) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    url = proxy.url(sandbox, KEYS[sandbox]) if sandbox is not None else proxy.url()
    session.proxies = {"http": url, "https": url}
    return session


def _send(rig: Rig, case: Case, url: str) -> int:
    """The request on the wire; its status."""
    headers: list[tuple[str, str]] = []
    if case.sandbox is not None:
        headers.append(("Proxy-Authorization", proxy_auth(case.sandbox, KEYS[case.sandbox])))
    if case.tokens:
        headers.append(("Proxy-Tokenizer", "not-a-token"))  # decided before any token is read
    if case.connect:
        return connect_answer(rig.proxy.port, url.split("/")[2], headers).status
    extra = {"Proxy-Tokenizer": "not-a-token"} if case.tokens else {}
    with _session(rig.proxy, case.sandbox) as session:
        return session.request(case.method, url, headers=extra, timeout=10).status_code


def _audit_line(proxy: Proxy, before: set[str], method: str) -> dict[str, Any]:
    return proxy.wait_audit(lambda e: e.get("event") == "request"
                            and e.get("request_id") not in before and e.get("method") == method)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_explain_matches_the_proxy(rig: Rig, case: Case) -> None:
    url = case.target(rig.ports)
    said = explain(load_rules(rig.proxy.rules), case.method, url, sandbox=case.sandbox,
                   tokens=case.tokens and not case.connect,
                   connect_tokens=case.tokens and case.connect)
    assert (said.decision, said.reason) == (case.decision, case.reason), said.detail

    rig.origin.reset()
    rig.trap.reset()
    bare_before, queries_before = rig.bare.connections, len(rig.dns.queries)
    before = {e.get("request_id") for e in rig.proxy.audit()}
    status = _send(rig, case, url)
    seen = _audit_line(rig.proxy, before, "CONNECT" if case.connect else case.method)

    assert (seen["decision"], seen["reason"]) == (said.decision, said.reason), seen
    where = (said.host, said.path)
    if case.sandbox is None and not case.connect:  # refused before the request's target is read
        where = (None, None)
    assert (seen["host"], seen["path"]) == where, seen
    if said.decision == "deny":
        assert said.reason is not None
        assert status == Reason.of(said.reason).status
        assert rig.origin.untouched(), rig.origin.requests
        assert rig.trap.connections == 0
        assert rig.bare.connections == bare_before
        # Refused before the name was looked up (decide runs before the guard resolves).
        assert not [q for q in rig.dns.queries[queries_before:]
                    if said.host and q[0].rstrip(".").lower() == said.host]
    else:
        assert status == 200
        assert [r.path for r in rig.origin.requests] == [said.path]
        if case.id == "allow-plain-http-inject":
            assert rig.origin.requests[0].headers["authorization"] == f"Bearer {SECRET}"
