"""An HTTPS origin that reads HTTP/1.1 requests strictly and records each with the connection it
came on, and a client-side reader that frames answers the way a client must (Content-Length,
chunked, until close, no body for HEAD, 1xx, 204 and 304): what two HTTP engines in front of an
origin must agree on, seen from both ends.

The origin answers by the request path's last segment (`SCRIPTS`); anything else gets a 200
whose body names the request (`<method> <target> <body length>`), so a client can tell which
request an answer belongs to. A request it cannot read strictly is recorded with `bad` set, and
the connection closed.
"""

from __future__ import annotations

import base64
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import KEYS
from tests.harness import key_digest
from tests.rawserver import RawServer

_END = b"\r\n\r\n"
_LIMIT = 1 << 20

# Answers by the last path segment: the bytes sent, and whether the origin closes after them.
SCRIPTS: dict[str, tuple[bytes, bool]] = {
    "chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"4\r\nchun\r\n3\r\nked\r\n0\r\n\r\n", False),
    "eof": (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nread until close", True),
    "head": (b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n", False),
    "204": (b"HTTP/1.1 204 No Content\r\nX-Seen: 1\r\n\r\n", False),
    "304": (b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n\r\n", False),
    "twice": (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"
              b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\npoison", False),
    "continue": (b"HTTP/1.1 100 Continue\r\n\r\n"
                 b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal", False),
    "hints": (b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
              b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal", False),
    "cut": (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b", True),
}


@dataclass
class Got:
    conn: int  # the origin's number for the connection it came on, from 0
    method: str = ""
    target: str = ""
    version: str = ""
    fields: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    chunked: bool = False
    bad: str = ""  # why it could not be read strictly ("" when it could)

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.fields if k.lower() == name.lower()]


class FramingOrigin(RawServer):
    def __init__(self, tls: tuple[Path, Path]) -> None:
        self.got: list[Got] = []
        self.connections = 0
        self._lock = threading.Lock()
        super().__init__(tls)

    def reset(self) -> None:
        with self._lock:
            self.got.clear()

    def settled(self, count: int, timeout: float = 3.0) -> list[Got]:
        """The requests, once at least `count` arrived (or `timeout` passed), and 0.2 s more,
        in which an extra one would have come."""
        deadline = time.monotonic() + timeout
        while len(self.got) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        return list(self.got)

    def handle(self, conn: socket.socket) -> None:
        with self._lock:
            number, self.connections = self.connections, self.connections + 1
        reader = _Reader(conn)
        for _ in range(100):  # requests on one connection
            got = Got(number)
            if not reader.request(got):
                if got.method or got.bad:
                    self.got.append(got)
                return
            self.got.append(got)
            last = got.target.partition("?")[0].rpartition("/")[2]
            answer, close = SCRIPTS.get(last, (b"", False))
            if not answer:
                text = f"{got.method} {got.target} {len(got.body)}".encode()
                answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text)
            conn.sendall(answer)
            if close:
                return


class _Reader:
    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buf = conn, b""

    def request(self, got: Got) -> bool:
        """One request read into `got`; False at the connection's end or a request not read."""
        head = self._until(_END)
        if head is None:
            got.bad = "incomplete head" if self.buf else ""
            return False
        line, *lines = head.split(b"\r\n")
        parts = line.decode("latin-1").split(" ")
        stray = head.replace(b"\r\n", b"")
        if len(parts) != 3 or b"\r" in stray or b"\n" in stray:
            got.bad = f"request line or bare CR/LF: {head[:200]!r}"
            return False
        got.method, got.target, got.version = parts
        for raw in lines:
            name, colon, value = raw.decode("latin-1").partition(":")
            if not colon or not name or name != name.strip() or b"\0" in raw:
                got.bad = f"header line {raw[:200]!r}"
                return False
            got.fields.append((name, value.strip(" \t")))
        te, cl = got.values("transfer-encoding"), got.values("content-length")
        if (te and cl) or len(cl) > 1:
            got.bad = f"framing {te} {cl}"
            return False
        if te:
            if len(te) > 1 or te[0].lower().replace(" ", "").split(",")[-1] != "chunked":
                got.bad = f"transfer-encoding {te}"
                return False
            got.chunked = True
            return self._chunked(got)
        size = int(cl[0]) if cl and cl[0].isdigit() else 0 if not cl else -1
        if size < 0:
            got.bad = f"content-length {cl}"
            return False
        body = self._take(size)
        got.body = body or b""
        return body is not None

    def _chunked(self, got: Got) -> bool:
        for _ in range(10000):
            line = self._until(b"\r\n")
            if line is None:
                return False
            try:
                size = int(line.split(b";")[0], 16)
            except ValueError:
                got.bad = f"chunk size {line[:100]!r}"
                return False
            if size == 0:
                while (trailer := self._until(b"\r\n")) not in (b"", None):
                    got.fields.append(("trailer", trailer.decode("latin-1")))
                return trailer == b""
            data = self._take(size)
            if data is None or self._until(b"\r\n") != b"":
                return False
            got.body += data
        return False

    def _fill(self) -> bool:
        try:
            data = self.conn.recv(65536)
        except OSError:
            return False
        self.buf += data
        return bool(data) and len(self.buf) < _LIMIT

    def _until(self, end: bytes) -> bytes | None:
        while end not in self.buf:
            if not self._fill():
                return None
        item, _, self.buf = self.buf.partition(end)
        return item

    def _take(self, size: int) -> bytes | None:
        while len(self.buf) < size:
            if not self._fill():
                return None
        item, self.buf = self.buf[:size], self.buf[size:]
        return item


def rules(port: int) -> str:
    """bot-1 may send anything to frame.test:`port` (the origin)."""
    return f"""
version: 1
policies:
  ci:
    allow:
      - host: frame.test
        ports: [{port}]
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
default_policy: null
"""


# -- the client's side --------------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    """Base-URL requests to the proxy on `proxy` for the origin on `origin`, as bytes."""

    proxy: int
    origin: int

    @property
    def prefix(self) -> bytes:
        return b"/_/frame.test:%d" % self.origin

    @property
    def std(self) -> bytes:
        """The Host (the proxy's) and bot-1's Proxy-Authorization, each line ended."""
        auth = base64.b64encode(f"bot-1:{KEYS['bot-1']}".encode())
        return b"Host: 127.0.0.1:%d\r\nProxy-Authorization: Basic %s\r\n" % (self.proxy, auth)

    def req(self, method: str, path: str, extra: bytes = b"", body: bytes = b"",
            version: bytes = b"HTTP/1.1") -> bytes:
        return (method.encode() + b" " + self.prefix + path.encode() + b" " + version + b"\r\n"
                + self.std + extra + b"\r\n" + body)

    def get(self, path: str) -> bytes:
        return self.req("GET", path)


@dataclass
class Answer:
    status: int
    fields: list[tuple[str, str]]
    body: bytes
    complete: bool  # the framing ended as declared (for read-until-close: the close came)

    def header(self, name: str) -> str | None:
        found = [v for k, v in self.fields if k.lower() == name.lower()]
        return found[-1] if found else None


class Conn:
    """A client connection to the proxy that reads answers exactly: what it was sent beyond an
    answer's framing stays for the next read (or for `rest`)."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.timeout = timeout
        self.buf = b""
        self.eof = False

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self, method: str = "GET") -> Answer | None:
        """The next answer, 1xx ones included; None if the connection closed (or went quiet)
        before a whole head."""
        deadline = time.monotonic() + self.timeout
        while _END not in self.buf:
            if not self._fill(deadline):
                return None
        head, _, self.buf = self.buf.partition(_END)
        line, *lines = head.decode("latin-1").split("\r\n")
        fields = [(k.strip(), v.strip()) for k, _, v in (x.partition(":") for x in lines)]
        answer = Answer(int(line.split(" ")[1]), fields, b"", True)
        length = answer.header("content-length")
        if method == "HEAD" or answer.status < 200 or answer.status in (204, 304):
            return answer
        if (answer.header("transfer-encoding") or "").lower() == "chunked":
            answer.complete = self._chunked(answer, deadline)
        elif length is not None:
            while len(self.buf) < int(length) and self._fill(deadline):
                pass
            answer.body, self.buf = self.buf[:int(length)], self.buf[int(length):]
            answer.complete = len(answer.body) == int(length)
        else:
            while self._fill(deadline):
                pass
            answer.body, self.buf = self.buf, b""
            answer.complete = self.eof
        return answer

    def final(self, method: str = "GET") -> Answer | None:
        """The next answer that is not a 1xx."""
        for _ in range(10):
            answer = self.answer(method)
            if answer is None or answer.status >= 200:
                return answer
        return None

    def rest(self, wait: float = 0.3) -> tuple[bytes, bool]:
        """What else the proxy sends within `wait`, and whether it closed."""
        deadline = time.monotonic() + wait
        while not self.eof and self._fill(deadline, quiet=True):
            pass
        data, self.buf = self.buf, b""
        return data, self.eof

    def _chunked(self, answer: Answer, deadline: float) -> bool:
        for _ in range(10000):
            while b"\r\n" not in self.buf:
                if not self._fill(deadline):
                    return False
            line, _, self.buf = self.buf.partition(b"\r\n")
            size = int(line.split(b";")[0], 16)
            while len(self.buf) < size + 2:
                if not self._fill(deadline):
                    return False
            if size == 0:
                while not self.buf.startswith(b"\r\n"):  # trailers
                    if b"\r\n" in self.buf:
                        self.buf = self.buf.partition(b"\r\n")[2]
                    elif not self._fill(deadline):
                        return False
                self.buf = self.buf[2:]
                return True
            answer.body += self.buf[:size]
            self.buf = self.buf[size + 2:]
        return False

    def _fill(self, deadline: float, *, quiet: bool = False) -> bool:
        remaining = deadline - time.monotonic()
        if self.eof or remaining <= 0 or len(self.buf) > _LIMIT:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except OSError:
            data = b""
        if not data:
            self.eof = True
        self.buf += data
        return bool(data)
