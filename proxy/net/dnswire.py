"""The DNS client's wire exchange (net/resolver.py asks through it): one question over UDP, or
over TCP when the answer was truncated, its reply matched against the question asked, and the
addresses read out of a matching reply.

Over UDP, datagrams that do not match the query (wrong id, question, source or garbage) are
dropped and the client keeps waiting until the try's deadline, so an off-path spoofer can only
cause a timeout. Over TCP the stream is connected to the server, so a mismatch there is
``dns_error``. CNAME chains are followed only inside the answer section (depth 8); no extra
queries are made, so a reply cannot steer the client to other servers.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import socket
import struct
from dataclasses import dataclass
from typing import Final

from dnslib import QTYPE, RR, DNSHeader, DNSLabel, DNSQuestion, DNSRecord

from sealgate.reasons import Reason

from ..errors import ProxyError
from .addresses import IPAddress

_CNAME_DEPTH: Final = 8
_CLASS_IN: Final = 1
_MAX_NAME: Final = 253
_MAX_LABEL: Final = 63
_LABEL_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")


class ResolveError(ProxyError):
    """A lookup failed; ``reason`` is one of the ``dns_*`` reasons (nxdomain, no_answer,
    timeout, error)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message, reason=reason)


@dataclass(frozen=True, slots=True)
class NameServer:
    host: str
    family: socket.AddressFamily
    # A sockaddr the event loop accepts without calling getaddrinfo: the host
    # part carries no "%scope" (the scope id travels as a number instead).
    sockaddr: tuple[str, int] | tuple[str, int, int, int]

    @classmethod
    def parse(cls, host: str, port: int) -> NameServer:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"DNS server must be an IP address, got {host!r}") from None
        if not 0 < port < 65536:
            raise ValueError(f"DNS server port out of range: {port}")
        if ip.version == 4:
            return cls(host, socket.AF_INET, (str(ip), port))
        # Numeric-only: this turns a scope name into the interface index and
        # never touches the network.
        try:
            info = socket.getaddrinfo(
                host, port, socket.AF_INET6, socket.SOCK_DGRAM, 0,
                socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            )
        except OSError:
            raise ValueError(f"DNS server address not usable here: {host!r}") from None
        addr = info[0][4]
        scope = addr[3] if len(addr) == 4 else 0
        return cls(host, socket.AF_INET6, (str(addr[0]).split("%")[0], port, 0, scope))

    def matches(self, addr: tuple[str | int, ...]) -> bool:
        try:
            host = ipaddress.ip_address(str(addr[0]).split("%")[0])
        except ValueError:
            return False
        return host == ipaddress.ip_address(self.sockaddr[0]) and addr[1] == self.sockaddr[1]


@dataclass(frozen=True, slots=True)
class Found:
    """A NOERROR reply for one family; empty ``addresses`` means NODATA."""

    addresses: tuple[IPAddress, ...]
    ttl: float


def check_name(name: str) -> str:
    key = name.lower()
    labels = key.split(".")
    if (
        not key
        or len(key) > _MAX_NAME
        or any(not 0 < len(label) <= _MAX_LABEL for label in labels)
        or not set(key) <= _LABEL_CHARS | {"."}
    ):
        # Fail closed as a DNS error: the guard turns it into a refusal, never an escape.
        raise ResolveError(Reason.DNS_ERROR, f"not a canonical host name: {name[:100]!r}")
    return key


def _label_key(label: DNSLabel) -> tuple[bytes, ...]:
    # DNSLabel stores raw label bytes; comparing those (not the dotted text)
    # keeps a label containing a literal "." from aliasing another name.
    return tuple(bytes(part).lower() for part in label.label)


def _name_key(name: str) -> tuple[bytes, ...]:
    return tuple(part.encode("ascii") for part in name.split("."))


def match_response(data: bytes, qid: int, name: str, qtype: int) -> DNSRecord | None:
    """The parsed reply if ``data`` answers exactly our question, else None."""
    if len(data) < 12 or struct.unpack_from("!H", data)[0] != qid:
        return None
    try:
        reply = DNSRecord.parse(data)
    except Exception:  # dnslib raises assorted errors on hostile input
        return None
    header = reply.header
    if not header.qr or header.opcode != 0 or len(reply.questions) != 1:
        return None
    question = reply.questions[0]
    if (
        question.qtype != qtype
        or question.qclass != _CLASS_IN
        or _label_key(question.qname) != _name_key(name)
    ):
        return None
    return reply


def extract(reply: DNSRecord, name: str, qtype: int) -> Found:
    """Addresses of ``qtype`` for ``name``, following CNAMEs in the answer."""
    records = [rr for rr in reply.rr if rr.rclass == _CLASS_IN]
    current = _name_key(name)
    ttls: list[int] = []
    for _ in range(_CNAME_DEPTH + 1):
        owned = [rr for rr in records if _label_key(rr.rname) == current]
        wanted = [rr for rr in owned if rr.rtype == qtype]
        if wanted:
            addresses = tuple(_address(rr, qtype, name) for rr in wanted)
            ttls.extend(rr.ttl for rr in wanted)
            return Found(tuple(dict.fromkeys(addresses)), float(min(ttls)))
        cnames = [rr for rr in owned if rr.rtype == QTYPE.CNAME]
        if not cnames:
            return Found((), 0.0)
        ttls.append(cnames[0].ttl)
        current = _label_key(cnames[0].rdata.label)
    raise ResolveError(Reason.DNS_ERROR, f"DNS lookup for {name!r} failed: CNAME chain too long")


def _address(rr: RR, qtype: int, name: str) -> IPAddress:
    kind = ipaddress.IPv4Address if qtype == QTYPE.A else ipaddress.IPv6Address
    try:
        return kind(str(rr.rdata))
    except ValueError:
        raise ResolveError(
            Reason.DNS_ERROR, f"DNS lookup for {name!r} failed: malformed address record"
        ) from None


class _UDPExchange(asyncio.DatagramProtocol):
    def __init__(
        self, server: NameServer, qid: int, name: str, qtype: int, reply: asyncio.Future[DNSRecord]
    ) -> None:
        self._server = server
        self._qid = qid
        self._name = name
        self._qtype = qtype
        self.reply = reply

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if self.reply.done() or not self._server.matches(addr):
            return
        reply = match_response(data, self._qid, self._name, self._qtype)
        if reply is not None:
            self.reply.set_result(reply)

    def error_received(self, exc: Exception) -> None:
        # ICMP unreachable on the connected socket: no server on that address.
        if not self.reply.done():
            self.reply.set_exception(
                ResolveError(
                    Reason.DNS_ERROR, f"DNS lookup for {self._name!r} failed: server unreachable"
                )
            )


def _query_packet(qid: int, name: str, qtype: int) -> bytes:
    return bytes(DNSRecord(DNSHeader(id=qid, rd=1), q=DNSQuestion(name + ".", qtype)).pack())


async def ask_udp(server: NameServer, name: str, qtype: int) -> DNSRecord:
    loop = asyncio.get_running_loop()
    qid = secrets.randbelow(1 << 16)
    # A fresh socket per query gets a fresh kernel-randomised source port;
    # connecting it makes the kernel drop datagrams from other sources too.
    reply: asyncio.Future[DNSRecord] = loop.create_future()
    sock = socket.socket(server.family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.connect(server.sockaddr)
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _UDPExchange(server, qid, name, qtype, reply), sock=sock
        )
    except BaseException:
        sock.close()
        raise
    try:
        transport.sendto(_query_packet(qid, name, qtype))
        return await reply
    finally:
        transport.close()


async def ask_tcp(server: NameServer, name: str, qtype: int) -> DNSRecord:
    loop = asyncio.get_running_loop()
    qid = secrets.randbelow(1 << 16)
    sock = socket.socket(server.family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, server.sockaddr)
        reader, writer = await asyncio.open_connection(sock=sock)
    except BaseException:
        sock.close()
        raise
    try:
        packet = _query_packet(qid, name, qtype)
        writer.write(struct.pack("!H", len(packet)) + packet)
        await writer.drain()
        (length,) = struct.unpack("!H", await reader.readexactly(2))
        data = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ResolveError(
            Reason.DNS_ERROR, f"DNS lookup for {name!r} failed: TCP reply cut short"
        ) from None
    finally:
        writer.close()
    reply = match_response(data, qid, name, qtype)
    if reply is None:
        raise ResolveError(
            Reason.DNS_ERROR, f"DNS lookup for {name!r} failed: mismatched TCP reply"
        )
    return reply
