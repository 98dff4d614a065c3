"""An HTTPS origin that echoes the credential it was sent everywhere but the body of a plain
response: response headers, trailers, server-sent events (timed), WebSocket messages.

Written on raw sockets (and wsproto for WebSocket) so that each echo goes out exactly as the test
needs it: a header, a trailer, an event at a known time, a message split across frames.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    Request,
    TextMessage,
)
from wsproto.extensions import PerMessageDeflate

_HEAD_END = b"\r\n\r\n"


@dataclass
class EchoOrigin:
    cert: tuple[Path, Path]
    event_interval: float = 0.3
    events: int = 5
    # monotonic time each event was written, by number: the client's clock is the same one
    written: dict[int, float] = field(default_factory=dict)
    connections: int = 0

    def __post_init__(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.cert[0]), str(self.cert[1]))
        context.set_alpn_protocols(["h2", "http/1.1"])
        self._context = context
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self._sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(5)
        with contextlib.suppress(OSError), self._context.wrap_socket(
            raw, server_side=True
        ) as sock:
            if sock.selected_alpn_protocol() == "h2":
                self._h2(sock)
                return
            head = b""
            while _HEAD_END not in head and len(head) < 65536:
                if not (data := sock.recv(4096)):
                    return
                head += data
            head, _, rest = head.partition(_HEAD_END)
            line, *fields = head.decode("latin-1").split("\r\n")
            path = line.split(" ")[1]
            headers = {}
            for item in fields:
                name, _, value = item.partition(":")
                headers[name.strip().lower()] = value.strip()
            auth = headers.get("authorization", "")
            if path == "/headers":
                self._headers(sock, auth)
            elif path == "/status":
                self._status(sock, auth)
            elif path == "/sse":
                self._sse(sock, auth)
            elif path.startswith("/ws"):
                self._websocket(sock, head + _HEAD_END + rest, auth)

    @staticmethod
    def _headers(sock: ssl.SSLSocket, auth: str) -> None:
        body = b"nothing in here\n"
        sock.sendall(
            f"HTTP/1.1 200 OK\r\nX-Echo: {auth}\r\nWWW-Authenticate: {auth}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
        )

    @staticmethod
    def _status(sock: ssl.SSLSocket, auth: str) -> None:
        """The credential in the reason phrase and in a header's name."""
        secret = auth.removeprefix("Bearer ")
        sock.sendall(
            f"HTTP/1.1 401 {auth}\r\nX-{secret}: 1\r\nX-Kept: yes\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )

    @staticmethod
    def _h2(sock: ssl.SSLSocket) -> None:
        """HTTP/2 (mitmproxy implements trailers only there): every request is answered with
        a body and a trailer echoing its Authorization."""
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    fields = {_text(k).lower(): _text(v) for k, v in event.headers}
                    auth = fields.get("authorization", "")
                    stream = event.stream_id
                    if fields.get(":path") == "/split":
                        # The secret split around an empty DATA frame, which mitmproxy hands a
                        # stream function as b"", the same as the end of the body.
                        secret = auth.removeprefix("Bearer ").encode()
                        conn.send_headers(stream, [(":status", "200")])
                        conn.send_data(stream, b"x " + secret[:8])
                        sock.sendall(conn.data_to_send())
                        conn.send_data(stream, b"")
                        sock.sendall(conn.data_to_send())
                        conn.send_data(stream, secret[8:] + b" y", end_stream=True)
                        continue
                    conn.send_headers(stream, [(":status", "200"), ("x-echo", auth)])
                    conn.send_data(stream, b"hello")
                    conn.send_headers(stream, [("x-echo", auth)], end_stream=True)
            sock.sendall(conn.data_to_send())

    def _sse(self, sock: ssl.SSLSocket, auth: str) -> None:
        sock.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        for number in range(self.events):
            # One event carries the credential: scrubbing must still hold, with no delay.
            extra = f" {auth}" if number == 2 else ""
            event = f"id: {number}\ndata: event-{number}{extra}\n\n".encode()
            self.written[number] = time.monotonic()
            sock.sendall(b"%x\r\n%s\r\n" % (len(event), event))
            time.sleep(self.event_interval)
        sock.sendall(b"0\r\n\r\n")

    @staticmethod
    def _websocket(sock: ssl.SSLSocket, received: bytes, auth: str) -> None:
        ws = WSConnection(ConnectionType.SERVER)
        ws.receive_data(received)
        request = next((e for e in ws.events() if isinstance(e, Request)), None)
        if request is None:
            return
        deflate = any("permessage-deflate" in str(x) for x in request.extensions)
        extensions = [PerMessageDeflate()] if deflate else []
        out = ws.send(AcceptConnection(extensions=extensions))
        secret = auth.removeprefix("Bearer ")
        half = len(secret) // 2
        out += ws.send(TextMessage(data=f"you sent {auth}"))
        out += ws.send(BytesMessage(data=b"\x00\x01" + secret.encode() + b"\xff"))
        # The secret split across the frames of one message.
        out += ws.send(TextMessage(data=f"split {secret[:half]}", message_finished=False))
        out += ws.send(TextMessage(data=f"{secret[half:]} end", message_finished=True))
        out += ws.send(TextMessage(data="bye"))
        out += ws.send(Ping(payload=b"ping " + secret.encode()))
        out += ws.send(Pong(payload=b"pong " + secret.encode()))
        out += ws.send(CloseConnection(code=1000, reason=f"done {secret}"))
        sock.sendall(out)
        deadline = time.monotonic() + 3
        with contextlib.suppress(OSError):
            while time.monotonic() < deadline and sock.recv(4096):
                pass


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value
