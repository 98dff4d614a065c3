"""A command on a terminal in a sandbox (`Sandbox.pty`): the daemon's WebSocket at
`GET /v1/sandboxes/{id}/pty` (docs/sandbox-api.md, "Terminals"), spoken here with the
standard library only, like the sync client whose connections it uses. What both clients
share of it (the messages) is here too; the asyncio one speaks it through aiohttp.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import socket
import struct
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sealgate.reasons import Reason

from .clientshared import DaemonError, Result, error_of, unreachable

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455's
_TEXT, _BINARY, _CLOSE, _PING, _PONG = 1, 2, 8, 9, 10
_HEAD_MAX = 64 << 10  # the daemon's answer to the upgrade
_FRAME_MAX = 16 << 20  # one frame of the daemon's (it sends what the terminal shows, 64 KiB)


def exec_message(rows: int, cols: int, argv: Sequence[str] | None, *,
                 env: Mapping[str, str] | None, cwd: str | None,
                 timeout: float | None) -> dict[str, Any]:
    """The first message: the command (None: the daemon's login shell) and its terminal."""
    message: dict[str, Any] = {"tty": {"rows": rows, "cols": cols}, "timeout": timeout}
    for name, value in (("argv", None if argv is None else list(argv)),
                        ("env", None if env is None else dict(env)), ("cwd", cwd)):
        if value is not None:
            message[name] = value
    return message


def resize_message(rows: int, cols: int) -> str:
    return json.dumps({"resize": {"rows": rows, "cols": cols}})


def ending(text: str) -> Result:
    """The daemon's last text frame: the command's status; DaemonError for its refusal."""
    try:
        said = json.loads(text)
    except ValueError:
        said = None
    if not isinstance(said, dict):
        raise DaemonError("the daemon sent a text frame that is not an object",
                          reason=Reason.INTERNAL_ERROR, status=101)
    if "exit" not in said:  # a refusal (a command that could not start has its exit, 127)
        raise error_of(101, text.encode())
    return Result.of(said, b"", b"")


def closed_early(code: int | None) -> DaemonError:
    return DaemonError(f"the terminal closed without a status (close code {code})",
                       reason=Reason.INTERNAL_ERROR, status=101)


class Connecting(Protocol):
    """What of the sync `Client` a terminal needs (typed here: client.py imports this)."""

    daemon: str

    def connect(self, wait: float | None) -> tuple[socket.socket, str, dict[str, str]]: ...


class Terminal:
    """A command on a terminal: `write` what is typed, `read` what it shows (b"" at its end),
    `resize`, `wait` for its `Result`; `close` ends it (the daemon kills the command). Writes
    may come from another thread than reads (a CLI reads in one, types in another)."""

    def __init__(self, sock: socket.socket, buffered: bytes) -> None:
        self._sock = sock
        self._buf = bytearray(buffered)
        self._sending = threading.Lock()
        self.result: Result | None = None

    @classmethod
    def open(cls, client: Connecting, path: str, first: Mapping[str, Any],
             wait: float | None) -> Terminal:
        try:
            sock, host, headers = client.connect(wait)
        except OSError as exc:
            raise unreachable(client.daemon, exc) from None
        try:
            key = base64.b64encode(os.urandom(16))
            lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket",
                     "Connection: Upgrade", f"Sec-WebSocket-Key: {key.decode()}",
                     "Sec-WebSocket-Version: 13",
                     *(f"{k}: {v}" for k, v in headers.items())]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            got = bytearray()
            while b"\r\n\r\n" not in got:
                chunk = sock.recv(4096)
                if not chunk or len(got) > _HEAD_MAX:
                    raise DaemonError("the daemon's answer to the upgrade was cut",
                                      reason=Reason.INTERNAL_ERROR, status=0)
                got += chunk
            head, _, rest = bytes(got).partition(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            if status != 101:
                raise error_of(status, _body(sock, head, rest))
            accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())  # noqa: S324 RFC 6455
            if b"sec-websocket-accept: " + accept.lower() not in head.lower():
                raise DaemonError("the daemon's upgrade was not for this request",
                                  reason=Reason.INTERNAL_ERROR, status=101)
            sock.settimeout(None)
            made = cls(sock, rest)
            made._send(_TEXT, json.dumps(first).encode())
        except (OSError, ValueError, IndexError) as exc:
            sock.close()
            raise DaemonError(f"cannot open a terminal at {client.daemon}: {exc}",
                              reason=Reason.AT_CAPACITY, status=0) from None
        except BaseException:
            sock.close()
            raise
        return made

    def write(self, data: bytes) -> None:
        if data:
            self._send(_BINARY, bytes(data))

    def resize(self, rows: int, cols: int) -> None:
        self._send(_TEXT, resize_message(rows, cols).encode())

    def read(self, timeout: float | None = None) -> bytes:
        """What the terminal shows next (TimeoutError past `timeout`); b"" once it ended, its
        status in `result`."""
        self._sock.settimeout(timeout)
        while self.result is None:
            opcode, data = self._frame()
            if opcode == _BINARY:
                return data
            if opcode == _TEXT:
                self.result = ending(data.decode(errors="replace"))
            elif opcode == _PING:
                self._send(_PONG, data)
            elif opcode == _CLOSE:
                raise closed_early(struct.unpack(">H", data[:2])[0] if len(data) >= 2 else None)
        return b""

    def wait(self, timeout: float | None = None) -> Result:
        """Its status, once it has ended; what it shows meanwhile is read and dropped."""
        while self.read(timeout):
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send(_CLOSE, struct.pack(">H", 1000))
        self._sock.close()

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _send(self, opcode: int, data: bytes) -> None:
        mask = os.urandom(4)
        size = len(data)
        head = bytes([0x80 | opcode]) + (
            bytes([0x80 | size]) if size < 126 else
            bytes([0x80 | 126]) + struct.pack(">H", size) if size < 1 << 16 else
            bytes([0x80 | 127]) + struct.pack(">Q", size))
        with self._sending:
            self._sock.sendall(head + mask + _masked(data, mask))

    def _frame(self) -> tuple[int, bytes]:
        """The next whole message (continuations joined): its opcode and payload."""
        opcode, payload = 0, bytearray()
        while True:
            first, second = self._exactly(2)
            size = second & 0x7F
            if size >= 126:
                (size,) = struct.unpack(">H" if size == 126 else ">Q",
                                        self._exactly(2 if size == 126 else 8))
            if size + len(payload) > _FRAME_MAX:
                raise DaemonError(f"a frame of {size} bytes from the daemon",
                                  reason=Reason.TOO_LARGE, status=101)
            mask = self._exactly(4) if second & 0x80 else b""
            data = self._exactly(size)
            if mask:
                data = _masked(data, mask)
            opcode = opcode or first & 0x0F
            payload += data
            if first & 0x80:
                return opcode, bytes(payload)

    def _exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self._sock.recv(max(1 << 16, n - len(self._buf)))
            if not chunk:
                raise closed_early(None)
            self._buf += chunk
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data


def _masked(data: bytes, mask: bytes) -> bytes:
    """`data` XORed with the 4-byte `mask` repeated (RFC 6455, 5.3), as one big integer."""
    size = len(data)
    key = (mask * (size // 4 + 1))[:size]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(size, "big")


def _body(sock: socket.socket, head: bytes, rest: bytes) -> bytes:
    """A refusal's JSON body, by its Content-Length (bounded)."""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            length = min(int(value), _HEAD_MAX)
    body = bytearray(rest)
    while len(body) < length and (chunk := sock.recv(length - len(body))):
        body += chunk
    return bytes(body[:length])
