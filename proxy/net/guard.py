"""The guard: decide on what is actually dialed, after resolution, and dial exactly that.

Names are only a pre-filter. The guard resolves a name itself (A and AAAA, no search path),
refuses the request if *any* answer falls in a denied range (a public name that resolves inside
is an attack, not a misconfiguration), and hands back the one address it checked. The addon pins
the upstream connection to that address in `server_connect`, so nothing resolves twice and a
rebinding answer has no window to slip through; every new upstream connection is checked again.

An answer is judged by the policy's address table (net.addresses) and by what it is on this
host (net.hostaddr): the host's own addresses and the sandbox networks, like the metadata
addresses, are refused whatever the policy's allow_networks say.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv6Address
from typing import Protocol

from sealgate.hostname import Host, HostError, denied_name, split_authority
from sealgate.reasons import Reason

from ..errors import Denial
from .addresses import AddressPolicy, IPAddress
from .hostaddr import (
    DEFAULT_SANDBOX_NETWORKS,
    HostAddresses,
    LocalRoutes,
    parse_networks,
)
from .resolver import ResolveError, Resolver

__all__ = [
    "DEFAULT_SANDBOX_NETWORKS",
    "Guard",
    "Pin",
    "parse_target",
]


@dataclass(frozen=True, slots=True)
class Pin:
    """The one address a request may be sent to, and what it cost to learn it."""

    host: Host
    port: int
    address: IPAddress
    dns_seconds: float


class Opened(Protocol):
    """What the guard reads of a policy (policy.model.Policy): the denied table with the
    policy's allow_networks opened. The policy is built on this table, so it names no policy."""

    @property
    def addresses(self) -> AddressPolicy: ...


class Guard:
    def __init__(
        self,
        resolver: Resolver,
        listen: Iterable[tuple[str, int]] = (),
        sandbox_networks: Iterable[str] = DEFAULT_SANDBOX_NETWORKS,
    ) -> None:
        """ValueError: a sandbox network is not a CIDR. OSError: the kernel cannot be asked
        which addresses are this host's (no netlink here)."""
        self.resolver = resolver
        self.sandbox_networks = parse_networks(sandbox_networks)
        self._own_ports = frozenset(port for _, port in listen)
        self._own_hosts = frozenset(_ip_or_none(host) for host, _ in listen) - {None}
        self._host = HostAddresses(LocalRoutes(), self.sandbox_networks)

    async def pin(self, host: Host, port: int, policy: Opened) -> Pin:
        """Resolve and classify every answer; the first address, if all of them may be reached."""
        if reason := denied_name(host):
            raise Denial(reason, f"{host.name} is never reachable through this proxy")
        if host.ip is not None:
            addresses: tuple[IPAddress, ...] = (host.ip,)
            dns_seconds = 0.0
        else:
            try:
                answer = await self.resolver.resolve(host.name)
            except ResolveError as exc:
                raise Denial(exc.reason, f"cannot resolve {host.name}") from exc
            addresses, dns_seconds = answer.addresses, answer.duration
        checker = policy.addresses
        host_check = self._host.check
        for address in addresses:
            direct = address.ipv4_mapped if isinstance(address, IPv6Address) else None
            reason = checker.check(address)
            if reason is not Reason.METADATA:
                # An OSError (the kernel could not be asked) refuses the request as an internal
                # error: unknown is not "not local".
                reason = host_check(address) or reason
            if reason:
                # The address itself stays in the audit log, not in the answer: the sandbox must
                # not get an oracle for what internal names resolve to.
                raise Denial(reason, f"{host.name} resolves to a denied address ({reason})")
            dialed = direct or address
            if port in self._own_ports and (dialed.is_loopback or dialed in self._own_hosts):
                raise Denial(Reason.PROXY_LOOP, "requests to the proxy itself are refused")
        return Pin(host, port, addresses[0], dns_seconds)


def parse_target(authority: str, default_port: int) -> tuple[Host, int]:
    try:
        return split_authority(authority, default_port)
    except HostError as exc:
        raise Denial(exc.reason, str(exc)) from exc


def _ip_or_none(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
