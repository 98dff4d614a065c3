"""Clients that upload request bodies through the proxy, for the tests of what becomes of a body
the proxy refuses (test_refused_bodies, test_body_cap): a raw HTTP/1 connection by the way it
reaches the proxy, and an HTTP/2 client that sends a body within flow control and sees its
stream's reset as it comes."""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
from collections.abc import Iterator

import h2.config
import h2.connection
import h2.events

from tests.harness import Proxy
from tests.security.rawclient import Header, open_tunnel, tls_wrap

PATHS = ("plain", "tunnel", "base-url")  # the ways an HTTP/1 request reaches the proxy


@contextlib.contextmanager
def through(proxy: Proxy, path: str, http_port: int, https_port: int, auth: Header,
            host: str = "api.test") -> Iterator[tuple[socket.socket, str, str]]:
    """A connection to the proxy for `path` (one of PATHS) to `host`'s origin (plain HTTP on
    `http_port`, HTTPS on `https_port`), and the request target and authority to write: plain
    HTTP in absolute form, an intercepted tunnel (TLS, `host` as SNI), or base-URL mode (the
    upstream named in the path, HTTPS out)."""
    if path == "tunnel":
        authority = f"{host}:{https_port}"
        sock, answer = open_tunnel(proxy.port, authority, [auth], timeout=10)
        assert answer.status == 200
        with tls_wrap(sock, host, proxy.ca) as tls:
            yield tls, "", authority
        return
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        if path == "plain":
            authority = f"{host}:{http_port}"
            yield sock, f"http://{authority}", authority
        else:
            yield sock, f"/_/{host}:{https_port}", f"127.0.0.1:{proxy.port}"


class H2Upload:
    """An HTTP/2 connection through an intercepted tunnel, as a client that uploads a body in
    full before it looks at the answer, within flow control."""

    def __init__(self, proxy: Proxy, authority: str, auth: Header) -> None:
        self.authority = authority
        sock, answer = open_tunnel(proxy.port, authority, [auth], timeout=10)
        assert answer.status == 200
        self.tls: ssl.SSLSocket = tls_wrap(sock, authority.rpartition(":")[0], proxy.ca,
                                           alpn=["h2"])
        assert self.tls.selected_alpn_protocol() == "h2"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.seen: dict[int, list[h2.events.Event]] = {}
        self._flush()

    def _flush(self) -> None:
        if data := self.conn.data_to_send():
            self.tls.sendall(data)

    def pump(self, timeout: float = 10) -> None:
        """Read what the proxy sent; wait up to `timeout` for it (0: only what has come)."""
        if not timeout and not (self.tls.pending() or select.select([self.tls], [], [], 0)[0]):
            return
        self.tls.settimeout(timeout or None)
        data = self.tls.recv(65536)
        if not data:
            raise ConnectionError("the proxy closed the HTTP/2 connection")
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                    event.stream_id)
            self.seen.setdefault(getattr(event, "stream_id", 0), []).append(event)
        self._flush()

    def start(self, method: str, path: str, length: int | None, *,
              streamed: bool = False) -> int:
        """A request's headers: with a content-length of `length`, or with none and a body to
        come when `streamed`, else with no body at all."""
        stream = self.conn.get_next_available_stream_id()
        headers = [(":method", method), (":scheme", "https"), (":authority", self.authority),
                   (":path", path)]
        self.conn.send_headers(stream, headers + ([("content-length", str(length))]
                                                  if length is not None else []),
                               end_stream=length is None and not streamed)
        self._flush()
        return stream

    def sendbody_pieces(self, stream: int, size: int) -> int:
        """Send up to `size` bytes and end the stream; how many went before a reset, if one
        came."""
        sent = 0
        while sent < size:
            self.pump(0)  # the proxy's window is large: a reset is noticed as it comes
            if self.reset(stream):
                return sent
            window = min(self.conn.local_flow_control_window(stream),
                         self.conn.max_outbound_frame_size, size - sent)
            if window <= 0:
                self.pump()
                continue
            self.conn.send_data(stream, b"h" * window)
            self._flush()
            sent += window
        self.conn.end_stream(stream)
        self._flush()
        return sent

    def reset(self, stream: int) -> bool:
        return any(isinstance(e, h2.events.StreamReset) for e in self.seen.get(stream, []))

    def answer(self, stream: int) -> tuple[int, bytes]:
        """The stream's status and body, once its end has come."""
        while not any(isinstance(e, h2.events.StreamEnded) for e in self.seen.get(stream, [])):
            assert not self.reset(stream)
            self.pump()
        return self.status(stream), b"".join(
            e.data for e in self.seen[stream] if isinstance(e, h2.events.DataReceived))

    def status(self, stream: int) -> int:
        """The status of the stream's response head, which must have come."""
        return next(int(dict(e.headers)[":status"]) for e in self.seen[stream]
                    if isinstance(e, h2.events.ResponseReceived))
