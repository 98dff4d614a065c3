"""The guard's own DNS client: asyncio, no system resolver, no search path.

The proxy must classify exactly the addresses it will connect to, so it cannot
let getaddrinfo (with its search domains, /etc/hosts and caching daemons) pick
them. This module asks the configured servers directly, validates every reply
against the query it sent and returns all A and AAAA addresses for the caller
to classify and pin.

Choices worth knowing:

* A and AAAA are asked concurrently and independently. If one family fails
  transiently (timeout, SERVFAIL) while the other returned addresses, the
  addresses are returned: refusing the connection because of a broken AAAA
  server would be worse, and the caller classifies whatever it gets. Such a
  partial answer is cached for at most ``negative_ttl`` so the missing family
  is asked again soon.
* ``timeout`` bounds one round over all servers: each try of one server gets
  ``timeout / len(servers)``. A lookup therefore ends within roughly
  ``timeout * attempts``.
* Over UDP, datagrams that do not match the query (wrong id, question, source
  or garbage) are dropped and the client keeps waiting until the try's
  deadline, so an off-path spoofer can only cause a timeout. Over TCP the
  stream is connected to the server, so a mismatch there is ``dns_error``.
* CNAME chains are followed only inside the answer section (depth 8); no extra
  queries are made, so a reply cannot steer the client to other servers.

Why the wire exchange is written here and not dnspython's `asyncquery` (judged for
issue 10; dnspython 2.7 measured in place of `_ask`, the rest of this module kept):
dnspython matches replies as this does (id, question, source; 35 of the 36
tests in tests/unit/test_resolver.py pass with it, spoofed replies included),
but it would be a second DNS library, not a replacement: dnslib stays for the
sandbox's name server (sandbox/dns.py) and the tests' stub. It does not report
an ICMP "port unreachable", so a server that is down costs each try its whole
timeout (`dns_timeout`) instead of failing at once (`dns_error`), the one test
that fails. And a cold query costs about 1.8 times this one (UDP 360 against
200 µs, TCP 520 against 290 µs, on loopback). It would save about 100 lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, TypedDict, Unpack

from dnslib import QTYPE, RCODE, RR, DNSHeader, DNSLabel, DNSQuestion, DNSRecord

from sealgate.reasons import Reason

from ..errors import ProxyError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

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
class Answer:
    name: str
    addresses: tuple[IPAddress, ...]
    expires: float
    duration: float


class ResolverOptions(TypedDict, total=False):
    timeout: float
    attempts: int
    cache_size: int
    min_ttl: float
    max_ttl: float
    negative_ttl: float


@dataclass(frozen=True, slots=True)
class _Server:
    host: str
    family: socket.AddressFamily
    # A sockaddr the event loop accepts without calling getaddrinfo: the host
    # part carries no "%scope" (the scope id travels as a number instead).
    sockaddr: tuple[str, int] | tuple[str, int, int, int]

    @classmethod
    def parse(cls, host: str, port: int) -> _Server:
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
class _Found:
    """A NOERROR reply for one family; empty ``addresses`` means NODATA."""

    addresses: tuple[IPAddress, ...]
    ttl: float


@dataclass(frozen=True, slots=True)
class _Negative:
    reason: Reason
    message: str
    expires: float


def _check_name(name: str) -> str:
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


def _match_response(data: bytes, qid: int, name: str, qtype: int) -> DNSRecord | None:
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


def _extract(reply: DNSRecord, name: str, qtype: int) -> _Found:
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
            return _Found(tuple(dict.fromkeys(addresses)), float(min(ttls)))
        cnames = [rr for rr in owned if rr.rtype == QTYPE.CNAME]
        if not cnames:
            return _Found((), 0.0)
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
        self, server: _Server, qid: int, name: str, qtype: int, reply: asyncio.Future[DNSRecord]
    ) -> None:
        self._server = server
        self._qid = qid
        self._name = name
        self._qtype = qtype
        self.reply = reply

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if self.reply.done() or not self._server.matches(addr):
            return
        reply = _match_response(data, self._qid, self._name, self._qtype)
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


async def _ask_udp(server: _Server, name: str, qtype: int) -> DNSRecord:
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


async def _ask_tcp(server: _Server, name: str, qtype: int) -> DNSRecord:
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
    reply = _match_response(data, qid, name, qtype)
    if reply is None:
        raise ResolveError(
            Reason.DNS_ERROR, f"DNS lookup for {name!r} failed: mismatched TCP reply"
        )
    return reply


class Resolver:
    """Asks ``servers`` (IP literals) directly, never the system resolver.

    Not thread-safe: use one instance from one event loop.
    """

    def __init__(
        self,
        servers: Sequence[tuple[str, int]],
        *,
        timeout: float = 2.0,
        attempts: int = 2,
        cache_size: int = 4096,
        min_ttl: float = 1.0,
        max_ttl: float = 300.0,
        negative_ttl: float = 5.0,
    ) -> None:
        if not servers:
            raise ValueError("at least one DNS server is required")
        if (
            timeout <= 0
            or attempts < 1
            or cache_size < 1
            or not 0 <= min_ttl <= max_ttl
            or negative_ttl < 0
        ):
            raise ValueError("invalid resolver limits")
        self._servers = tuple(_Server.parse(host, port) for host, port in servers)
        self._try_timeout = timeout / len(self._servers)
        self._attempts = attempts
        self._cache_size = cache_size
        self._min_ttl = min_ttl
        self._max_ttl = max_ttl
        self._negative_ttl = negative_ttl
        self._cache: OrderedDict[str, Answer | _Negative] = OrderedDict()
        self._inflight: dict[str, asyncio.Task[Answer]] = {}

    @classmethod
    def from_system(
        cls, resolv_conf: Path = Path("/etc/resolv.conf"), **kw: Unpack[ResolverOptions]
    ) -> Resolver:
        """Servers from ``nameserver`` lines only.

        search/domain/ndots are ignored on purpose: the proxy resolves the exact
        name it was given. A missing file or no usable line means
        127.0.0.1:53, as in glibc.
        """
        servers: list[tuple[str, int]] = []
        with contextlib.suppress(OSError):
            for line in resolv_conf.read_text(encoding="utf-8", errors="replace").splitlines():
                fields = line.split()
                if len(fields) >= 2 and fields[0] == "nameserver":
                    with contextlib.suppress(ValueError):
                        _Server.parse(fields[1], 53)
                        servers.append((fields[1], 53))
        return cls(servers or [("127.0.0.1", 53)], **kw)

    @classmethod
    def from_spec(cls, spec: str | None, **kw: Unpack[ResolverOptions]) -> Resolver:
        """``HOST:PORT``, ``[V6]:PORT``, ``HOST`` or bare IPv6; None: the system's."""
        if spec is None:
            return cls.from_system(**kw)
        return cls([_parse_spec(spec)], **kw)

    @property
    def servers(self) -> tuple[tuple[str, int], ...]:
        """The servers asked, in order (for startup logs)."""
        return tuple((server.host, server.sockaddr[1]) for server in self._servers)

    def cached(self, name: str) -> Answer | None:
        entry = self._cache_get(name.lower())
        return entry if isinstance(entry, Answer) else None

    async def resolve(self, name: str) -> Answer:
        """All addresses of ``name``; raises ResolveError.

        ``name`` must already be canonical (lower-case LDH, no trailing dot);
        anything else fails closed as ResolveError(dns_error).
        """
        # Only a name that passed the check is ever cached, so a hit needs no second check.
        entry = self._cache_get(name)
        key = name if entry is not None else _check_name(name)
        if entry is None and key != name:
            entry = self._cache_get(key)
        if isinstance(entry, Answer):
            return entry
        if isinstance(entry, _Negative):
            raise ResolveError(entry.reason, entry.message)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._lookup(key))
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        # shield: a waiter that is cancelled must not cancel the shared lookup.
        return await asyncio.shield(task)

    def _finished(self, key: str, task: asyncio.Task[Answer]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # mark retrieved: every waiter may have gone away

    def _cache_get(self, key: str) -> Answer | _Negative | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        if entry.expires <= time.monotonic():
            del self._cache[key]
            return None
        self._cache.move_to_end(key)
        return entry

    def _cache_put(self, key: str, entry: Answer | _Negative) -> None:
        self._cache[key] = entry
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def _lookup(self, name: str) -> Answer:
        started = time.monotonic()
        outcomes = await asyncio.gather(
            self._lookup_family(name, QTYPE.A), self._lookup_family(name, QTYPE.AAAA)
        )
        now = time.monotonic()
        found = [o for o in outcomes if isinstance(o, _Found)]
        failed = [o for o in outcomes if isinstance(o, ResolveError)]
        addresses = tuple(a for o in found for a in o.addresses)
        if addresses:
            ttl = min(o.ttl for o in found if o.addresses)
            lifetime = min(max(ttl, self._min_ttl), self._max_ttl)
            if failed:
                lifetime = min(lifetime, self._negative_ttl)
            answer = Answer(name, addresses, now + lifetime, now - started)
            self._cache_put(name, replace(answer, duration=0.0))
            return answer
        transient = [e for e in failed if e.reason != Reason.DNS_NXDOMAIN]
        if transient:
            worst = (
                Reason.DNS_ERROR
                if any(e.reason == Reason.DNS_ERROR for e in transient)
                else Reason.DNS_TIMEOUT
            )
            raise next(e for e in transient if e.reason == worst)
        if len(failed) == len(outcomes):
            reason, message = Reason.DNS_NXDOMAIN, f"DNS lookup for {name!r} failed: no such name"
        else:
            reason, message = Reason.DNS_NO_ANSWER, f"DNS lookup for {name!r} returned no addresses"
        self._cache_put(name, _Negative(reason, message, now + self._negative_ttl))
        raise ResolveError(reason, message)

    async def _lookup_family(self, name: str, qtype: int) -> _Found | ResolveError:
        """A definitive outcome, or the worst transient failure seen."""
        errors: list[ResolveError] = []
        for _ in range(self._attempts):
            for server in self._servers:
                try:
                    reply = await self._ask(server, name, qtype)
                except ResolveError as exc:
                    errors.append(exc)
                    continue
                rcode = reply.header.rcode
                if rcode == RCODE.NOERROR:
                    try:
                        return _extract(reply, name, qtype)
                    except ResolveError as exc:
                        errors.append(exc)
                        continue
                if rcode == RCODE.NXDOMAIN:
                    return ResolveError(
                        Reason.DNS_NXDOMAIN, f"DNS lookup for {name!r} failed: no such name"
                    )
                errors.append(
                    ResolveError(
                        Reason.DNS_ERROR,
                        f"DNS lookup for {name!r} failed: server answered {RCODE.get(rcode)}",
                    )
                )
        return next((e for e in errors if e.reason == Reason.DNS_ERROR), errors[-1])

    async def _ask(self, server: _Server, name: str, qtype: int) -> DNSRecord:
        try:
            async with asyncio.timeout(self._try_timeout):
                reply = await _ask_udp(server, name, qtype)
                if reply.header.tc:
                    reply = await _ask_tcp(server, name, qtype)
                return reply
        except TimeoutError:
            raise ResolveError(Reason.DNS_TIMEOUT, f"DNS lookup for {name!r} timed out") from None
        except OSError:
            raise ResolveError(
                Reason.DNS_ERROR, f"DNS lookup for {name!r} failed: network error"
            ) from None


def _parse_spec(spec: str) -> tuple[str, int]:
    text = spec.strip()
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(text)
        return text, 53
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad resolver address {spec!r}: expected [IPV6]:PORT")
        port_text = rest[1:] if rest else "53"
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(f"bad resolver address {spec!r}: expected HOST:PORT")
    if not port_text.isdigit():
        raise ValueError(f"bad resolver address {spec!r}: port must be a number")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"bad resolver address {spec!r}: host must be an IP address") from None
    return host, int(port_text)
