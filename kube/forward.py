"""`sealgate kube forward`: the pod's redirected connections sent on to the proxy, each as a
CONNECT to the name it is for.

A redirect inside the pod (`redirect.py`) cannot send a connection straight to the proxy's
transparent listener: that listener recovers the destination from its own kernel's NAT record,
and this NAT happened in the pod's network namespace, not the proxy's. So, as a service mesh's
sidecar does, a forwarder in the pod takes each connection, recovers where it was going
(`SO_ORIGINAL_DST`), reads the name it is for from its first bytes (a TLS ClientHello's SNI,
parsed by mitmproxy's parser; an HTTP/1 head's `Host`), and opens `CONNECT name:port` to the
proxy's explicit listener, from the pod's own address (the address the pod watcher told the
proxy: that is the sandbox's identity). The proxy then decides, pins, intercepts and injects
as for any client; the name is a claim the proxy checks again (SNI against the CONNECT name),
never trusted here.

The forwarder holds no credential and decides nothing: a connection whose name cannot be read
(no SNI, a protocol that waits for the server to speak first, bytes that are neither) goes as
`CONNECT address:port`, which the proxy's rules refuse unless they allow that address. Each
connection has bounds: `PEEK_BYTES` and `PEEK_SECONDS` to name it, `HEAD_BYTES` and
`DIAL_SECONDS` for the proxy's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import struct
from dataclasses import dataclass, field
from typing import Final

from mitmproxy.proxy.layers.tls import parse_client_hello

from sealgate.hostname import HostError, canonical_host
from sealgate.hostport import format_hostport

__all__ = ["Forwarder", "named", "original_destination"]

_LOG = logging.getLogger("sealgate.kube")

PEEK_BYTES: Final = 16 << 10  # a ClientHello with post-quantum key shares fits in well under
PEEK_SECONDS: Final = 5.0
HEAD_BYTES: Final = 8 << 10
DIAL_SECONDS: Final = 10.0
_CHUNK: Final = 64 << 10
_SO_ORIGINAL_DST: Final = 80  # linux/netfilter_ipv4.h; IP6T_SO_ORIGINAL_DST is the same number
_SOL_IPV6: Final = 41
_TLS_HANDSHAKE: Final = 0x16


def original_destination(sock: socket.socket) -> tuple[str, int] | None:
    """Where the connection was going before the redirect (None: it was not redirected)."""
    try:
        if sock.family == socket.AF_INET6:
            raw = sock.getsockopt(_SOL_IPV6, _SO_ORIGINAL_DST, 28)
            port, = struct.unpack_from("!H", raw, 2)
            return str(ipaddress.IPv6Address(raw[8:24])), port
        raw = sock.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
        port, = struct.unpack_from("!H", raw, 2)
        return str(ipaddress.IPv4Address(raw[4:8])), port
    except OSError:
        return None


def named(first: bytes) -> str | bool | None:
    """The name the first bytes say they are for: a string, None when they never will (not
    TLS or HTTP, or no name in them), False while more may still tell."""
    if not first:
        return False
    if first[0] == _TLS_HANDSHAKE:
        try:
            hello = parse_client_hello(first)
        except ValueError:
            return None
        if hello is None:
            return False if len(first) < PEEK_BYTES else None
        return _checked(hello.sni)
    head, ended, _ = first.partition(b"\r\n\r\n")
    if not ended:
        return False if len(first) < PEEK_BYTES else None
    for line in head.split(b"\r\n")[1:]:
        field, colon, value = line.partition(b":")
        if colon and field.strip().lower() == b"host":
            try:
                text = value.strip().decode("ascii")
            except UnicodeDecodeError:
                return None
            return _checked(text.rsplit(":", 1)[0] if not text.endswith("]") else text)
    return None


def _checked(name: str | None) -> str | None:
    """A name fit for a CONNECT line, canonical; anything else is no name."""
    if not name:
        return None
    try:
        return canonical_host(name).name
    except HostError:
        return None


@dataclass
class Forwarder:
    proxy: tuple[str, int]
    port: int  # on the loopback, IPv4 and (where the pod has it) IPv6
    served: int = 0
    refused: int = 0
    _open: set[asyncio.Task[None]] = field(default_factory=set)

    async def serve(self) -> asyncio.Server:
        try:
            return await asyncio.start_server(self._one, ["127.0.0.1", "::1"], self.port)
        except OSError:  # a pod without IPv6: its connections are all IPv4 then
            return await asyncio.start_server(self._one, "127.0.0.1", self.port)

    async def close(self, server: asyncio.Server) -> None:
        """No new connection, and each open one ended (a pod stopping: its workload is gone)."""
        server.close()
        for task in self._open:
            task.cancel()
        await asyncio.gather(*self._open, return_exceptions=True)
        await server.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a connection's callback runs as a task
        self._open.add(task)
        try:
            await self._forward(reader, writer)
        except (OSError, EOFError, asyncio.LimitOverrunError, TimeoutError, ValueError) as exc:
            self.refused += 1
            _LOG.info("connection not forwarded", extra={"error": str(exc)[:200]})
        finally:
            self._open.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                       ) -> None:
        sock = writer.get_extra_info("socket")
        target = original_destination(sock)
        if target is None or (target[1] == self.port
                              and ipaddress.ip_address(target[0]).is_loopback):
            raise ValueError("not a redirected connection")
        first, name = await _peek(reader)
        upstream_r, upstream_w = await asyncio.wait_for(
            asyncio.open_connection(*self.proxy), DIAL_SECONDS)
        try:
            authority = format_hostport(name or target[0], target[1])
            upstream_w.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
                             .encode())
            head = await asyncio.wait_for(upstream_r.readuntil(b"\r\n\r\n"), DIAL_SECONDS)
            if len(head) > HEAD_BYTES or not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
                if first and first[0] != _TLS_HANDSHAKE:
                    writer.write(head)  # an HTTP client reads the proxy's refusal as it is
                    await _relay_one(upstream_r, writer)
                raise ValueError(f"the proxy refused {authority}: {head[:64]!r}")
            self.served += 1
            upstream_w.write(first)
            await asyncio.gather(_relay_one(reader, upstream_w), _relay_one(upstream_r, writer))
        finally:
            upstream_w.close()
            with contextlib.suppress(OSError):
                await upstream_w.wait_closed()


async def _peek(reader: asyncio.StreamReader) -> tuple[bytes, str | None]:
    """The first bytes and the name in them, read for at most `PEEK_SECONDS`: a client that
    waits for the server to speak goes on unnamed with what it sent."""
    first = b""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PEEK_SECONDS
    while (said := named(first)) is False:
        left = deadline - loop.time()
        if left <= 0:
            return first, None
        try:
            more = await asyncio.wait_for(reader.read(PEEK_BYTES - len(first)), left)
        except TimeoutError:
            return first, None
        if not more:
            return first, None
        first += more
    return first, said if isinstance(said, str) else None


async def _relay_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One direction until its end, which is passed on as a half-close."""
    with contextlib.suppress(OSError):
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
