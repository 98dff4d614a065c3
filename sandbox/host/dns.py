"""The sandbox's name server: every name is the proxy, and nothing is ever forwarded.

Clients that ignore the proxy variables resolve a name and connect to the answer. Every A
query is answered with the host end of the sandbox's link, whose TCP the firewall hands to the
proxy's transparent listener, where the SNI or Host header names the destination and the proxy
decides, resolving the real name itself. AAAA and every other type get an empty answer (IPv6
is off), so a query carries nothing out (no DNS tunnel) and learns nothing in.

One UDP socket on the host end of the link, on a port of the kernel's choosing (a name server of
the host's own may hold port 53 on every address; the sandbox's firewall table sends its port
53 here), bound before the sandbox starts (queries sent before it is served wait in the
socket), served until the sandbox ends: by a thread of its own for a one-shot run (`FakeDns`),
or on the daemon's event loop (`LoopDns`), one socket among hundreds. Either way it runs
outside the sandbox's CPU limit, so its work is bounded twice: the sandbox's table lets at most
`RATE` queries a second (`BURST` at once) reach the socket, and the server itself reads no more
than that (`_Bucket`), even were the table to let more through: the rest wait in the socket's
buffer, and the kernel drops what does not fit.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
import time
from ipaddress import IPv4Address

from dnslib import QTYPE, RCODE, RR, A, DNSRecord

_TTL = 60
_MAX_QUERY = 512
_JOIN_SECONDS = 2.0
RATE = 50  # queries a second, per sandbox
BURST = 100


class _Bucket:
    """Tokens for `RATE` queries a second, at most `BURST` saved up."""

    def __init__(self) -> None:
        self._tokens = float(BURST)
        self._stamp = time.monotonic()

    def wait(self) -> float:
        """Seconds until a query may be read (0: now)."""
        now = time.monotonic()
        self._tokens = min(BURST, self._tokens + (now - self._stamp) * RATE)
        self._stamp = now
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / RATE

    def spend(self) -> None:
        self._tokens -= 1


class _Names:
    """The socket, bound on the host end of the link before the sandbox starts, and the
    answers; how it is served is the subclass's."""

    def __init__(self, bind: IPv4Address, answer: IPv4Address,
                 sock: socket.socket | None = None) -> None:
        """`sock`: the socket already bound (a sandbox a predecessor daemon handed over)."""
        self._answer = str(answer)
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((str(bind), 0))
        self._sock = sock
        self.port: int = self._sock.getsockname()[1]
        self._bucket = _Bucket()

    def _one(self) -> bool:
        """Read and answer one query; False once the socket has nothing (or is closed)."""
        try:
            packet, peer = self._sock.recvfrom(_MAX_QUERY)
        except OSError:  # nothing waiting (timeout, would block), or closed
            return False
        self._bucket.spend()
        reply = self.answer(packet)
        if reply is not None:
            with contextlib.suppress(OSError):
                self._sock.sendto(reply, peer)
        return True

    def answer(self, packet: bytes) -> bytes | None:
        """The reply to one query; None for what is not a query, or what dnslib cannot parse
        or pack back (it accepts some names it then refuses to write): never answered."""
        try:
            query = DNSRecord.parse(packet)
            if query.header.qr or len(query.questions) != 1:
                return None
            reply = query.reply()
            question = query.q
            if question.qtype == QTYPE.A:
                reply.add_answer(RR(question.qname, QTYPE.A, rdata=A(self._answer), ttl=_TTL))
            reply.header.rcode = RCODE.NOERROR
            return bytes(reply.pack())
        except Exception:  # dnslib raises assorted errors on hostile input
            return None


class FakeDns(_Names):
    """Served by a thread of its own (a one-shot run)."""

    def __init__(self, bind: IPv4Address, answer: IPv4Address) -> None:
        super().__init__(bind, answer)
        self._sock.setblocking(False)
        self._stop = threading.Event()
        # Wakes the thread at once on close: a packet to the socket itself would be dropped by
        # the sandbox's own table (only the sandbox may ask), leaving the thread to a poll's
        # end, which had every run's teardown wait 100-200 ms for it.
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="sealgate-sandbox-dns",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(_JOIN_SECONDS)
        for sock in (self._sock, self._wake_r, self._wake_w):
            sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            # Not even read before a token is there: a flood costs this thread nothing more.
            if (delay := self._bucket.wait()) > 0:
                self._stop.wait(delay)
                continue
            ready, _, _ = select.select([self._sock, self._wake_r], [], [])
            if self._sock in ready:
                self._one()


class LoopDns(_Names):
    """Served on an event loop: read while there are tokens, then not at all until the
    bucket has one again (the socket is left alone, its buffer fills, the kernel drops)."""

    def __init__(self, bind: IPv4Address, answer: IPv4Address,
                 sock: socket.socket | None = None) -> None:
        super().__init__(bind, answer, sock)
        self._sock.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._later: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._sock, self._readable)

    def _readable(self) -> None:
        assert self._loop is not None
        while (delay := self._bucket.wait()) == 0:
            if not self._one():
                return
        self._loop.remove_reader(self._sock)
        self._later = self._loop.call_later(delay, self._loop.add_reader, self._sock,
                                            self._readable)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._sock)
            if self._later is not None:
                self._later.cancel()
        self._sock.close()

    def fileno(self) -> int:
        """The socket, to hand to a successor daemon with its sandbox."""
        return self._sock.fileno()
