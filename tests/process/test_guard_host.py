"""sealgate.proxy.net.hostaddr against the real kernel of the session's namespace (tests.netns)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path

import pytest

from sealgate.proxy.net.hostaddr import (
    DEFAULT_SANDBOX_NETWORKS,
    HostAddresses,
    LocalRoutes,
    parse_networks,
)
from sealgate.reasons import Reason
from sealgate.sandbox.host.network import DEFAULT_RANGE
from tests.netns import require_root_net, run


@pytest.fixture(scope="module")
def routes() -> Iterator[LocalRoutes]:
    lookups = LocalRoutes()
    yield lookups
    lookups.close()


def host(routes: LocalRoutes, *networks: str) -> HostAddresses:
    return HostAddresses(routes, parse_networks(networks or DEFAULT_SANDBOX_NETWORKS))


def test_default_sandbox_network_is_the_runtimes() -> None:
    assert parse_networks(DEFAULT_SANDBOX_NETWORKS) == (DEFAULT_RANGE,)


@pytest.mark.parametrize(
    ("address", "local"),
    [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("0.0.0.0", True),
     ("192.0.2.1", False), ("8.8.8.8", False), ("2001:db8::1", False), ("255.255.255.255", False)],
)
def test_route_lookup(routes: LocalRoutes, address: str, local: bool) -> None:
    """The session's namespace has only lo: loopback is local, nothing else has a route."""
    assert routes.delivered_here(ip_address(address)) is local


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", None),  # loopback: left to the table and allow_networks
        ("::ffff:127.0.0.1", None),
        # connect() makes it the host itself: never opened, unlike loopback (review F8)
        ("0.0.0.0", Reason.HOST_ADDRESS),
        ("::", Reason.HOST_ADDRESS),
        ("::ffff:0.0.0.0", Reason.HOST_ADDRESS),
        ("10.200.0.2", Reason.SANDBOX_NETWORK),
        ("10.200.255.253", Reason.SANDBOX_NETWORK),
        ("::ffff:10.200.0.2", Reason.SANDBOX_NETWORK),
        ("64:ff9b::ac8:2", Reason.SANDBOX_NETWORK),  # NAT64 of 10.200.0.2
        ("2002:ac8:2::1", Reason.SANDBOX_NETWORK),  # 6to4
        ("10.201.0.2", None),
        ("10.199.255.255", None),
        ("93.184.216.34", None),
    ],
)
def test_check(routes: LocalRoutes, address: str, reason: str | None) -> None:
    assert host(routes).check(ip_address(address)) == reason


def test_configured_networks_replace_the_default(routes: LocalRoutes) -> None:
    custom = host(routes, "10.215.0.0/16", "fd99::/16")
    assert custom.check(ip_address("10.215.3.2")) == Reason.SANDBOX_NETWORK
    assert custom.check(ip_address("fd99::2")) == Reason.SANDBOX_NETWORK
    assert custom.check(ip_address("10.200.0.2")) is None


@pytest.mark.parametrize("text", ["10.200.0.1/16", "10.200.0.0/33", "sandbox", ""])
def test_bad_sandbox_network_is_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="sandbox network"):
        parse_networks([text])


@contextlib.contextmanager
def _sysctl(key: str, value: str) -> Iterator[None]:
    path = Path("/proc/sys") / key.replace(".", "/")
    before = path.read_text().strip()
    path.write_text(value)
    try:
        yield
    finally:
        path.write_text(before)


def test_addresses_added_later_and_local_ranges_are_the_hosts(routes: LocalRoutes) -> None:
    """An address on an interface, a range routed locally (AnyIP), both added after the lookup
    socket was opened; under ip_nonlocal_bind=1 (where binding to an address to test it would
    succeed for any address) a foreign one is still not local."""
    require_root_net()
    checker = host(routes)
    added, anyip, foreign = "10.214.250.1", "10.214.251.0/24", "10.214.252.9"
    run("ip", "addr", "add", f"{added}/32", "dev", "lo")
    run("ip", "route", "add", "local", anyip, "dev", "lo")
    try:
        assert checker.check(ip_address(added)) == Reason.HOST_ADDRESS
        assert checker.check(ip_address("10.214.251.77")) == Reason.HOST_ADDRESS
        assert checker.check(ip_address(f"::ffff:{added}")) == Reason.HOST_ADDRESS
        with _sysctl("net.ipv4.ip_nonlocal_bind", "1"), socket.socket() as sock:
            sock.bind((foreign, 0))
            assert checker.check(ip_address(foreign)) is None
    finally:
        run("ip", "route", "del", "local", anyip, "dev", "lo", check=False)
        run("ip", "addr", "del", f"{added}/32", "dev", "lo", check=False)
    assert checker.check(ip_address(added)) is None
