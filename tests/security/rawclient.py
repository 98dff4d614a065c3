"""Hand-crafted bytes through the proxy, and traps that prove nothing came out the other side.

HTTP client libraries normalise exactly what these tests need to send unnormalised (numeric
hosts, NUL, CR/LF, userinfo, odd ports), so requests are written byte for byte here. Every
socket has a deadline; every read is bounded in size.
"""

from __future__ import annotations

import base64
import contextlib
import json
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events

__all__ = [
    "TIMEOUT",
    "LoopbackTrap",
    "NoResponse",
    "RawResponse",
    "body_pieces",
    "connect_answer",
    "exchange",
    "h2_exchange",
    "h2_through_tunnel",
    "open_tunnel",
    "proxy_auth",
    "read_response",
    "request_bytes",
    "tls_wrap",
    "upload_whole",
]

TIMEOUT = 5.0
_MAX_RESPONSE = 1 << 20
_HEAD_END = b"\r\n\r\n"

Header = tuple[str | bytes, str | bytes]


class NoResponse(ConnectionError):
    """The peer closed (or went quiet) without sending an HTTP response."""


@dataclass(frozen=True, slots=True)
class RawResponse:
    status: int
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its last value
    body: bytes
    trailers: dict[str, str] = field(default_factory=dict)  # HTTP/2 only, as headers

    def json(self) -> dict[str, Any]:
        data = json.loads(self.body)
        assert isinstance(data, dict)
        return data

    @property
    def reason(self) -> str | None:
        """The proxy's reason code: `X-Sealgate-Error`, which must agree with the JSON body."""
        header = self.headers.get("x-sealgate-error")
        if header is not None:
            assert self.json()["reason"] == header, (header, self.body)
        return header


def proxy_auth(sandbox: str, key: str) -> str:
    return "Basic " + base64.b64encode(f"{sandbox}:{key}".encode()).decode("ascii")


def _b(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def request_bytes(
    method: str | bytes, target: str | bytes, headers: Iterable[Header] = ()
) -> bytes:
    """One HTTP/1.1 request head, exactly as given: nothing is validated or escaped."""
    lines = [_b(method) + b" " + _b(target) + b" HTTP/1.1"]
    lines += [_b(name) + b": " + _b(value) for name, value in headers]
    return b"\r\n".join(lines) + _HEAD_END


def exchange(port: int, data: bytes, *, timeout: float = TIMEOUT) -> RawResponse:
    """Send `data` to 127.0.0.1:`port` and read one response until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        # No half-close: mitmproxy drops a client that shuts its write side before the answer.
        sock.sendall(data)
        return read_response(sock, timeout=timeout)


def read_response(sock: socket.socket, *, timeout: float = TIMEOUT) -> RawResponse:
    """Read one response: its head, then Content-Length bytes or (without one) until EOF."""
    deadline = time.monotonic() + timeout
    buffer = b""
    while _HEAD_END not in buffer:
        chunk = _recv(sock, deadline, 65536)
        if not chunk:
            raise NoResponse(f"connection closed after {len(buffer)} bytes: {buffer[:200]!r}")
        buffer += chunk
    head, _, body = buffer.partition(_HEAD_END)
    return _finish(sock, head, body, deadline, has_body=True)


def body_pieces(size: int, *, chunked: bool) -> Iterator[bytes]:
    """`size` bytes of body in 64 KiB writes, as chunks (and the last one) when `chunked`."""
    piece = b"u" * 65536
    for _ in range(size // len(piece)):
        yield b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
    if chunked:
        yield b"0\r\n\r\n"


def upload_whole(sock: socket.socket, head: bytes, size: int, *, chunked: bool) -> RawResponse:
    """The head, then the whole body (a failed write raises), then the answer, as a client that
    writes before it reads; the connection must close after the answer."""
    sock.sendall(head)
    for piece in body_pieces(size, chunked=chunked):
        sock.sendall(piece)
    response = read_response(sock, timeout=10)
    assert sock.recv(1) == b""
    return response


def open_tunnel(
    port: int, authority: str | bytes, headers: Sequence[Header] = (), *, timeout: float = TIMEOUT
) -> tuple[socket.socket, RawResponse]:
    """CONNECT through the proxy; the socket is the caller's to close (the tunnel, if 200)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.sendall(request_bytes("CONNECT", authority, [("Host", authority), *headers]))
        deadline = time.monotonic() + timeout
        buffer = b""
        # Byte by byte up to the blank line: whatever follows belongs to the tunnel.
        while not buffer.endswith(_HEAD_END):
            byte = _recv(sock, deadline, 1)
            if not byte or len(buffer) > 65536:
                raise NoResponse(f"no CONNECT response head: {buffer[:200]!r}")
            buffer += byte
        response = _finish(sock, buffer[: -len(_HEAD_END)], b"", deadline, has_body=False)
    except BaseException:
        sock.close()
        raise
    return sock, response


def connect_answer(
    port: int, authority: str | bytes, headers: Sequence[Header] = (), *,
    timeout: float = TIMEOUT,
) -> RawResponse:
    """What a client learns of a CONNECT: the proxy's answer to it, or, if the tunnel was
    accepted, the answer to a first request inside TLS (where the proxy returns a refusal it
    decided on the CONNECT). The certificate is not checked: the answer is what is tested."""
    sock, head = open_tunnel(port, authority, headers, timeout=timeout)
    with sock:
        if head.status != 200:
            return head
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        name = authority.decode("latin-1") if isinstance(authority, bytes) else authority
        host = name.rpartition(":")[0].strip("[]")
        sni = None if host.replace(".", "").isdigit() or ":" in host else host
        with context.wrap_socket(sock, server_hostname=sni) as tls:
            tls.sendall(request_bytes("GET", "/", [("Host", authority), ("Connection", "close")]))
            return read_response(tls, timeout=timeout)


def _finish(
    sock: socket.socket, head: bytes, body: bytes, deadline: float, *, has_body: bool
) -> RawResponse:
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise NoResponse(f"not an HTTP response: {status_line[:200]!r}")
    status = int(parts[1])
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    # RFC 9110 9.3.6: a 2xx answer to CONNECT has no body; the tunnel starts right after it.
    if not has_body and 200 <= status < 300:
        return RawResponse(status, headers, b"")
    length = headers.get("content-length")
    want = int(length) if length is not None and length.isdigit() else None
    while (want is None or len(body) < want) and len(body) < _MAX_RESPONSE:
        chunk = _recv(sock, deadline, 65536)
        if not chunk:
            break
        body += chunk
    return RawResponse(status, headers, body if want is None else body[:want])


def _recv(sock: socket.socket, deadline: float, size: int) -> bytes:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise NoResponse("timed out waiting for the response")
    sock.settimeout(remaining)
    try:
        return sock.recv(size)
    except TimeoutError:
        raise NoResponse("timed out waiting for the response") from None
    except (ConnectionResetError, ssl.SSLError):
        return b""


def tls_wrap(
    sock: socket.socket, sni: str | None, cafile: Path, *, alpn: Sequence[str] = ()
) -> ssl.SSLSocket:
    """TLS over an open tunnel with a chosen SNI (None: no SNI extension at all)."""
    context = ssl.create_default_context(cafile=str(cafile))
    # The SNI is the variable under test; the certificate chain is still verified.
    context.check_hostname = False
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return context.wrap_socket(sock, server_hostname=sni)


def h2_exchange(
    tls: ssl.SSLSocket, headers: Sequence[tuple[str, str]], body: bytes | Sequence[bytes] = b"",
    *, timeout: float = TIMEOUT,
) -> RawResponse:
    """One HTTP/2 request over a TLS socket that negotiated h2. The headers (pseudo-headers
    first) go out exactly as given: h2's own validation and normalisation are off, so a test can
    send what a client library would refuse to. A sequence for `body` is its DATA frames, each
    sent as it is (an empty one too), within the peer's first flow-control window."""
    config = h2.config.H2Configuration(
        client_side=True, header_encoding="utf-8", validate_outbound_headers=False,
        normalize_outbound_headers=False, validate_inbound_headers=False,
    )
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    stream = conn.get_next_available_stream_id()
    frames = ([body] if body else []) if isinstance(body, bytes) else list(body)
    conn.send_headers(stream, list(headers), end_stream=not frames)
    for n, frame in enumerate(frames, 1):
        conn.send_data(stream, frame, end_stream=n == len(frames))
    tls.sendall(conn.data_to_send())
    deadline = time.monotonic() + timeout
    status, answer, data, trailers = 0, {}, b"", {}
    while len(data) <= _MAX_RESPONSE:
        chunk = _recv(tls, deadline, 65536)
        if not chunk:
            raise NoResponse("the connection closed before the HTTP/2 response ended")
        for event in conn.receive_data(chunk):
            if getattr(event, "stream_id", stream) != stream:
                continue
            if isinstance(event, h2.events.ResponseReceived):
                for name, value in event.headers:
                    key, text = _text(name).lower(), _text(value)
                    if key == ":status":
                        status = int(text)
                    else:
                        answer[key] = text
            elif isinstance(event, h2.events.TrailersReceived):
                trailers = {_text(k).lower(): _text(v) for k, v in event.headers}
            elif isinstance(event, h2.events.DataReceived):
                data += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, stream)
            elif isinstance(event, h2.events.StreamEnded):
                return RawResponse(status, answer, data, trailers)
            elif isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                raise NoResponse(f"HTTP/2 {type(event).__name__}: {event.error_code!r}")
        if pending := conn.data_to_send():
            tls.sendall(pending)
    raise NoResponse("HTTP/2 response larger than the test client reads")


def h2_through_tunnel(
    port: int, target: str, who: tuple[str, str], cafile: Path,
    headers: Sequence[tuple[str, str]], body: bytes | Sequence[bytes] = b"",
) -> tuple[RawResponse, str | None]:
    """CONNECT `target` as sandbox `who`, TLS offering only h2 with the target's name as SNI,
    one request. Returns the response and the protocol the proxy chose."""
    sock, head = open_tunnel(port, target, [("Proxy-Authorization", proxy_auth(*who))])
    with sock:
        if head.status != 200:
            raise NoResponse(f"CONNECT answered {head.status}: {head.body[:300]!r}")
        with tls_wrap(sock, target.rpartition(":")[0], cafile, alpn=["h2"]) as tls:
            return h2_exchange(tls, headers, body), tls.selected_alpn_protocol()


def h2_get(port: int, target: str, who: tuple[str, str], cafile: Path, path: str,
           extra: Sequence[tuple[str, str]] = ()) -> RawResponse:
    """GET `path` through a tunnel to `target` over HTTP/2, which the proxy must have chosen."""
    r, alpn = h2_through_tunnel(port, target, who, cafile, [
        (":method", "GET"), (":scheme", "https"), (":authority", target), (":path", path),
        *extra,
    ])
    assert alpn == "h2", alpn
    return r


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


class LoopbackTrap:
    """Listens on loopback addresses other than 127.0.0.1 and counts every connection.

    Bound on the same ports as origins on 127.0.0.1, it catches a request whose loopback
    spelling (127.0.0.2, ::1, an embedded or mapped form of them) slipped past the guard: the
    proof is a connection count of 0.
    """

    def __init__(self, ports: Sequence[int], hosts: Sequence[str] = ("127.0.0.2", "::1")) -> None:
        self.connections = 0
        self._sockets: list[socket.socket] = []
        try:
            for host in hosts:
                for port in ports:
                    family = socket.AF_INET6 if ":" in host else socket.AF_INET
                    sock = socket.socket(family, socket.SOCK_STREAM)
                    self._sockets.append(sock)
                    # A connection an earlier test made from that address may have had this
                    # port as its own: its TIME_WAIT would refuse the bind (seen on a parallel
                    # worker). Only a listener there may: the origins set the same.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind((host, port))
                    sock.listen(16)
                    sock.setblocking(False)
        except OSError:
            self._close()
            raise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="LoopbackTrap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for sock in self._sockets:
                selector.register(sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.1):
                    assert isinstance(key.fileobj, socket.socket)
                    with contextlib.suppress(OSError):
                        conn, _ = key.fileobj.accept()
                        # Counted before the close: the dialler's answer (a 502) follows the
                        # close, so a test reading the count then has it, however loaded.
                        self.connections += 1
                        conn.close()

    def reset(self) -> None:
        self.connections = 0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._close()

    def _close(self) -> None:
        for sock in self._sockets:
            sock.close()
