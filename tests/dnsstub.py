"""A DNS server on loopback that tests script.

It answers like a recursive resolver from a table the test fills in (following
CNAMEs inside its own table), over UDP and TCP on the same port, from one
background thread. Other processes can use it too: point them at ``address``.
"""

from __future__ import annotations

import ipaddress
import selectors
import socket
import struct
import threading
from dataclasses import dataclass, field
from types import TracebackType

from dnslib import QTYPE, RCODE, RR, DNSRecord

_CHAIN_LIMIT = 16
_MAX_TCP_BUFFER = 70_000
_POLL_SECONDS = 0.2
_BIND_TRIES = 20


def _norm(name: str) -> str:
    return name.rstrip(".").lower()


@dataclass
class _Entry:
    mode: str  # "answer", "nxdomain", "servfail" or "drop"
    sets: list[list[RR]] = field(default_factory=list)
    served: dict[int, int] = field(default_factory=dict)

    def next_set(self, qtype: int) -> list[RR]:
        count = self.served.get(qtype, 0)
        self.served[qtype] = count + 1
        return self.sets[min(count, len(self.sets) - 1)] if self.sets else []


class StubDNS:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._port = port
        self._family = (
            socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        )
        self._lock = threading.Lock()
        self._zone: dict[str, _Entry] = {}
        self._truncate: set[str] = set()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._sockets: list[socket.socket] = []
        self.queries: list[tuple[str, str]] = []

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> StubDNS:
        if self._thread is not None:
            raise RuntimeError("StubDNS already started")
        udp, tcp = self._bind()
        wake_r, wake_w = socket.socketpair()
        self._sockets = [udp, tcp, wake_r, wake_w]
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._serve, args=(udp, tcp, wake_r), name="StubDNS", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        self._sockets[3].send(b"x")
        self._thread.join(timeout=1.0)
        self._thread = None
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    def __enter__(self) -> StubDNS:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        if not self._sockets:
            raise RuntimeError("StubDNS not started")
        return self._host, int(self._sockets[0].getsockname()[1])

    # -- scripting -------------------------------------------------------------

    def set(self, name: str, *records: str, ttl: int = 60) -> None:
        """Answer ``name`` with ``records`` ("A 1.2.3.4", "CNAME x.test", ...)."""
        self._put(name, _Entry("answer", [self._records(name, records, ttl)]))

    def sequence(self, name: str, *answers: list[str], ttl: int = 0) -> None:
        """Successive queries per qtype get successive answer sets; the last repeats."""
        if not answers:
            raise ValueError("sequence needs at least one answer set")
        sets = [self._records(name, records, ttl) for records in answers]
        self._put(name, _Entry("answer", sets))

    def nxdomain(self, name: str) -> None:
        self._put(name, _Entry("nxdomain"))

    def servfail(self, name: str) -> None:
        self._put(name, _Entry("servfail"))

    def drop(self, name: str) -> None:
        self._put(name, _Entry("drop"))

    def truncate_udp(self, name: str) -> None:
        """UDP replies for ``name`` carry TC and no records; TCP gets the full answer."""
        with self._lock:
            self._truncate.add(_norm(name))

    def _put(self, name: str, entry: _Entry) -> None:
        with self._lock:
            self._zone[_norm(name)] = entry

    @staticmethod
    def _records(name: str, records: tuple[str, ...] | list[str], ttl: int) -> list[RR]:
        owner = _norm(name) + "."
        parsed: list[RR] = []
        for record in records:
            kind, _, value = record.strip().partition(" ")
            if kind.upper() == "CNAME":
                value = _norm(value) + "."
            parsed.extend(RR.fromZone(f"{owner} {ttl} IN {kind} {value}"))
        return parsed

    # -- serving ---------------------------------------------------------------

    def _bind(self) -> tuple[socket.socket, socket.socket]:
        # UDP and TCP must share a port; with an ephemeral port the TCP side
        # may find it taken, so try a few fresh ones.
        for _ in range(_BIND_TRIES):
            udp = socket.socket(self._family, socket.SOCK_DGRAM)
            udp.bind((self._host, self._port))
            port = udp.getsockname()[1]
            tcp = socket.socket(self._family, socket.SOCK_STREAM)
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                tcp.bind((self._host, port))
            except OSError:
                udp.close()
                tcp.close()
                if self._port:
                    raise
                continue
            tcp.listen(16)
            return udp, tcp
        raise OSError("StubDNS: no port free for both UDP and TCP")

    def _serve(self, udp: socket.socket, tcp: socket.socket, wake: socket.socket) -> None:
        conns: dict[socket.socket, bytearray] = {}
        with selectors.DefaultSelector() as selector:
            selector.register(udp, selectors.EVENT_READ)
            selector.register(tcp, selectors.EVENT_READ)
            selector.register(wake, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in selector.select(timeout=_POLL_SECONDS):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is udp:
                        self._serve_udp(udp)
                    elif sock is tcp:
                        conn, _ = tcp.accept()
                        conn.settimeout(1.0)
                        conns[conn] = bytearray()
                        selector.register(conn, selectors.EVENT_READ)
                    elif sock in conns and not self._serve_tcp(sock, conns[sock]):
                        selector.unregister(sock)
                        del conns[sock]
                        sock.close()
            for conn in conns:
                conn.close()

    def _serve_udp(self, udp: socket.socket) -> None:
        try:
            data, peer = udp.recvfrom(4096)
        except OSError:
            return
        reply = self._answer(data, over_tcp=False)
        if reply is not None:
            udp.sendto(reply, peer)

    def _serve_tcp(self, conn: socket.socket, buffer: bytearray) -> bool:
        """Handle readable ``conn``; False when it should be closed."""
        try:
            chunk = conn.recv(65536)
        except OSError:
            return False
        buffer += chunk
        if not chunk or len(buffer) > _MAX_TCP_BUFFER:
            return False
        while len(buffer) >= 2:
            (length,) = struct.unpack_from("!H", buffer)
            if len(buffer) < 2 + length:
                break
            message = bytes(buffer[2 : 2 + length])
            del buffer[: 2 + length]
            reply = self._answer(message, over_tcp=True)
            if reply is not None:
                try:
                    conn.sendall(struct.pack("!H", len(reply)) + reply)
                except OSError:
                    return False
        return True

    def _answer(self, data: bytes, *, over_tcp: bool) -> bytes | None:
        try:
            query = DNSRecord.parse(data)
        except Exception:  # garbage from a test: ignore it like a real server
            return None
        if len(query.questions) != 1:
            return None
        qname = _norm(str(query.q.qname))
        qtype = int(query.q.qtype)
        reply = query.reply()
        with self._lock:
            self.queries.append((qname, str(QTYPE.get(qtype, qtype))))
            entry = self._zone.get(qname)
            if entry is not None and entry.mode == "drop":
                return None
            if entry is not None and entry.mode == "servfail":
                reply.header.rcode = RCODE.SERVFAIL
            elif not over_tcp and qname in self._truncate:
                reply.header.tc = 1
            else:
                self._fill(reply, qname, qtype)
        return bytes(reply.pack())

    def _fill(self, reply: DNSRecord, qname: str, qtype: int) -> None:
        current = qname
        for _ in range(_CHAIN_LIMIT):
            entry = self._zone.get(current)
            if entry is None or entry.mode != "answer":
                reply.header.rcode = RCODE.NXDOMAIN
                return
            records = [rr for rr in entry.next_set(qtype) if rr.rtype in (qtype, QTYPE.CNAME)]
            for rr in records:
                reply.add_answer(rr)
            cnames = [rr for rr in records if rr.rtype == QTYPE.CNAME]
            if qtype == QTYPE.CNAME or not cnames or len(cnames) != len(records):
                return
            current = _norm(str(cnames[0].rdata.label))
