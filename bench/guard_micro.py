"""Micro-benchmark of the guard's pure core: µs per operation over a realistic mix.

Run as `.venv/bin/python bench/guard_micro.py`, or import and call `run()`.
The whole guard decision must stay well under 20 µs; `decision` is the number to watch.
"""

from __future__ import annotations

import timeit
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network, IPv6Address

from sealgate.hostname import canonical_host, denied_name, split_authority
from sealgate.proxy.net.addresses import AddressPolicy, IPAddress, classify

# What sandboxes mostly ask for: package registries and APIs by name, the odd IP literal,
# sometimes with a trailing dot or capitals, rarely an IDN.
AUTHORITIES = [
    "api.github.com:443",
    "pypi.org:443",
    "files.pythonhosted.org.:443",
    "Registry.NPMJS.org:443",
    "objects.githubusercontent.com:443",
    "api.openai.com:443",
    "proxy.golang.org:443",
    "140.82.112.3:443",
    "[2606:4700:4700::1111]:443",
    "example.com:80",
]
IDN_AUTHORITY = "bücher.de:443"
# More distinct IDNs than canonical_host's caches hold, so each lookup does the IDNA work.
COLD_IDNS = [f"bücher-{i}.de" for i in range(2500)]
# What those names resolve to, with a few of the addresses the guard exists to refuse.
ADDRESSES: list[IPAddress] = [
    IPv4Address("140.82.112.3"),
    IPv4Address("151.101.0.223"),
    IPv4Address("104.16.0.35"),
    IPv6Address("2a04:4e42::223"),
    IPv6Address("2606:4700:4700::1111"),
    IPv6Address("64:ff9b::8c52:7003"),
    IPv4Address("10.0.0.5"),
    IPv4Address("169.254.169.254"),
    IPv6Address("::ffff:127.0.0.1"),
    IPv4Address("8.8.8.8"),
]
ALLOW = [IPv4Network("10.20.0.0/16")]


def _decide(authority: str, resolved: IPAddress, policy: AddressPolicy) -> str | None:
    """The guard's pure path for one request, as the addon runs it."""
    host, _port = split_authority(authority, 443)
    reason = denied_name(host)
    if reason is not None:
        return reason
    # The lead's policy match (host/port/scheme allowlist for the sandbox) goes here.
    return policy.check(host.ip if host.ip is not None else resolved)


def _per_op(body: Callable[[], object], ops: int, repeat: int = 5, number: int = 200) -> float:
    """Best-of-`repeat` µs per op; `body` performs `ops` operations per call."""
    best = min(timeit.repeat(body, repeat=repeat, number=number))
    return best / (number * ops) * 1e6


def run() -> dict[str, float]:
    """µs per operation, by name."""
    policy = AddressPolicy()
    allowing = AddressPolicy(ALLOW)
    hosts = [authority.rsplit(":", 1)[0] for authority in AUTHORITIES]
    canonical = [canonical_host(host) for host in hosts]
    pairs = list(zip(AUTHORITIES, ADDRESSES, strict=True))
    n = len(AUTHORITIES)
    return {
        "canonical_host": _per_op(lambda: [canonical_host(h) for h in hosts], n),
        "canonical_host_idn": _per_op(lambda: canonical_host("bücher.de"), 1),
        "canonical_host_idn_cold": _per_op(
            lambda: [canonical_host(h) for h in COLD_IDNS], len(COLD_IDNS), repeat=3, number=1
        ),
        "split_authority": _per_op(lambda: [split_authority(a, 443) for a in AUTHORITIES], n),
        "denied_name": _per_op(lambda: [denied_name(h) for h in canonical], n),
        "classify": _per_op(lambda: [classify(ip) for ip in ADDRESSES], n),
        "policy_check": _per_op(lambda: [policy.check(ip) for ip in ADDRESSES], n),
        "policy_check_allow_networks": _per_op(lambda: [allowing.check(ip) for ip in ADDRESSES], n),
        "decision": _per_op(lambda: [_decide(a, ip, policy) for a, ip in pairs], n),
        "decision_idn": _per_op(lambda: _decide(IDN_AUTHORITY, ADDRESSES[0], policy), 1),
    }


def main() -> None:
    for name, micros in run().items():
        print(f"{name:30} {micros:8.2f} µs/op")


if __name__ == "__main__":
    main()
