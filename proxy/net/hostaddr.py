"""The proxy host's own addresses and the sandbox networks: never reachable through the proxy.

The denied-address table (sealgate.proxy.net.addresses) judges an address alone, and a policy's
allow_networks can open most of it. Two denials depend on the machine instead, and nothing opens
them, exactly as nothing opens the metadata addresses:

* ``host_address``: an address the kernel delivers to this host (route type local or anycast):
  an address on any interface, one added after start (each new sandbox link's host end, the
  gateway on lo) or a range routed locally (``ip route add local ...``). The kernel is asked on
  every check with an RTM_GETROUTE lookup, the route lookup connect() itself makes, so the
  answer is exact at that moment; binding a socket to the address would say "not local" under
  net.ipv4.ip_nonlocal_bind=1. A lookup costs about 1.7 µs, paid per answer of every check.
  Loopback and the unspecified addresses (connect() turns those into loopback) stay with the
  table and allow_networks: a policy that opens 127.0.0.1/32 has chosen to.
* ``sandbox_network``: the sandbox ranges (by default the runtime's 10.200.0.0/16), in any IPv6
  spelling that embeds them. The sandbox ends of links live in other namespaces but are routed
  from the host: sandbox A must never reach sandbox B through the proxy.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv6Address, ip_network
from typing import Final

from sealgate.reasons import Reason

from .addresses import IPAddress, IPNetwork, embedded_ipv4

__all__ = [
    "DEFAULT_SANDBOX_NETWORKS",
    "HostAddresses",
    "LocalRoutes",
    "parse_networks",
]

# sandbox.network.DEFAULT_RANGE (the proxy does not import the runtime; a test keeps them equal).
DEFAULT_SANDBOX_NETWORKS: Final = ("10.200.0.0/16",)

_RTM_NEWROUTE: Final = 24
_RTM_GETROUTE: Final = 26
_NLMSG_ERROR: Final = 2
_NLM_F_REQUEST: Final = 1
_RTA_DST: Final = 1
_RTN_LOCAL: Final = 2
_RTN_ANYCAST: Final = 4
_NLMSG_HDR: Final = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
# struct rtmsg (family, dst_len, src_len, tos, table, protocol, scope, type, flags), then the
# RTA_DST attribute's header (length, type).
_RTMSG_DST: Final = struct.Struct("=BBBBBBBBIHH")
_RTM_TYPE_OFFSET: Final = _NLMSG_HDR.size + 7
_ERROR: Final = struct.Struct("=i")
# Route lookup failures: the destination has no route (or a blackhole, unreachable or prohibit
# one), so nothing here receives it and the dial fails on its own. Any other error is not an
# answer and fails the check closed.
_UNROUTABLE: Final = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EACCES, errno.EINVAL})
_STALE_REPLIES: Final = 8


class LocalRoutes:
    """Asks the kernel, per address, whether it would deliver a connection to this host.

    The socket is non-blocking: rtnetlink answers a request inside the send call, so the reply
    is already queued when `recv` runs; no reply is an error, never a wait. Not thread-safe: one
    event loop uses it, and a check never awaits.
    """

    def __init__(self) -> None:
        self._sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK,
            socket.NETLINK_ROUTE,
        )
        self._sock.bind((0, 0))
        self._seq = 0
        # Every later EINVAL counts as "unroutable": prove now that the query itself is right.
        if not self.delivered_here(IPv4Address("127.0.0.1")):
            self.close()
            raise OSError("the kernel's route lookup does not call 127.0.0.1 local")

    def delivered_here(self, ip: IPAddress) -> bool:
        """Whether a connection to `ip` would be received by this host. OSError: unknown."""
        raw = ip.packed
        family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        body = _RTMSG_DST.pack(family, len(raw) * 8, 0, 0, 0, 0, 0, 0, 0, 4 + len(raw), _RTA_DST)
        length = _NLMSG_HDR.size + len(body) + len(raw)
        self._sock.send(_NLMSG_HDR.pack(length, _RTM_GETROUTE, _NLM_F_REQUEST, self._seq, 0)
                        + body + raw)
        for _ in range(_STALE_REPLIES):
            try:
                reply = self._sock.recv(4096)
            except BlockingIOError:
                raise OSError(errno.ETIMEDOUT, "no answer to a route lookup") from None
            if len(reply) < _NLMSG_HDR.size + _ERROR.size:
                raise OSError(errno.EBADMSG, "short route lookup answer")
            _, kind, _, seq, _ = _NLMSG_HDR.unpack_from(reply)
            if seq != self._seq:
                continue  # an answer to an earlier lookup that gave up on it
            if kind == _NLMSG_ERROR:
                code = -_ERROR.unpack_from(reply, _NLMSG_HDR.size)[0]
                if code in _UNROUTABLE:
                    return False
                raise OSError(code, f"route lookup for {ip} failed")
            if kind != _RTM_NEWROUTE or len(reply) <= _RTM_TYPE_OFFSET:
                raise OSError(errno.EBADMSG, f"unexpected route lookup answer (type {kind})")
            return reply[_RTM_TYPE_OFFSET] in (_RTN_LOCAL, _RTN_ANYCAST)
        raise OSError(errno.EBADMSG, "no answer to the route lookup among stale ones")

    def close(self) -> None:
        self._sock.close()


def parse_networks(texts: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDRs as given on the command line; host bits set is an error, as in allow_networks."""
    networks: list[IPNetwork] = []
    for text in texts:
        try:
            networks.append(ip_network(text.strip()))
        except ValueError as exc:
            raise ValueError(f"sandbox network {text!r}: {exc}") from None
    return tuple(networks)


class HostAddresses:
    """The denials no policy lifts that depend on this host: its own addresses, its sandboxes'."""

    __slots__ = ("_routes", "_sandbox")

    def __init__(self, routes: LocalRoutes, sandbox_networks: Iterable[IPNetwork]) -> None:
        self._routes = routes
        self._sandbox = tuple(
            (net.version, int(net[0]), int(net[-1])) for net in sandbox_networks
        )

    def check(self, address: IPAddress) -> Reason | None:
        """None, host_address or sandbox_network. OSError when the kernel cannot be asked."""
        mapped = address.ipv4_mapped if isinstance(address, IPv6Address) else None
        dialed = mapped or address  # what connect() is given for a mapped address
        if dialed.is_unspecified:
            # connect() turns 0.0.0.0 and :: into the host itself, loopback services included,
            # which an allow_networks entry for 0.0.0.0/8 must not open.
            return Reason.HOST_ADDRESS
        if not dialed.is_loopback and self._routes.delivered_here(dialed):
            return Reason.HOST_ADDRESS
        inner = embedded_ipv4(dialed) if isinstance(dialed, IPv6Address) else None
        for candidate in (dialed, inner):
            if candidate is not None and self._in_sandbox(candidate):
                return Reason.SANDBOX_NETWORK
        return None

    def _in_sandbox(self, ip: IPv4Address | IPv6Address) -> bool:
        n = int(ip)
        return any(v == ip.version and first <= n <= last for v, first, last in self._sandbox)
