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
from typing import TYPE_CHECKING, Final, Protocol

from sealgate.hostname import Host, HostError, denied_name, split_authority
from sealgate.hostport import format_hostport
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

if TYPE_CHECKING:
    # Annotations only: the guard itself (`Guard`, `Pin`) is used without mitmproxy, by the
    # MCP server's own process (proxy/calls.py), which has none.
    from mitmproxy import http

__all__ = [
    "DEFAULT_SANDBOX_NETWORKS",
    "Guard",
    "Pin",
    "parse_target",
    "request_target",
    "strip_downstream_headers",
    "strip_upstream_headers",
]
# Headers a sandbox must not be able to send upstream: its proxy credentials, forwarding claims
# that upstreams (and cloud metadata services) trust, and our own control headers.
_STRIP_UP_EXACT: Final = ("proxy-authorization", "proxy-connection", "forwarded", "x-real-ip")
_STRIP_PREFIXES: Final = ("x-forwarded-", "x-sealgate-")
_STRIP_UP_EXACT_B: Final = frozenset(n.encode() for n in _STRIP_UP_EXACT)
_STRIP_PREFIXES_B: Final = tuple(p.encode() for p in _STRIP_PREFIXES)
_SCHEMES: Final = frozenset({"http", "https"})


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


def request_target(
    request: http.Request, tunnel: tuple[Host, int] | None, transparent: bool
) -> tuple[Host, int]:
    """The one destination a request names, after checking that all its names agree.

    Absolute-form requests name it in the URI (RFC 9112 says a proxy must ignore Host then; we
    go further and refuse a Host that disagrees, since the upstream would route on it). Inside a
    CONNECT tunnel the Host header must name the CONNECT authority, which the TLS SNI has already
    been checked against. In transparent mode the Host header (or SNI) names it and the original
    destination port stays. The caller points the request at exactly what this returns, so
    what mitmproxy dials is what was checked.
    """
    if request.scheme not in _SCHEMES:
        raise Denial(Reason.SCHEME_INVALID, f"scheme {request.scheme!r} is not proxied")
    default_port = 443 if request.scheme == "https" else 80
    header = request.host_header
    # Inside a tunnel and in transparent mode mitmproxy forwards an absolute-form target as it
    # came, and an origin routes on it (RFC 9112 3.2.2): it is a name to check like Host.
    uri = request.authority or None
    # Over HTTP/2 and 3, host_header is `:authority`; a `host` header beside it would reach an
    # HTTP/1 upstream as sent (mitmproxy adds Host only when there is none).
    also = request.headers.get("host") if request.is_http2 or request.is_http3 else None
    if tunnel is not None:
        # A missing port means the tunnel's: the dial goes there regardless.
        for name in (header, uri, also):
            if name is not None and parse_target(name, tunnel[1]) != tunnel:
                raise Denial(
                    Reason.NAME_MISMATCH, "the request names another host than the CONNECT"
                )
        return tunnel
    if transparent:
        if header is None:
            raise Denial(Reason.BAD_REQUEST, "a transparent request needs a Host header")
        host, port = parse_target(header, request.port)
        for name in (uri, also):
            if name is not None and parse_target(name, request.port) != (host, port):
                raise Denial(Reason.NAME_MISMATCH, "the request URI and Host header disagree")
        return host, request.port
    # mitmproxy has parsed the request-target before any hook and kept no raw form of it
    # (`:0` and `:0080` come out as 80), so the Host header, which HTTP/1.1 requires anyway
    # (RFC 9112 3.2), is the spelling that gets checked, and the URI must agree with it.
    uri_host, uri_port = parse_target(format_hostport(request.host, request.port), default_port)
    if header is None:
        raise Denial(Reason.BAD_REQUEST, "a Host header is required")
    if parse_target(header, default_port) != (uri_host, uri_port):
        raise Denial(Reason.NAME_MISMATCH, "Host header does not match the request URI")
    return uri_host, uri_port


def strip_upstream_headers(headers: http.Headers) -> None:
    # Scan the raw fields first: almost every request has nothing to strip, and deleting from
    # mitmproxy's Headers rebuilds them.
    doomed = {
        name.lower()
        for name, _ in headers.fields
        if name.lower() in _STRIP_UP_EXACT_B or name.lower().startswith(_STRIP_PREFIXES_B)
    }
    for name in doomed:
        del headers[name.decode("latin-1")]


def strip_downstream_headers(headers: http.Headers) -> None:
    """An upstream must not be able to forge our verdicts or control headers."""
    doomed = {name.lower() for name, _ in headers.fields if name.lower().startswith(b"x-sealgate-")}
    for name in doomed:
        del headers[name.decode("latin-1")]


def _ip_or_none(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
