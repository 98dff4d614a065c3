"""The denied-address table: range boundaries, embedded IPv4, metadata, allow_networks."""

from __future__ import annotations

import re
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

import pytest

from sealgate.hostname import canonical_host
from sealgate.proxy.net.addresses import (
    DENIED_RANGES,
    METADATA_ADDRESSES,
    AddressPolicy,
    IPAddress,
    classify,
    embedded_ipv4,
)

# (address, reason): first and last address of each range, and the neighbours just outside.
BOUNDARIES: list[tuple[str, str | None]] = [
    ("0.0.0.0", "this_network"),
    ("0.255.255.255", "this_network"),
    ("1.0.0.0", None),
    ("9.255.255.255", None),
    ("10.0.0.0", "private"),
    ("10.255.255.255", "private"),
    ("11.0.0.0", None),
    ("100.63.255.255", None),
    ("100.64.0.0", "cgnat"),
    ("100.127.255.255", "cgnat"),
    ("100.128.0.0", None),
    ("126.255.255.255", None),
    ("127.0.0.0", "loopback"),
    ("127.255.255.255", "loopback"),
    ("128.0.0.0", None),
    ("169.253.255.255", None),
    ("169.254.0.0", "link_local"),
    ("169.254.255.255", "link_local"),
    ("169.255.0.0", None),
    ("172.15.255.255", None),
    ("172.16.0.0", "private"),
    ("172.31.255.255", "private"),
    ("172.32.0.0", None),
    ("191.255.255.255", None),
    ("192.0.0.0", "ietf_protocol"),
    ("192.0.0.255", "ietf_protocol"),
    ("192.0.1.0", None),
    ("192.0.1.255", None),
    ("192.0.2.0", "documentation"),
    ("192.0.2.255", "documentation"),
    ("192.0.3.0", None),
    ("192.31.195.255", None),
    ("192.31.196.0", "as112"),
    ("192.31.196.255", "as112"),
    ("192.31.197.0", None),
    ("192.52.192.255", None),
    ("192.52.193.0", "amt"),
    ("192.52.193.255", "amt"),
    ("192.52.194.0", None),
    ("192.88.98.255", None),
    ("192.88.99.0", "6to4_relay"),
    ("192.88.99.255", "6to4_relay"),
    ("192.88.100.0", None),
    ("192.167.255.255", None),
    ("192.168.0.0", "private"),
    ("192.168.255.255", "private"),
    ("192.169.0.0", None),
    ("192.175.47.255", None),
    ("192.175.48.0", "as112"),
    ("192.175.48.255", "as112"),
    ("192.175.49.0", None),
    ("198.17.255.255", None),
    ("198.18.0.0", "benchmarking"),
    ("198.19.255.255", "benchmarking"),
    ("198.20.0.0", None),
    ("198.51.99.255", None),
    ("198.51.100.0", "documentation"),
    ("198.51.100.255", "documentation"),
    ("198.51.101.0", None),
    ("203.0.112.255", None),
    ("203.0.113.0", "documentation"),
    ("203.0.113.255", "documentation"),
    ("203.0.114.0", None),
    ("223.255.255.255", None),
    ("224.0.0.0", "multicast"),
    ("239.255.255.255", "multicast"),
    ("240.0.0.0", "reserved"),
    ("255.255.255.254", "reserved"),
    ("255.255.255.255", "broadcast"),
    # Public addresses that is_global gets right, and ones it does not matter for.
    ("8.8.8.8", None),
    ("140.82.112.3", None),
    ("168.63.129.15", None),
    ("168.63.129.17", None),
    # IPv6: global unicast 2000::/3 and its holes.
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ipv6_not_global_unicast"),
    ("2000::", None),
    ("2000:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
    ("2001:100::", "ietf_protocol"),
    ("2001:1::1", "ietf_protocol"),
    ("2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", "ietf_protocol"),
    ("2001:200::", None),
    ("2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", None),
    ("2001:db8::", "documentation"),
    ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "documentation"),
    ("2001:db9::", None),
    ("2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
    ("2002:808:808::", "6to4"),
    ("2002:808:808:ffff:ffff:ffff:ffff:ffff", "6to4"),
    ("2003::", None),
    ("2620:4f:7fff:ffff:ffff:ffff:ffff:ffff", None),
    ("2620:4f:8000::", "as112"),
    ("2620:4f:8000:ffff:ffff:ffff:ffff:ffff", "as112"),
    ("2620:4f:8001::", None),
    ("2606:4700:4700::1111", None),
    ("3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
    ("3fff::", "documentation"),
    ("3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", "documentation"),
    ("3fff:1000::", None),
    ("3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
    ("4000::", "ipv6_not_global_unicast"),
    ("5eff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ipv6_not_global_unicast"),
    ("5f00::", "srv6_sid"),
    ("5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "srv6_sid"),
    ("5f01::", "ipv6_not_global_unicast"),
    ("ff::", "ipv6_not_global_unicast"),
    ("100::", "discard"),
    ("100::ffff:ffff:ffff:ffff", "discard"),
    ("100:0:0:1::", "discard"),
    ("100:0:0:2::", "ipv6_not_global_unicast"),
    ("64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff", "ipv6_not_global_unicast"),
    ("64:ff9b::1:0:0", "ipv6_not_global_unicast"),
    ("64:ff9c::1", "ipv6_not_global_unicast"),
    ("64:ff9b:2::8.8.8.8", "ipv6_not_global_unicast"),
    ("fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ipv6_not_global_unicast"),
    ("fc00::", "unique_local"),
    ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "unique_local"),
    ("fe00::", "ipv6_not_global_unicast"),
    ("fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ipv6_not_global_unicast"),
    ("fe80::", "link_local"),
    ("febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "link_local"),
    ("fec0::", "site_local"),
    ("feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "site_local"),
    ("ff00::", "multicast"),
    ("ff02::2", "multicast"),
    ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "multicast"),
]


@pytest.mark.parametrize(("address", "reason"), BOUNDARIES)
def test_boundaries(address: str, reason: str | None) -> None:
    assert classify(ip_address(address)) == reason
    assert AddressPolicy().check(ip_address(address)) == reason


# ssrf.md section 3 B: IPv6 spellings of IPv4 and other evasions, with the expected reason.
EMBEDDED: list[tuple[str, str | None, str | None]] = [
    # (address, reason, embedded_ipv4)
    ("::ffff:127.0.0.1", "loopback", "127.0.0.1"),
    ("::ffff:a9fe:101", "link_local", "169.254.1.1"),
    ("::ffff:10.1.2.3", "private", "10.1.2.3"),
    ("::ffff:8.8.8.8", None, "8.8.8.8"),
    ("::ffff:0.0.0.0", "this_network", "0.0.0.0"),
    ("::127.0.0.1", "loopback", "127.0.0.1"),
    ("::8.8.8.8", "ipv4_compatible", "8.8.8.8"),
    ("::2", "this_network", "0.0.0.2"),
    ("::ffff:0:127.0.0.1", "loopback", "127.0.0.1"),
    ("::ffff:0:8.8.8.8", "ipv4_translated", "8.8.8.8"),
    ("64:ff9b::127.0.0.1", "loopback", "127.0.0.1"),
    ("64:ff9b::a9fe:101", "link_local", "169.254.1.1"),
    ("64:ff9b::8.8.8.8", None, "8.8.8.8"),
    ("64:ff9b:1::10.0.0.1", "private", "10.0.0.1"),
    ("64:ff9b:1:ffff::8.8.8.8", None, "8.8.8.8"),
    ("2002:7f00:1::", "loopback", "127.0.0.1"),
    ("2002:c0a8:101::1", "private", "192.168.1.1"),
    ("2002:808:808::1", "6to4", "8.8.8.8"),
    # Teredo: the RFC 4380 example's client is 192.0.2.45, its server 65.54.227.120.
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "documentation", "192.0.2.45"),
    ("2001:0:4136:e378::f7f7:f7f7", "ietf_protocol", "8.8.8.8"),
    ("2001:0:4136:e378::80ff:fffe", "loopback", "127.0.0.1"),
    ("2001:0:7f00:1::f7f7:f7f7", "loopback", "8.8.8.8"),  # denied by its server field
    ("::", "unspecified", None),
    ("::1", "loopback", None),
    ("2606:4700::1111", None, None),
    ("64:ff9c::808:808", "ipv6_not_global_unicast", None),
    ("fe80::1", "link_local", None),
]


@pytest.mark.parametrize(("address", "reason", "inner"), EMBEDDED)
def test_embedded(address: str, reason: str | None, inner: str | None) -> None:
    ip = IPv6Address(address)
    assert classify(ip) == reason
    assert embedded_ipv4(ip) == (None if inner is None else IPv4Address(inner))


def _spellings(v4: IPv4Address) -> list[IPAddress]:
    """Every IPv6 form our table decodes for `v4`, and the address itself."""
    n = int(v4)
    return [
        v4,
        IPv6Address(0xFFFF << 32 | n),  # mapped
        IPv6Address(n),  # compatible
        IPv6Address(0xFFFF << 48 | n),  # translated
        IPv6Address(int(IPv6Address("64:ff9b::")) | n),  # NAT64
        IPv6Address(int(IPv6Address("64:ff9b:1:abcd::")) | n),  # local-use NAT64
        IPv6Address(int(IPv6Address("2002::")) | n << 80 | 1),  # 6to4
        IPv6Address(int(IPv6Address("2001::")) | 0x08080808 << 64 | n ^ 0xFFFFFFFF),  # Teredo
        IPv6Address(int(IPv6Address("2001::")) | n << 64 | 0xF7F7F7F7),  # Teredo server
    ]


V4_METADATA = [ip for ip in METADATA_ADDRESSES if isinstance(ip, IPv4Address)]
V6_METADATA = [ip for ip in METADATA_ADDRESSES if isinstance(ip, IPv6Address)]
EVERYTHING = AddressPolicy([IPv4Network("0.0.0.0/0"), IPv6Network("::/0")])


@pytest.mark.parametrize("v4", V4_METADATA, ids=str)
def test_metadata_in_every_spelling(v4: IPv4Address) -> None:
    for ip in _spellings(v4):
        assert classify(ip) == "metadata", ip
        assert AddressPolicy().check(ip) == "metadata", ip
        assert EVERYTHING.check(ip) == "metadata", ip


@pytest.mark.parametrize("v6", V6_METADATA, ids=str)
def test_ipv6_metadata(v6: IPv6Address) -> None:
    assert classify(v6) == "metadata"
    assert EVERYTHING.check(v6) == "metadata"


def test_metadata_neighbours_are_not_metadata() -> None:
    assert classify(IPv4Address("168.63.129.16")) == "metadata"  # public, yet denied
    assert classify(IPv4Address("100.100.100.200")) == "metadata"
    assert classify(IPv4Address("100.100.100.201")) == "cgnat"
    assert classify(IPv4Address("169.254.169.255")) == "link_local"
    assert classify(IPv6Address("fd00:ec2::255")) == "unique_local"
    assert classify(IPv6Address("fe80::a9fe:a9ff")) == "link_local"


def test_allow_networks_open_loopback_host_only() -> None:
    policy = AddressPolicy([IPv4Network("127.0.0.1/32")])
    assert policy.check(IPv4Address("127.0.0.1")) is None
    assert policy.check(IPv6Address("::ffff:127.0.0.1")) is None
    assert policy.check(IPv6Address("64:ff9b::127.0.0.1")) is None
    assert policy.check(IPv4Address("127.0.0.2")) == "loopback"
    assert policy.check(IPv6Address("::ffff:127.0.0.2")) == "loopback"
    # Deprecated and relayed forms stay denied: they do not reach 127.0.0.1 directly.
    assert policy.check(IPv6Address("::127.0.0.1")) == "loopback"
    assert policy.check(IPv6Address("::ffff:0:127.0.0.1")) == "loopback"
    assert policy.check(IPv6Address("2002:7f00:1::")) == "loopback"
    assert policy.check(IPv6Address("::1")) == "loopback"


def test_allow_networks_never_open_metadata() -> None:
    policy = AddressPolicy([IPv4Network("169.254.0.0/16"), IPv6Network("fc00::/7")])
    assert policy.check(IPv4Address("169.254.1.1")) is None
    assert policy.check(IPv6Address("::ffff:169.254.1.1")) is None
    assert policy.check(IPv4Address("169.254.169.254")) == "metadata"
    assert policy.check(IPv6Address("::ffff:169.254.169.254")) == "metadata"
    assert policy.check(IPv6Address("64:ff9b::a9fe:a9fe")) == "metadata"
    assert policy.check(IPv6Address("fd00::1")) is None
    assert policy.check(IPv6Address("fd00:ec2::254")) == "metadata"
    assert policy.check(IPv6Address("fd20:ce::254")) == "metadata"


def test_allow_networks_ipv6_and_overlaps() -> None:
    policy = AddressPolicy(
        [IPv4Network("10.0.0.0/24"), IPv4Network("10.0.0.128/25"), IPv4Network("10.0.1.0/24")]
    )
    assert policy.check(IPv4Address("10.0.1.255")) is None
    assert policy.check(IPv4Address("10.0.2.0")) == "private"
    assert policy.check(IPv4Address("9.255.255.255")) is None
    v6 = AddressPolicy([IPv6Network("fd12::/16"), IPv6Network("2002::/16")])
    assert v6.check(IPv6Address("fd12::1")) is None
    assert v6.check(IPv6Address("fd13::1")) == "unique_local"
    assert v6.check(IPv6Address("2002:808:808::1")) is None  # listed explicitly
    assert v6.check(IPv6Address("::ffff:10.0.0.1")) == "private"


def test_table_is_well_formed() -> None:
    networks = [r.network for r in DENIED_RANGES]
    assert len(set(networks)) == len(networks)
    for denied in DENIED_RANGES:
        assert re.fullmatch(r"[a-z0-9_]+", denied.reason), denied
        assert denied.source
    assert all(note for note in METADATA_ADDRESSES.values())
    with pytest.raises(TypeError):
        METADATA_ADDRESSES[IPv4Address("1.1.1.1")] = "x"  # type: ignore[index]


def test_every_range_is_denied_at_both_ends() -> None:
    for denied in DENIED_RANGES:
        for ip in (denied.network[0], denied.network[-1]):
            assert classify(ip) is not None, (denied, ip)


# ssrf.md section 3 A, B, D end to end: host as written -> canonical_host -> AddressPolicy.
LITERAL_EVASIONS: list[tuple[str, str]] = [
    ("127.0.0.1", "loopback"),
    ("0.0.0.0", "this_network"),
    ("１２７．０．０．１", "loopback"),  # noqa: RUF001 - fullwidth is the evasion
    ("169。254。169。254", "metadata"),
    ("169.254.169.254.", "metadata"),
    ("[::]", "unspecified"),
    ("[0:0::1]", "loopback"),
    ("[::ffff:127.0.0.1]", "loopback"),
    ("[::ffff:a9fe:a9fe]", "metadata"),
    ("[::127.0.0.1]", "loopback"),
    ("[::a9fe:a9fe]", "metadata"),
    ("[::ffff:0:7f00:1]", "loopback"),
    ("[64:ff9b::a9fe:a9fe]", "metadata"),
    ("[64:ff9b:1::a9fe:a9fe]", "metadata"),
    ("[2002:a9fe:a9fe::1]", "metadata"),
    ("[2002:7f00:1::]", "loopback"),
    ("[2001:0::5601:5601]", "metadata"),  # Teredo client ~0x56015601 = 169.254.169.254
    ("[fd00:ec2::254]", "metadata"),
    ("[fe80::a9fe:a9fe]", "metadata"),
    # Addresses Python 3.11's is_global calls global (gh-113171, gh-124217).
    ("192.0.0.192", "metadata"),
    ("168.63.129.16", "metadata"),
    ("100.100.100.200", "metadata"),
    ("192.0.0.9", "ietf_protocol"),
    ("[fec0::1]", "site_local"),
    ("[5f00::1]", "srv6_sid"),
    ("[3fff::1]", "documentation"),
    ("[2001:2::1]", "ietf_protocol"),
]


@pytest.mark.parametrize(("raw", "reason"), LITERAL_EVASIONS)
def test_literal_evasions(raw: str, reason: str) -> None:
    ip = canonical_host(raw).ip
    assert ip is not None
    assert AddressPolicy().check(ip) == reason
