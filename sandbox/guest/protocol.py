"""The sandbox's wire protocol, declared once: the ops, their fields and descriptors, both
framings and their limits. The guest side (`agent`, `vmagent`) and the host side
(`sandbox.daemon.session`, the microVM's `channel` and `hostserve`) import it; adding an op
starts here (docs/sandbox.md, "Adding an op").

Standard library only, and light: the microVM's guest imports it at every boot (json and re,
which pull in enum, are imported by the agent anyway).

**Packets** (the daemon and the agent of every tier; the microVM's `hostserve` speaks it for
its guest): a SOCK_SEQPACKET pair, the agent's standard input; one JSON object per packet,
the request's descriptors passed with it (SCM_RIGHTS):

    agent -> daemon  {"op": "ready", "version"}               once, when it serves
                     {"op": "failed", "detail"}               a launcher that could not start
    daemon -> agent  {"op": "exec", "id", "argv", "env", "cwd", "timeout", "pids", "tty"}
                         fds: stdin, stdout, stderr, status
                     {"op": "put", "id", "path", "size", "mode"}   fds: data (read), status
                     {"op": "get", "id", "path", "limit"}         fds: data (write), status
                     {"op": "kill", "id"}
                     {"op": "list", "id", "path", "limit"}       fds: data (write), status
                     {"op": "stat" | "mkdir" | "remove" | "rename", "id", "path", ...}
                                                                  fds: status
                     {"op": "tar", "id", "path"}                  fds: data (write), status
                     {"op": "untar", "id", "path", "max_bytes", "max_entries"}
                                                                  fds: data (read), status
                     {"op": "watch", "id", "path", "recursive"}  fds: events (write), status
                     {"op": "save", "id"}    fds: data (write), status  (the microVM's
                         `hostserve` only: the VM's memory snapshot, into a file's fd)
                     {"op": "layer", "id"}   fds: data (write), status  (the microVM's
                         `hostserve` only: an image's root's writes and its workspace, as
                         a layer's tar stream with OCI whiteouts, made by the guest)
                     {"op": "signal", "id", "signal"}   a running exec's process group
                     {"op": "resize", "id", "rows", "cols"}   a running exec's terminal

An exec with `tty` ([rows, cols], else null) runs on a pseudo-terminal the agent opens inside
the sandbox (its own devpts), the command its session leader with the terminal as controlling
tty; the terminal's output comes on stdout (stderr is closed at once) and stdin is typed into
it, relayed by the command's supervisor inside (`terminal`).

A request is answered on its status descriptor, one JSON line (`status_line`): an exec's
`exit`, `ending` (`Ending`), `signal`, `usage`, `error`; a put's or get's `size` or `error`
(`too_large` when a get's file is over its limit); a list's `size` (its JSON follows on its
data), a stat's `entry`, a tar's, layer's or watch's `ok` before its stream (and a
tar's or layer's `done` after it); an error's `exists` when
the path is taken. A watch runs until it is killed.

**Frames** (the microVM's console port, host and guest agent): a 4-byte big-endian length,
then a JSON header line (an object), then the raw payload. The host asks (`ping`, `net`,
`seal`, `root`, `put`, `get`, `exec`, `layer`, `stdin`, `kill`, `hold`, `release`, `renew`),
the guest answers with the request's `id` (`GUEST_ANSWERS`); `vmagent`'s docstring says what
each does. The host trusts nothing the guest sends (`GuestFrames`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
from enum import StrEnum

TYPE_CHECKING = False  # typing costs the guest's start; type checkers take this as true
if TYPE_CHECKING:
    import socket
    from typing import Any

VERSION = 1  # said in `ready`; both ends are staged from one tree, so a mismatch is a bug


class Op(StrEnum):
    """Every op of both framings (the string is what travels)."""

    # packets: the daemon and the agent
    READY = "ready"
    FAILED = "failed"
    EXEC = "exec"
    PUT = "put"
    GET = "get"
    KILL = "kill"
    LIST = "list"  # the workspace's files beyond put and get (`fsops`, `tarball`, `watch`)
    STAT = "stat"
    MKDIR = "mkdir"
    REMOVE = "remove"
    RENAME = "rename"
    TAR = "tar"  # a directory out as a tar stream
    UNTAR = "untar"  # a tar stream unpacked into a directory
    WATCH = "watch"
    CONNECT = "connect"  # a port on the sandbox's own loopback, where the daemon cannot reach
    SIGNAL = "signal"
    RESIZE = "resize"
    SAVE = "save"  # a microVM's memory snapshot, written to `data` (`hostserve` only)
    # frames, host -> guest (exec, put, get, kill, resize as well, with the guest's own fields)
    PING = "ping"
    NET = "net"
    SEAL = "seal"
    ROOT = "root"  # an image's root, made in the guest (`vmroot`)
    LAYER = "layer"  # an image's root's writes as a layer, from the guest (`layerout`)
    HOLD = "hold"  # the agent sends nothing until released or renewed (a save under way)
    RELEASE = "release"  # the save is over: on as before
    RENEW = "renew"  # a copy resumed from a save: its own address, files, randomness, clock
    STDIN = "stdin"
    # carry's, both ways: a stream's bytes written, so more may come (`carrylink`)
    CREDIT = "credit"
    # frames, guest -> host (ready as well)
    OK = "ok"
    DATA = "data"
    ERROR = "error"
    STARTED = "started"
    OUT = "out"
    EXIT = "exit"


class Ending(StrEnum):
    """How an exec ended, in its status line."""

    EXIT = "exit"  # by itself
    KILLED = "killed"  # the daemon asked (its caller left, or asked for it)
    TIMED_OUT = "timed_out"  # past its own time limit
    LOST = "lost"  # no status came: its supervisor in the sandbox is gone


WORKSPACE = "/workspace"  # where a request's paths start, and an exec's default cwd
TIMED_OUT = 124  # an exec's exit past its time limit, as timeout(1) says it
NOT_STARTED = 127  # an exec that could not be started, as a shell says it


def over_time(timeout: float) -> str:
    """What a run says on its standard error when its command was killed at its time limit."""
    return f"sealgate: the command ran past its time limit ({timeout:g} s) and was killed"

# -- packets -------------------------------------------------------------------------------

# The descriptors each request carries, in order, each read (IN) or written (OUT) by the
# agent; the last is always its status. A get's status line comes before its file's bytes.
IN, OUT = "in", "out"
DESCRIPTORS: dict[str, tuple[tuple[str, str], ...]] = {
    Op.EXEC: (("stdin", IN), ("stdout", OUT), ("stderr", OUT), ("status", OUT)),
    Op.PUT: (("data", IN), ("status", OUT)),
    Op.GET: (("data", OUT), ("status", OUT)),
    Op.KILL: (),
    Op.LIST: (("data", OUT), ("status", OUT)),
    Op.STAT: (("status", OUT),),
    Op.MKDIR: (("status", OUT),),
    Op.REMOVE: (("status", OUT),),
    Op.RENAME: (("status", OUT),),
    Op.TAR: (("data", OUT), ("status", OUT)),
    Op.LAYER: (("data", OUT), ("status", OUT)),
    Op.SAVE: (("data", OUT), ("status", OUT)),
    Op.UNTAR: (("data", IN), ("status", OUT)),
    Op.WATCH: (("events", OUT), ("status", OUT)),
    # One socket, sent twice: the caller's bytes in, the server's out.
    Op.CONNECT: (("to", IN), ("from", OUT), ("status", OUT)),
    Op.SIGNAL: (),
    Op.RESIZE: (),
}
# A request's fields besides op and id.
FIELDS: dict[str, tuple[str, ...]] = {
    Op.EXEC: ("argv", "env", "cwd", "timeout", "pids", "tty"),
    Op.PUT: ("path", "size", "mode"),
    Op.GET: ("path", "limit"),
    Op.KILL: (),
    Op.LIST: ("path", "limit"),
    Op.STAT: ("path",),
    Op.MKDIR: ("path", "mode", "parents"),
    Op.REMOVE: ("path", "recursive"),
    Op.RENAME: ("path", "to"),
    Op.TAR: ("path",),
    Op.LAYER: (),
    Op.SAVE: (),
    Op.UNTAR: ("path", "max_bytes", "max_entries"),
    Op.WATCH: ("path", "recursive"),
    Op.CONNECT: ("port",),
    Op.SIGNAL: ("signal",),
    Op.RESIZE: ("rows", "cols"),
}
# The signals a caller may send a running command's process group, by name (Linux's numbers,
# the same on every tier: each runs a Linux kernel). KILL is the kill op (its status says
# killed); STOP and CONT are not among them: a stopped command would hold its place with its
# time limit running, and pausing the sandbox is the way to freeze it.
SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15}
TTY_MAX = 4096  # a terminal's rows or columns, at most


def terminal_size(value: Any) -> tuple[int, int] | None:
    """An exec's or resize's [rows, cols] as two ints from 1 to TTY_MAX; None for anything
    else."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    if not all(type(n) is int and 0 < n <= TTY_MAX for n in value):
        return None
    return int(value[0]), int(value[1])
# One request: well under the socket's buffer (a bigger one would fail to send, EMSGSIZE).
MAX_REQUEST = 128 << 10
_MAX_PACKET = 1 << 20  # what the agent reads at once
_MAX_FDS = 8
STATUS_MAX = 1 << 16  # a status line


def packet(op: Op, ident: int, **fields: Any) -> bytes:
    """A request to the agent; ValueError for fields that are not the op's."""
    if set(fields) != set(FIELDS[op]):
        raise ValueError(f"{op} takes {', '.join(FIELDS[op]) or 'no fields'}")
    return json.dumps({"op": op, "id": ident, **fields}).encode()


def hello() -> bytes:
    return json.dumps({"op": Op.READY, "version": VERSION}).encode()


def failed(detail: str) -> bytes:
    return json.dumps({"op": Op.FAILED, "detail": detail[:2000]}).encode()


def read_hello(message: bytes) -> str | None:
    """None for the agent's `ready` of this version; else a launcher's word on why it failed
    (`failed`), or "" for anything else. ValueError for what is not JSON."""
    said = json.loads(message or b"null")
    if said == {"op": Op.READY, "version": VERSION}:
        return None
    detail = said.get("detail") if isinstance(said, dict) else None
    return str(detail)[:2000] if detail else ""


def receive(chan: socket.socket) -> tuple[bytes, list[int]] | None:
    """The next request and its descriptors (close-on-exec: they reach a command only as its
    0, 1 and 2); None once the daemon is gone, and with it the sandbox."""
    try:
        message, fds, _ = receive_fds(chan, _MAX_PACKET, _MAX_FDS)
    except OSError:
        return None
    return (message, fds) if message else None


def receive_fds(chan: socket.socket, size: int, most: int) -> tuple[bytes, list[int], int]:
    """One packet of at most `size` bytes, the descriptors that came with it (at most `most`)
    and recvmsg's flags. Received close-on-exec (MSG_CMSG_CLOEXEC): without it a descriptor
    would be inherited by whatever the receiver starts next, before it could mark it.
    (socket.recv_fds drops its `flags` argument in CPython 3.11: recvmsg, then.)"""
    # Imported here: the microVM's guest agent, which speaks frames, never pays for them.
    import array
    import socket

    fds = array.array("i")
    message, ancillary, flags, _ = chan.recvmsg(
        size, socket.CMSG_LEN(most * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return message, list(fds), flags


def parse(message: bytes, fds: list[int]) -> tuple[Op, int, dict[str, Any]] | None:
    """A request's op, id and fields, if it is one with the op's descriptors; None for
    anything else (whose descriptors the caller closes)."""
    try:
        req = json.loads(message)
        op, ident = Op(req["op"]), int(req["id"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if op not in DESCRIPTORS or len(fds) != len(DESCRIPTORS[op]):
        return None
    return op, ident, req


def status_line(answer: dict[str, Any]) -> bytes:
    return (json.dumps(answer) + "\n").encode()


def report(fd: int, answer: dict[str, Any]) -> None:
    """Say a request's status on its descriptor; a caller gone is no one's concern here."""
    with contextlib.suppress(OSError):
        os.write(fd, status_line(answer))


# -- frames --------------------------------------------------------------------------------

MAX_FRAME = 64 << 20
# The guest's headers are small (an op, an id, an exit code, a message cut to 500
# characters); only a `get`'s payload is large.
GUEST_HEADER_MAX = 16 << 10
_MAX_DEPTH = 16  # a header's nesting; exec's, the deepest, is 2 (its argv and env)
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_NESTING = re.compile(rb"[^\[\]{}]+")
# What the guest's answers carry: the ops the host expects, each with the fields it needs;
# a field's type and range wherever it appears.
GUEST_ANSWERS: dict[str, tuple[str, ...]] = {
    Op.READY: ("kernel", "version"), Op.OK: ("id",), Op.DATA: ("id",), Op.ERROR: ("message",),
    Op.STARTED: ("id", "pid"), Op.OUT: ("id", "fd"), Op.EXIT: ("id", "code"),
}
_GUEST_FIELDS: dict[str, type | tuple[int, int]] = {
    "kernel": str, "message": str, "timed_out": bool, "version": (VERSION, VERSION),
    "id": (0, 1 << 62), "pid": (1, 1 << 30), "fd": (1, 2), "code": (0, 255), "signal": (1, 64),
}


def encode(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode() + b"\n"
    return struct.pack(">I", len(head) + len(payload)) + head + payload


def decode(frame: bytes, max_header: int = MAX_FRAME) -> tuple[dict[str, Any], bytes]:
    """A frame's header (a JSON object) and payload; ValueError for anything else. The
    header's size and nesting are bounded before it is parsed: json's parser recurses, and a
    deeply nested header would raise RecursionError, which no caller expects."""
    end = frame.find(b"\n", 0, max_header + 1)
    if end < 0:
        raise ValueError(f"a frame without a header line of at most {max_header} bytes")
    head = frame[:end]
    if _nesting(head) > _MAX_DEPTH:
        raise ValueError(f"a frame's header nests deeper than {_MAX_DEPTH}")
    header = json.loads(head)  # bad JSON, bad UTF-8, a number too long: all ValueErrors
    if not isinstance(header, dict):
        raise ValueError("a frame's header is not an object")
    return header, frame[end + 1:]


def _nesting(head: bytes) -> int:
    """How deep a header's arrays and objects nest, counted past its strings (an unterminated
    one's brackets are counted too, which can only overstate it)."""
    depth = deepest = 0
    for byte in _NOT_NESTING.sub(b"", _STRINGS.sub(b"", head)):
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


class Frames:
    """Frames out of a byte stream fed in pieces; a header over `max_header` bytes is refused
    without being parsed."""

    def __init__(self, max_header: int = MAX_FRAME, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max_header = max_header
        self._max_frame = max_frame

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes]]:
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (size,) = struct.unpack(">I", self._buf[:4])
            if size > self._max_frame:
                raise ValueError(f"a frame of {size} bytes")
            if len(self._buf) < 4 + size:
                break
            out.append(decode(bytes(self._buf[4:4 + size]), self._max_header))
            del self._buf[:4 + size]
        return out


class GuestFrames(Frames):
    """Frames from the guest, which the host does not trust (its kernel and agent may be an
    attacker's): a header is bounded in size and nesting before it is parsed, and must be one
    of the answers the host expects, its fields of their types. Anything else is a ValueError,
    and what follows a bad frame cannot be trusted either: the caller ends the VM's use."""

    def __init__(self) -> None:
        super().__init__(max_header=GUEST_HEADER_MAX)

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes]]:
        frames = super().feed(data)
        for header, _ in frames:
            _check_answer(header)
        return frames


def _check_answer(header: dict[str, Any]) -> None:
    op = header.get("op")
    needed = GUEST_ANSWERS.get(op) if isinstance(op, str) else None
    if needed is None:
        raise ValueError(f"an answer the host never asked for: {str(op)[:40]!r}")
    if missing := [name for name in needed if name not in header]:
        raise ValueError(f"a {op!r} frame without {', '.join(missing)}")
    for name, value in header.items():
        kind = _GUEST_FIELDS.get(name)
        if isinstance(kind, tuple):  # an int (never a bool) in that range
            if type(value) is not int or not kind[0] <= value <= kind[1]:
                raise ValueError(f"a {op!r} frame's {name} is {str(value)[:40]!r}")
        elif kind is not None and type(value) is not kind:
            raise ValueError(f"a {op!r} frame's {name} is not a {kind.__name__}")
