"""Which IP addresses the proxy may connect to: the denied-address table and its classifier.

The table is explicit (like smokescreen's) rather than `ipaddress`'s is_global/is_private, which
on Python 3.11 call several special-purpose ranges global (gh-113171, gh-124217). At import the
ranges are flattened into sorted integer intervals, most specific range winning, so a lookup is
one bisect.

IPv6 addresses that embed an IPv4 address are decoded first and judged by what they embed:
mapped and NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48) forms are treated as their IPv4
address (DNS64 networks need NAT64 of public addresses); IPv4-compatible, translated, 6to4 and
Teredo forms are always denied, with the embedded address's reason when that is denied too.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from types import MappingProxyType
from typing import Final

from sealgate.reasons import Reason

__all__ = [
    "DENIED_RANGES",
    "METADATA_ADDRESSES",
    "AddressPolicy",
    "DeniedRange",
    "IPAddress",
    "IPNetwork",
    "classify",
    "embedded_ipv4",
]

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network



@dataclass(frozen=True, slots=True)
class DeniedRange:
    network: IPNetwork
    reason: Reason
    source: str


def _r(cidr: str, reason: Reason, source: str) -> DeniedRange:
    network: IPNetwork = IPv6Network(cidr) if ":" in cidr else IPv4Network(cidr)
    return DeniedRange(network, reason, source)


_V4SP = "IANA IPv4 special-purpose"
_V6SP = "IANA IPv6 special-purpose"

# Where ranges nest, the most specific one gives the reason.
DENIED_RANGES: Final[tuple[DeniedRange, ...]] = (
    _r("0.0.0.0/8", Reason.THIS_NETWORK, _V4SP),  # 0.0.0.0 reaches localhost on Linux
    _r("10.0.0.0/8", Reason.PRIVATE, _V4SP),
    _r("100.64.0.0/10", Reason.CGNAT, _V4SP),
    _r("127.0.0.0/8", Reason.LOOPBACK, _V4SP),
    _r("169.254.0.0/16", Reason.LINK_LOCAL, _V4SP),
    _r("172.16.0.0/12", Reason.PRIVATE, _V4SP),
    _r("192.0.0.0/24", Reason.IETF_PROTOCOL, _V4SP),  # includes OCI classic 192.0.0.192
    _r("192.0.2.0/24", Reason.DOCUMENTATION, _V4SP),
    _r("192.31.196.0/24", Reason.AS112, _V4SP),
    _r("192.52.193.0/24", Reason.AMT, _V4SP),
    _r("192.88.99.0/24", Reason.SIX_TO_FOUR_RELAY, _V4SP),
    _r("192.168.0.0/16", Reason.PRIVATE, _V4SP),
    _r("192.175.48.0/24", Reason.AS112, _V4SP),
    _r("198.18.0.0/15", Reason.BENCHMARKING, _V4SP),
    _r("198.51.100.0/24", Reason.DOCUMENTATION, _V4SP),
    _r("203.0.113.0/24", Reason.DOCUMENTATION, _V4SP),
    _r("224.0.0.0/4", Reason.MULTICAST, "RFC 5771"),
    _r("240.0.0.0/4", Reason.RESERVED, _V4SP),
    _r("255.255.255.255/32", Reason.BROADCAST, _V4SP),
    # IPv6: only global unicast 2000::/3 is reachable, minus the holes below.
    _r("::/3", Reason.IPV6_NOT_GLOBAL_UNICAST, "RFC 4291"),
    _r("4000::/2", Reason.IPV6_NOT_GLOBAL_UNICAST, "RFC 4291"),
    _r("8000::/1", Reason.IPV6_NOT_GLOBAL_UNICAST, "RFC 4291"),
    _r("::/128", Reason.UNSPECIFIED, _V6SP),  # like 0.0.0.0, reaches localhost
    _r("::1/128", Reason.LOOPBACK, _V6SP),
    _r("::/96", Reason.IPV4_COMPATIBLE, "RFC 4291 (deprecated)"),  # embedded v4 decoded
    _r("::ffff:0:0/96", Reason.IPV4_MAPPED, _V6SP),  # embedded v4 decoded; public v4 allowed
    _r("::ffff:0:0:0/96", Reason.IPV4_TRANSLATED, "RFC 2765"),  # embedded v4 decoded
    _r("64:ff9b::/96", Reason.NAT64, _V6SP),  # embedded v4 decoded; public v4 allowed
    _r("64:ff9b:1::/48", Reason.NAT64, _V6SP),  # local-use; embedded v4 decoded; public allowed
    _r("100::/64", Reason.DISCARD, _V6SP),
    _r("100:0:0:1::/64", Reason.DISCARD, "RFC 9780 dummy prefix"),
    _r("2001::/23", Reason.IETF_PROTOCOL, _V6SP),
    _r("2001::/32", Reason.IETF_PROTOCOL, _V6SP),  # Teredo; both embedded v4s decoded
    _r("2001:db8::/32", Reason.DOCUMENTATION, _V6SP),
    _r("2002::/16", Reason.SIX_TO_FOUR, _V6SP),  # embedded v4 decoded
    _r("2620:4f:8000::/48", Reason.AS112, _V6SP),
    _r("3fff::/20", Reason.DOCUMENTATION, _V6SP),
    _r("5f00::/16", Reason.SRV6_SID, _V6SP),
    _r("fc00::/7", Reason.UNIQUE_LOCAL, _V6SP),
    _r("fe80::/10", Reason.LINK_LOCAL, _V6SP),
    _r("fec0::/10", Reason.SITE_LOCAL, "RFC 3879 (deprecated)"),
    _r("ff00::/8", Reason.MULTICAST, "RFC 4291"),
)

# Denied with reason "metadata" even inside allow_networks, in every embedded spelling.
METADATA_ADDRESSES: Final[Mapping[IPAddress, str]] = MappingProxyType(
    {
        IPv4Address("169.254.169.254"): "AWS/GCP/Azure/OCI/DigitalOcean/OpenStack IMDS",
        IPv4Address("169.254.170.2"): "AWS ECS task credentials",
        IPv4Address("169.254.170.23"): "AWS EKS Pod Identity",
        IPv4Address("169.254.169.253"): "AWS VPC DNS",
        IPv4Address("169.254.169.123"): "AWS time sync",
        IPv6Address("fd00:ec2::254"): "AWS IMDS (IPv6)",
        IPv6Address("fd00:ec2::23"): "AWS EKS Pod Identity (IPv6)",
        IPv6Address("fd00:ec2::253"): "AWS VPC DNS (IPv6)",
        IPv6Address("fd20:ce::254"): "GCP metadata (IPv6)",
        IPv4Address("168.63.129.16"): "Azure WireServer (public address)",
        IPv4Address("100.100.100.200"): "Alibaba Cloud metadata",
        IPv4Address("192.0.0.192"): "Oracle OCI classic metadata",
        IPv6Address("fd00:a9fe:a9fe::1"): "Linode/Akamai metadata (IPv6)",
        IPv6Address("fe80::a9fe:a9fe"): "Linode/Akamai metadata (link-local IPv6)",
        IPv4Address("169.254.0.23"): "Tencent Cloud metadata",
        IPv4Address("169.254.42.42"): "Scaleway metadata",
        IPv6Address("fd00:42::42"): "Scaleway metadata (IPv6)",
    }
)

_V4_MASK: Final = 0xFFFFFFFF


class _Embed(Enum):
    """How an IPv6 range carries IPv4, and so how an address in it is judged."""

    DIRECT = "direct"  # mapped, NAT64: reaches the IPv4 address itself; public allowed
    LEGACY = "legacy"  # IPv4-compatible, translated: deprecated, denied even when public
    SIX_TO_FOUR = "6to4"  # 2002:AABB:CCDD::, IPv4 in bits 16-48; always denied
    TEREDO = "teredo"  # 2001:0:SSSS:SSSS:...:~CCCC:~CCCC, server and client; always denied


def _decode_last_32(n: int) -> tuple[int, ...]:
    return (n & _V4_MASK,)


def _decode_6to4(n: int) -> tuple[int, ...]:
    return ((n >> 80) & _V4_MASK,)


def _decode_teredo(n: int) -> tuple[int, ...]:
    # The client (where the packet is going) first; the server is the relay it passes through.
    return ((n & _V4_MASK) ^ _V4_MASK, (n >> 64) & _V4_MASK)


_DECODERS: Final[Mapping[_Embed, Callable[[int], tuple[int, ...]]]] = {
    _Embed.DIRECT: _decode_last_32,
    _Embed.LEGACY: _decode_last_32,
    _Embed.SIX_TO_FOUR: _decode_6to4,
    _Embed.TEREDO: _decode_teredo,
}

# Every key must be a network of DENIED_RANGES (checked at import).
_EMBEDDINGS: Final[Mapping[IPNetwork, _Embed]] = {
    IPv6Network("::/96"): _Embed.LEGACY,
    IPv6Network("::ffff:0:0/96"): _Embed.DIRECT,
    IPv6Network("::ffff:0:0:0/96"): _Embed.LEGACY,
    IPv6Network("64:ff9b::/96"): _Embed.DIRECT,
    # RFC 8215 local-use prefix. We assume the /96 format of RFC 6052 (IPv4 in the last 32
    # bits); a translator using a /48-/64 format inside it would place the IPv4 elsewhere.
    IPv6Network("64:ff9b:1::/48"): _Embed.DIRECT,
    IPv6Network("2002::/16"): _Embed.SIX_TO_FOUR,
    IPv6Network("2001::/32"): _Embed.TEREDO,
}


@dataclass(frozen=True, slots=True)
class _Table:
    """A partition of one address family into intervals: `starts[i]` up to `starts[i+1]-1`."""

    starts: list[int]
    reasons: list[Reason | None]
    embeds: list[_Embed | None]

    def index(self, n: int) -> int:
        return bisect_right(self.starts, n) - 1


def _build(version: int) -> _Table:
    entries: list[tuple[IPNetwork, Reason | None, _Embed | None]] = [
        (r.network, r.reason, _EMBEDDINGS.get(r.network))
        for r in DENIED_RANGES
        if r.network.version == version
    ]
    entries += [
        (IPv4Network(ip) if ip.version == 4 else IPv6Network(ip), Reason.METADATA, None)
        for ip in METADATA_ADDRESSES
        if ip.version == version
    ]
    seen = [net for net, _, _ in entries]
    if len(set(seen)) != len(seen):
        raise RuntimeError(f"duplicate IPv{version} network in the denied-address table")
    if any(net.version == version and net not in seen for net in _EMBEDDINGS):
        raise RuntimeError(f"IPv{version} embedding range missing from DENIED_RANGES")
    top = 2**32 if version == 4 else 2**128
    bounds = sorted(
        {0} | {int(net[0]) for net, _, _ in entries} | {int(net[-1]) + 1 for net, _, _ in entries}
    )
    table = _Table([], [], [])
    for start in bounds:
        if start >= top:
            continue
        covering = [e for e in entries if int(e[0][0]) <= start <= int(e[0][-1])]
        _, reason, embed = max(covering, key=lambda e: e[0].prefixlen, default=(None, None, None))
        if table.starts and (table.reasons[-1], table.embeds[-1]) == (reason, embed):
            continue
        table.starts.append(start)
        table.reasons.append(reason)
        table.embeds.append(embed)
    return table


_V4: Final = _build(4)
_V6: Final = _build(6)


def _v4_reason(n: int) -> Reason | None:
    return _V4.reasons[_V4.index(n)]


def _v6_reason(n: int) -> Reason | None:
    i = _V6.index(n)
    embed = _V6.embeds[i]
    if embed is None:
        return _V6.reasons[i]
    inner = [_v4_reason(v4) for v4 in _DECODERS[embed](n)]
    if Reason.METADATA in inner:
        return Reason.METADATA
    for reason in inner:
        if reason is not None:
            return reason
    return None if embed is _Embed.DIRECT else _V6.reasons[i]


def embedded_ipv4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 address carries, or None.

    Mapped, translated, IPv4-compatible (not :: or ::1), NAT64 64:ff9b::/96 and 64:ff9b:1::/48
    (last 32 bits), 6to4 (bits 16-48), Teredo (the client: last 32 bits inverted; `classify`
    also checks the Teredo server field).
    """
    n = int(ip)
    embed = _V6.embeds[_V6.index(n)]
    return None if embed is None else IPv4Address(_DECODERS[embed](n)[0])


def classify(ip: IPAddress) -> Reason | None:
    """None if `ip` may be connected to, else the reason it is denied for."""
    if ip.version == 4:
        return _v4_reason(int(ip))
    return _v6_reason(int(ip))


_Intervals = tuple[list[int], list[int]]


def _merge(spans: list[tuple[int, int]]) -> _Intervals:
    starts: list[int] = []
    ends: list[int] = []
    for first, last in sorted(spans):
        if ends and first <= ends[-1] + 1:
            ends[-1] = max(ends[-1], last)
        else:
            starts.append(first)
            ends.append(last)
    return starts, ends


def _contains(intervals: _Intervals, n: int) -> bool:
    starts, ends = intervals
    i = bisect_right(starts, n) - 1
    return i >= 0 and n <= ends[i]


class AddressPolicy:
    """`classify`, with operator-chosen networks opened (never the metadata addresses).

    An allowed IPv4 network also opens the IPv6 spellings that reach that IPv4 address directly:
    mapped and NAT64. IPv4-compatible and translated forms are deprecated, 6to4 and Teredo go
    through relays; they stay denied unless their IPv6 range itself is listed.
    """

    __slots__ = ("_v4", "_v6")

    def __init__(self, allow_networks: Iterable[IPNetwork] = ()) -> None:
        v4: list[tuple[int, int]] = []
        v6: list[tuple[int, int]] = []
        for net in allow_networks:
            (v4 if net.version == 4 else v6).append((int(net[0]), int(net[-1])))
        self._v4 = _merge(v4)
        self._v6 = _merge(v6)

    def check(self, ip: IPAddress) -> Reason | None:
        """None if the proxy may connect to `ip`, else the reason."""
        n = int(ip)
        reason = _v4_reason(n) if ip.version == 4 else _v6_reason(n)
        if reason is None or reason == Reason.METADATA:
            return reason
        if ip.version == 4:
            return None if _contains(self._v4, n) else reason
        if _contains(self._v6, n):
            return None
        if _V6.embeds[_V6.index(n)] is _Embed.DIRECT and _contains(self._v4, n & _V4_MASK):
            return None
        return reason
