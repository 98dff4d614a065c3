"""Origins that read a request's framing strictly and record how much of its body arrived and
whether its end did: what a body cut off in the proxy left upstream. tests.harness's Origin reads
a chunked body leniently (a connection closed in the middle is taken as the body's end), so it
cannot tell a cut-off request from a whole one.

Each request is an `Arrival`. The HTTP/1 origin serves one request per connection (its answer
says Connection: close) and counts body bytes as they come, a partial chunk's too; the HTTP/2
origin records each stream, and whether it ended or was reset. The HTTP/1 origin begins to
answer a request whose path ends in `/early` (chunked) or `/held` (with a Content-Length) at
once, before it reads the body, and finishes the answer once the body has ended.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events

from tests.rawserver import RawServer

_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
# Answers begun before the body is read, and their ends, by the path's last segment.
_EARLY = {
    "early": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
              b"5\r\nearly\r\n", b"0\r\n\r\n"),
    "held": (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nheld!",
             b"held!"),
}


@dataclass
class Arrival:
    path: str = ""
    body: int = 0  # body bytes received, framing aside
    ended: bool = False  # the body's end came: its last chunk, its length, END_STREAM
    reset: bool = False  # HTTP/2: the stream was reset
    answered: bool = False  # an answer was begun before the body was read
    done: threading.Event = field(default_factory=threading.Event)  # nothing more will come


class _Origin(RawServer):
    def __init__(self, tls: tuple[Path, Path] | None) -> None:
        self.arrivals: list[Arrival] = []
        self.connections = 0
        super().__init__(tls)

    def arrived(self, path: str, timeout: float = 10.0) -> list[Arrival]:
        """The requests for `path`, once the origin is through with each (at least one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [a for a in self.arrivals if a.path == path]
            if found and all(a.done.is_set() for a in found):
                return found
            time.sleep(0.02)
        raise AssertionError(f"no finished request for {path}: {self.arrivals}")


class H1Origin(_Origin):
    def handle(self, conn: socket.socket) -> None:
        self.connections += 1
        arrival = Arrival()
        self.arrivals.append(arrival)
        try:
            if _H1Reader(conn, arrival).request():
                early = _EARLY.get(arrival.path.rpartition("/")[2])
                conn.sendall(_ANSWER if early is None else early[1])
        finally:
            arrival.done.set()


class _H1Reader:
    def __init__(self, conn: socket.socket, arrival: Arrival) -> None:
        self.conn, self.arrival, self.buf = conn, arrival, b""

    def request(self) -> bool:
        """Read one request; whether it came whole."""
        line = self._line()
        if not line:
            return False
        self.arrival.path = line.split(b" ")[1].decode()
        fields = {}
        while line := self._line():
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip().lower()
        if line is None:
            return False
        if (early := _EARLY.get(self.arrival.path.rpartition("/")[2])) is not None:
            self.conn.sendall(early[0])
            self.arrival.answered = True
        if fields.get(b"transfer-encoding") != b"chunked":
            self.arrival.ended = self._take(int(fields.get(b"content-length", b"0")))
            return self.arrival.ended
        while (size_line := self._line()) is not None:
            size = int(size_line.split(b";")[0], 16)
            if size == 0:  # no trailers: the blank line ends the body
                self.arrival.ended = self._line() == b""
                break
            if not self._take(size) or self._line() != b"":
                break
        return self.arrival.ended

    def _fill(self) -> bool:
        data = self.conn.recv(65536)
        self.buf += data
        return bool(data)

    def _line(self) -> bytes | None:
        while b"\r\n" not in self.buf:
            if len(self.buf) > 65536 or not self._fill():
                return None
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _take(self, size: int) -> bool:
        """`size` body bytes, counted as they come; whether they all came."""
        while size:
            if not self.buf and not self._fill():
                return False
            piece, self.buf = self.buf[:size], self.buf[size:]
            size -= len(piece)
            self.arrival.body += len(piece)
        return True


class H2Origin(_Origin):
    """HTTPS that speaks only HTTP/2."""

    def __init__(self, tls: tuple[Path, Path]) -> None:
        super().__init__(tls)
        assert self._context is not None
        self._context.set_alpn_protocols(["h2"])

    def handle(self, conn: socket.socket) -> None:
        assert isinstance(conn, ssl.SSLSocket) and conn.selected_alpn_protocol() == "h2"
        self.connections += 1
        h2conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        h2conn.initiate_connection()
        conn.sendall(h2conn.data_to_send())
        streams: dict[int, Arrival] = {}
        try:
            while data := conn.recv(65536):
                for event in h2conn.receive_data(data):
                    self._event(h2conn, streams, event)
                conn.sendall(h2conn.data_to_send())
        finally:
            for arrival in streams.values():
                arrival.done.set()

    def _event(self, h2conn: h2.connection.H2Connection, streams: dict[int, Arrival],
               event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            path = dict(event.headers).get(b":path", b"").decode()
            streams[event.stream_id] = arrival = Arrival(path=path)
            self.arrivals.append(arrival)
        elif isinstance(event, h2.events.DataReceived):
            streams[event.stream_id].body += len(event.data)
            h2conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            streams[event.stream_id].ended = True
            h2conn.send_headers(event.stream_id, [(":status", "200")])
            h2conn.send_data(event.stream_id, b"ok\n", end_stream=True)
            streams[event.stream_id].done.set()
        elif isinstance(event, h2.events.StreamReset):
            streams[event.stream_id].reset = True
            streams[event.stream_id].done.set()
