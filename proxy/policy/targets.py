"""What a rule's `host` and a policy's `allow_networks` may say, and the warnings they earn.

Pure functions on the text of one field: they return the canonical value and the warnings, or
raise TargetError, and the rules reader puts file, line and field around either. The warnings
name what the guard refuses whatever the rules say, so a rule that can never match is caught
when the file is checked rather than when a request fails.
"""

from __future__ import annotations

from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_network
from typing import Final

from sealgate.hostname import Host, HostError, canonical_name, denied_name
from sealgate.reasons import Reason
from sealgate.yamlfile import show

from ..errors import ProxyError
from ..net.addresses import METADATA_ADDRESSES
from .model import ANY_HOST

__all__ = ["Lint", "TargetError", "host_pattern", "network"]

# (code, message): see docs/rules.md for the codes.
Lint = tuple[str, str]

# For a warning only: the address layer refuses these whatever allow_networks says.
_METADATA_FORMS: Final = (
    *METADATA_ADDRESSES,
    *(IPv6Address(f"::ffff:{a}") for a in METADATA_ADDRESSES if a.version == 4),
)
_WIDE_PREFIX: Final = {4: 16, 6: 48}


class TargetError(ProxyError, ValueError):
    """A host or network a rule may not name; the message is safe to show."""

    reason = Reason.RULES_INVALID


def host_pattern(raw: str) -> tuple[str, list[Lint]]:
    """`*`, `*.suffix`, or a canonical name or IP literal (IPv6 without brackets)."""
    if raw == ANY_HOST:
        return ANY_HOST, [("any_host", "'*' allows every public host")]
    wildcard = raw.startswith("*.")
    body = raw[2:] if wildcard else raw
    if "*" in body:
        raise TargetError("'*' is only allowed alone or as a leading '*.'")
    try:
        host = canonical_name(body)  # rules may write an IPv6 address without brackets
    except HostError as exc:
        # Not echoed: a pasted URL may carry userinfo. hostname.py words its errors safely.
        raise TargetError(f"invalid host: {exc}") from None
    if wildcard and host.ip is not None:
        raise TargetError(f"{show(raw)}: a wildcard cannot cover an IP address")
    pattern = f"*.{host.name}" if wildcard else host.name
    lints: list[Lint] = []
    if body.strip("[]") != host.name:
        lints.append(
            ("noncanonical_host", f"{show(raw)} is matched as {pattern!r}; write it that way")
        )
    if host.ip is not None:
        lints.append(
            (
                "ip_literal_host",
                f"{pattern} matches only requests to that literal address, never a name",
            )
        )
    else:
        lints += _denied(host, wildcard, pattern)
    return pattern, lints


def _denied(host: Host, wildcard: bool, pattern: str) -> list[Lint]:
    # The guard refuses some names whatever the policy says. A wildcard is tested with one
    # sample subdomain: the name denials that cover subdomains are all suffix-based.
    probe = Host(f"x.{host.name}") if wildcard else host
    reason = denied_name(probe)
    if reason is not None:
        return [
            (
                "never_matches",
                f"{pattern} is always denied by the guard ({reason}); this rule can never match",
            )
        ]
    if wildcard and "." not in host.name:
        return [("broad_wildcard", f"{pattern} allows every name under a top-level domain")]
    return []


def network(text: str) -> tuple[IPv4Network | IPv6Network, list[Lint]]:
    """An `allow_networks` entry: a network in strict CIDR form (no host bits set)."""
    try:
        net = ip_network(text, strict=True)
    except ValueError as exc:
        raise TargetError(f"invalid network: {exc}") from None
    lints: list[Lint] = []
    if net.prefixlen < _WIDE_PREFIX[net.version]:
        lints.append(
            (
                "wide_network",
                f"{net} is wider than /{_WIDE_PREFIX[net.version]}; "
                "every address in it becomes reachable",
            )
        )
    if any(address in net for address in _METADATA_FORMS if address.version == net.version):
        lints.append(
            (
                "metadata_network",
                f"{net} contains a cloud metadata address; those stay denied regardless",
            )
        )
    return net, lints
