"""The host's own addresses and the sandbox networks: never reached, whatever allow_networks say.

The proxy's sandbox is in *report* mode with allow_networks covering every target (10.0.0.0/8,
fd00::/8), so neither the policy nor the address table stands in the way: only the guard's
host checks do. Every target is a real listener that counts the connections it accepts, so a
refusal is also shown to have sent nothing, and one target that is neither this host's nor a
sandbox's is reached through the same proxy to prove the listeners would have counted.

The targets are made after the proxy started, as a new sandbox link's host end is:
  * an address on a test-created interface (the host's address on another interface),
  * the gateway 10.200.255.254 on lo (where the sandbox runtime puts it),
  * both ends of a link in the sandbox range 10.200.0.0/16, the far end in its own namespace
    (sandbox A asking for sandbox B).
Everything lives in the session's own network namespace (tests.netns), so even a broken guard
reaches nothing but these listeners.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address

import pytest

from tests.dnsstub import StubDNS
from tests.harness import Proxy, ProxyFactory, free_port, key_digest
from tests.netns import in_netns, netns, require_root_net, run
from tests.security.rawclient import LoopbackTrap, RawResponse
from tests.security.test_ssrf import connect, expect_denied, get

pytestmark = pytest.mark.root

WIDE = ("wide-1", "wide-1-key")
GATEWAY = "10.200.255.254"
SANDBOX_LINK = "10.200.254.0/30"  # host end .1, sandbox end .2
CONFIGURED = "10.216.0.0/16"  # the second proxy's --sandbox-network


def _rules() -> str:
    return f"""
version: 1
policies:
  wide:
    mode: report
    allow: []
    allow_networks: [10.0.0.0/8, 'fd00::/8']
sandboxes:
  {WIDE[0]}: {{policy: wide, key_sha256: "{key_digest(WIDE[1])}"}}
default_policy: null
"""


@pytest.fixture(scope="module")
def hproxy(proxy_with: ProxyFactory) -> Iterator[Proxy]:
    require_root_net()
    with proxy_with(_rules(), name="ssrf-host") as proxy:
        yield proxy


@dataclass(frozen=True)
class Target:
    address: str
    port: int
    trap: LoopbackTrap

    def authority(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


@contextlib.contextmanager
def _listening(address: str, port: int, namespace: str | None = None) -> Iterator[Target]:
    hosts = (address,)
    if namespace is None:
        trap = LoopbackTrap([port], hosts)
    else:
        trap = in_netns(namespace, lambda: LoopbackTrap([port], hosts))
    try:
        yield Target(address, port, trap)
    finally:
        trap.stop()


@pytest.fixture()
def host_address(hproxy: Proxy) -> Iterator[Target]:
    """10.214.x.1 on a test-created interface (a veth pair, both ends here), added while the
    proxy runs."""
    tag = secrets.token_hex(3)
    link, v4 = f"tsd{tag}", f"10.214.{int(tag[:2], 16)}.1"
    run("ip", "link", "add", link, "type", "veth", "peer", "name", f"tsp{tag}")
    try:
        run("ip", "addr", "add", f"{v4}/32", "dev", link)
        run("ip", "link", "set", link, "up")
        with _listening(v4, free_port()) as target:
            yield target
    finally:
        run("ip", "link", "del", link, check=False)


def _ask(proxy: Proxy, form: str, authority: str) -> RawResponse:
    if form == "absolute":
        return get(proxy, f"http://{authority}/", WIDE)
    return connect(proxy, authority, WIDE)


@pytest.mark.parametrize("form", ["absolute", "connect"])
def test_host_address_on_another_interface_is_refused(
    hproxy: Proxy, host_address: Target, form: str
) -> None:
    response = _ask(hproxy, form, host_address.authority())
    expect_denied(hproxy, response, 403, "host_address")
    assert host_address.trap.connections == 0


def test_host_address_by_name_and_mapped_is_refused(
    hproxy: Proxy, dns: StubDNS, host_address: Target
) -> None:
    dns.set("self.ssrf-host.test", f"A {host_address.address}")
    for authority in (
        f"self.ssrf-host.test:{host_address.port}",
        f"[::ffff:{host_address.address}]:{host_address.port}",
    ):
        expect_denied(hproxy, get(hproxy, f"http://{authority}/", WIDE), 403, "host_address")
    assert host_address.trap.connections == 0


def test_host_ipv6_address_is_refused(hproxy: Proxy) -> None:
    tag = secrets.token_hex(3)
    link, v6 = f"tsd{tag}", f"fd5a::{tag[:4]}"
    run("ip", "link", "add", link, "type", "veth", "peer", "name", f"tsp{tag}")
    try:
        run("ip", "addr", "add", f"{v6}/128", "dev", link, "nodad")
        run("ip", "link", "set", link, "up")
        with _listening(v6, free_port()) as target:
            response = get(hproxy, f"http://{target.authority()}/", WIDE)
            expect_denied(hproxy, response, 403, "host_address")
            assert target.trap.connections == 0
    finally:
        run("ip", "link", "del", link, check=False)


@pytest.mark.parametrize("form", ["absolute", "connect"])
def test_gateway_on_lo_is_refused(hproxy: Proxy, dns: StubDNS, form: str) -> None:
    """The issue's case: a name resolving to the gateway, a host listener on that port."""
    run("ip", "addr", "add", f"{GATEWAY}/32", "dev", "lo")
    try:
        with _listening(GATEWAY, free_port()) as gateway:
            dns.set("gw.ssrf-host.test", f"A {GATEWAY}")
            response = _ask(hproxy, form, f"gw.ssrf-host.test:{gateway.port}")
            expect_denied(hproxy, response, 403, "host_address")
            assert gateway.trap.connections == 0
    finally:
        run("ip", "addr", "del", f"{GATEWAY}/32", "dev", "lo", check=False)


@pytest.fixture(scope="module")
def _sandbox_link(hproxy: Proxy) -> Iterator[tuple[Target, Target]]:
    port = free_port()
    with (
        netns(SANDBOX_LINK) as ns,
        _listening(ns.host_ip, port) as near,
        _listening(ns.ns_ip, port, ns.name) as far,
    ):
        yield near, far


@pytest.fixture()
def sandbox_link(_sandbox_link: tuple[Target, Target]) -> tuple[Target, Target]:
    """A sandbox-range link: listeners on its host end (here) and its far end (its namespace),
    counting from zero."""
    for target in _sandbox_link:
        target.trap.reset()
    return _sandbox_link


@pytest.mark.parametrize("form", ["absolute", "connect"])
def test_another_sandbox_is_refused(
    hproxy: Proxy, sandbox_link: tuple[Target, Target], form: str
) -> None:
    near, far = sandbox_link
    expect_denied(hproxy, _ask(hproxy, form, far.authority()), 403, "sandbox_network")
    expect_denied(hproxy, _ask(hproxy, form, near.authority()), 403, "host_address")
    assert far.trap.connections == 0 and near.trap.connections == 0


@pytest.mark.parametrize(
    "spelling",
    ["[::ffff:{v4}]", "[64:ff9b::{v4}]", "sbx.ssrf-host.test"],
    ids=["mapped", "nat64", "name"],
)
def test_another_sandbox_in_other_spellings_is_refused(
    hproxy: Proxy, dns: StubDNS, sandbox_link: tuple[Target, Target], spelling: str
) -> None:
    _, far = sandbox_link
    dns.set("sbx.ssrf-host.test", f"A {far.address}")
    v4 = IPv4Address(far.address)
    host = spelling.format(v4=v4) if "ffff" in spelling else spelling.format(
        v4=f"{int(v4) >> 16:x}:{int(v4) & 0xFFFF:x}"
    )
    response = get(hproxy, f"http://{host}:{far.port}/", WIDE)
    expect_denied(hproxy, response, 403, "sandbox_network")
    assert far.trap.connections == 0


def test_positive_control_a_namespace_outside_is_reached(hproxy: Proxy) -> None:
    """Neither this host's nor in a sandbox range: allow_networks opens it and the listener
    counts the dial, so the zero counts above mean something."""
    port = free_port()
    with netns() as ns, _listening(ns.ns_ip, port, ns.name) as outside:
        response = get(hproxy, f"http://{outside.authority()}/", WIDE)
        assert response.status == 502, response.body[:300]  # the trap closes without answering
        assert outside.trap.connections == 1


def test_configured_sandbox_network_replaces_the_default(
    proxy_with: ProxyFactory, sandbox_link: tuple[Target, Target],
) -> None:
    require_root_net()
    port = free_port()
    with (
        proxy_with(_rules(), name="ssrf-host-configured",
                   options=["--sandbox-network", CONFIGURED]) as proxy,
        netns(CONFIGURED.replace("0.0/16", "7.0/30")) as ns,
        _listening(ns.ns_ip, port, ns.name) as configured,
    ):
        response = get(proxy, f"http://{configured.authority()}/", WIDE)
        expect_denied(proxy, response, 403, "sandbox_network")
        assert configured.trap.connections == 0
        _, default_range = sandbox_link
        assert get(proxy, f"http://{default_range.authority()}/", WIDE).status == 502
        assert default_range.trap.connections == 1
