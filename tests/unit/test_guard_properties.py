"""Properties of the guard's pure core, checked over generated input."""

# ruff: noqa: RUF001 - confusable characters are the point of these inputs

from __future__ import annotations

import socket
from ipaddress import IPv4Address, IPv4Network, IPv6Address, ip_address

from hypothesis import given, settings
from hypothesis import strategies as st

from sealgate.hostname import Host, HostError, canonical_host, split_authority
from sealgate.proxy.net.addresses import DENIED_RANGES, AddressPolicy

SETTINGS = settings(max_examples=300, deadline=None)

# Fragments that make parsers disagree, so generated hosts hit the interesting branches.
# fmt: off
FRAGMENTS = [
    *"0123456789abcdefxX.:[]%@_-",
    "0x", "0X", "07", "255", "256", "4294967295", "4294967296", "::", "::ffff:", "64:ff9b::",
    "2002:", "ffff", "xn--", "xn--bcher-kva", "localhost", "example", "com",
    "\x00", "\r\n", " ", "\t", "\x7f", "\x85", "\u00a0", "\u3000",
    "１", "０ｘ", "。", "．", "｡", "＠", "﹫", "：", "［", "］", "／", "％",
    "ü", "\u00ad", "\u200b", "\u200d", "\u202e", "\u0301",
]
# fmt: on
any_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=80)
fragment_text = st.lists(st.sampled_from(FRAGMENTS), max_size=16).map("".join)
hostish = st.one_of(any_text, fragment_text)


@SETTINGS
@given(hostish)
def test_canonical_host_only_raises_host_error(raw: str) -> None:
    try:
        host = canonical_host(raw)
    except HostError as err:
        assert err.reason.startswith("host_")
        return
    assert isinstance(host, Host)
    # Canonical output is a fixed point: spelling it again gives the same host.
    again = canonical_host(
        host.name if host.ip is None or host.ip.version == 4 else f"[{host.name}]"
    )
    assert again == host


@SETTINGS
@given(hostish, st.one_of(st.none(), st.integers(min_value=-1, max_value=70000)))
def test_split_authority_only_raises_host_error(authority: str, default: int | None) -> None:
    try:
        host, port = split_authority(authority, default)
    except HostError as err:
        assert err.reason.startswith(("host_", "port_"))
        return
    assert isinstance(host, Host)
    assert 1 <= port <= 65535


def _numeric_part(value: int, style: str) -> str:
    if style == "dec":
        return str(value)
    if style == "oct":
        return "0" + format(value, "o")
    return ("0x" if style == "hex" else "0X") + format(value, "x")


@st.composite
def inet_aton_like(draw: st.DrawFn) -> str:
    """Strings in the shapes inet_aton parses: 1-4 parts in decimal, octal or hex."""
    count = draw(st.integers(min_value=1, max_value=5))
    parts = [
        _numeric_part(
            draw(st.integers(min_value=0, max_value=2**32 + 1)),
            draw(st.sampled_from(["dec", "dec", "oct", "hex", "HEX"])),
        )
        for _ in range(count)
    ]
    suffix = draw(st.sampled_from(["", "", ".", " ", "\n", "..", "\x00x"]))
    return ".".join(parts) + suffix


@SETTINGS
@given(st.one_of(inet_aton_like(), fragment_text, any_text))
def test_no_other_parser_sees_a_different_address(raw: str) -> None:
    try:
        host = canonical_host(raw)
    except HostError:
        return
    # Python's inet_aton takes a str without NULs; glibc would stop at one, which we refuse.
    if raw.isascii() and "\x00" not in raw:
        try:
            packed = socket.inet_aton(raw)
        except OSError:
            pass
        else:
            assert host.ip == IPv4Address(packed), raw
    try:
        parsed = ip_address(raw.strip("[]"))
    except ValueError:
        return
    assert host.ip == parsed, raw


_DENIED_V4 = [r.network for r in DENIED_RANGES if isinstance(r.network, IPv4Network)]


@st.composite
def denied_ipv4(draw: st.DrawFn) -> IPv4Address:
    network = draw(st.sampled_from(_DENIED_V4))
    offset = draw(st.integers(min_value=0, max_value=network.num_addresses - 1))
    return network[offset]


def _ipv6_spellings(v4: IPv4Address) -> list[str]:
    """Text forms of IPv6 addresses embedding `v4`, as a client would write them."""
    n = int(v4)
    hi, lo = n >> 16, n & 0xFFFF
    dotted = str(v4)
    return [
        f"[::ffff:{dotted}]",
        f"[::FFFF:{hi:x}:{lo:x}]",
        f"[0:0:0:0:0:ffff:{hi:04x}:{lo:04x}]",
        f"[::{dotted}]",
        f"[::ffff:0:{dotted}]",
        f"[64:ff9b::{dotted}]",
        f"[64:ff9b::{hi:x}:{lo:x}]",
        f"[64:ff9b:1::{dotted}]",
        f"[2002:{hi:x}:{lo:x}::]",
        f"[2002:{hi:x}:{lo:x}:1::1]",
        f"[2001:0:4136:e378::{hi ^ 0xFFFF:x}:{lo ^ 0xFFFF:x}]",  # Teredo client
        f"[2001:0:{hi:x}:{lo:x}::f7f7:f7f7]",  # Teredo server
    ]


@SETTINGS
@given(denied_ipv4())
def test_denied_ipv4_is_denied_in_every_spelling(v4: IPv4Address) -> None:
    policy = AddressPolicy()
    reason = policy.check(v4)
    assert reason is not None
    host = canonical_host(str(v4))
    assert host.ip == v4
    for spelling in _ipv6_spellings(v4):
        ip = canonical_host(spelling).ip
        assert isinstance(ip, IPv6Address), spelling
        assert policy.check(ip) is not None, spelling
        if reason == "metadata":
            assert policy.check(ip) == "metadata", spelling
