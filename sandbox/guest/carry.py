"""The agent's packets carried over one byte stream, where no descriptor can cross: a sandbox
in a Kubernetes pod, reached through the API server's exec stream (`sealgate.kube.podserve`).
Standard library only: the pod's end runs in the pod.

The daemon speaks to a sandbox as to every other (`protocol`'s packets: a request and its
descriptors); two ends stand in between, speaking `protocol`'s frames to each other:

- `Sender`, on the daemon's side: reads the daemon's packets as an agent would, sends each
  request as a frame whose header is the packet itself, then the bytes its IN descriptors give
  as `data` frames (`id`, `fd`: the descriptor's place in `DESCRIPTORS`), an empty payload for
  their end; and writes the `data` frames that come back to its OUT descriptors, closing each
  at its end. A kill, signal or resize (no descriptors) is its header alone.
- `Receiver`, in the pod: the other way round. It starts the agent (`agent`, the same program
  every tier runs, its channel a packet pair), makes a pipe for each descriptor of a request
  (a socket pair for a `connect`'s one socket), hands the agent the request with its ends,
  writes what comes for IN, and sends what the agent writes to OUT. It says `ready` once the
  agent has.

The daemon's side trusts nothing from the pod: a header over `GUEST_HEADER_MAX` bytes or
nested deeper than the decoder allows, an op other than `ready` and `data`, a field of the
wrong type, ends the link (and so the sandbox); bytes for a descriptor that is not open and
not the pod's to write are dropped. The pod trusts the daemon.

Every descriptor written has a thread of its own (`_Writer`), so that one whose reader is not
reading yet (a get's data, read after its status line; a command's input it never reads)
holds back no other, nor a kill: each end holds at most `_HELD_MAX` bytes for its writers,
after which it stops reading the link, and the stream's own back-pressure carries that to the
other end. So a reader slower than its stream for long slows its sandbox's link, and is never
anyone's memory; a frame is at most `POD_FRAME_MAX` from the pod.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import subprocess
import sys
import threading

from .protocol import (
    DESCRIPTORS,
    GUEST_HEADER_MAX,
    IN,
    MAX_FRAME,
    VERSION,
    Frames,
    Op,
    encode,
    hello,
    parse,
    read_hello,
    receive,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_CHUNK = 1 << 16
# What the pod's end ever sends: a chunk and a small header. The daemon's side refuses more, so
# a pod cannot make it hold a frame of protocol's 64 MiB for each sandbox.
POD_FRAME_MAX = _CHUNK + 512
# Bytes held for the descriptors of one end's requests (written by their own threads) before
# that end stops reading the link: what a pod can make the daemon hold, per sandbox.
_HELD_MAX = 8 << 20
_END = b""


class Link:
    """One end of the stream: frames written whole under a lock, read by one thread."""

    def __init__(self, read: int, write: int, max_header: int,
                 max_frame: int = MAX_FRAME) -> None:
        self._read, self._write = read, write
        self._lock = threading.Lock()
        self._frames = Frames(max_header, max_frame)

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        with self._lock:
            _write_all(self._write, encode(header, payload))

    def frames(self) -> Any:
        """Each frame as it comes, until the stream ends. ValueError for a bad frame."""
        while chunk := os.read(self._read, _CHUNK):
            yield from self._frames.feed(chunk)


def _pump_out(link: Link, ident: int, index: int, fd: int) -> None:
    """What descriptor `fd` gives, as `data` frames, then its end."""
    try:
        while data := os.read(fd, _CHUNK):
            link.send({"op": Op.DATA, "id": ident, "fd": index}, data)
    except OSError:
        pass
    finally:
        os.close(fd)
        with contextlib.suppress(OSError, ValueError):
            link.send({"op": Op.DATA, "id": ident, "fd": index}, _END)


def _start(target: Callable[..., None], *args: Any) -> None:
    threading.Thread(target=target, args=args, daemon=True).start()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _end(fd: int) -> None:
    """The end of a stream written to `fd`: a socket's writing half shut (its reader sees the
    end while its other direction goes on), anything else closed."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_WR)
        finally:
            sock.close()
        return
    with contextlib.suppress(OSError):
        os.close(fd)


class _Budget:
    """The bytes one end's writers may hold between them."""

    def __init__(self, most: int) -> None:
        self._left = most
        self._cond = threading.Condition()

    def take(self, n: int) -> None:
        with self._cond:
            while n > self._left:  # n is at most a frame's payload, well under the whole
                self._cond.wait()
            self._left -= n

    def give(self, n: int) -> None:
        with self._cond:
            self._left += n
            self._cond.notify_all()


class _Writer:
    """Bytes for one descriptor, written as they come by a thread of its own, so that a
    descriptor whose reader is not reading yet (a get's data, read after its status line)
    holds back no other of the link's: the link's reader waits only once the end's budget is
    spent. A reader gone drops the rest; the end (`put(b"")`) never waits."""

    def __init__(self, fd: int, budget: _Budget) -> None:
        self._fd, self._budget = fd, budget
        self._queue: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        _start(self._run)

    def put(self, data: bytes) -> None:
        self._budget.take(len(data))
        self._queue.put(data)

    def _run(self) -> None:
        broken = False
        try:
            while data := self._queue.get():
                if not broken:
                    try:
                        _write_all(self._fd, data)
                    except OSError:  # its reader went: what else comes for it is dropped
                        broken = True
                self._budget.give(len(data))
        finally:
            _end(self._fd)


class Sender:
    """The daemon's side: `chan` is the other end of the daemon's packet pair (as the agent's
    standard input is), `link` the stream to the pod."""

    def __init__(self, chan: socket.socket, link: Link) -> None:
        self.chan, self.link = chan, link
        self._out: dict[tuple[int, int], _Writer] = {}  # (request, descriptor) -> its writer
        self._lock = threading.Lock()
        self._budget = _Budget(_HELD_MAX)
        self._ready = False

    def run(self) -> None:
        """Serve until either end goes; then every descriptor held is closed (the daemon sees
        each request's status end without a line: lost)."""
        _start(self._requests)
        try:
            for header, payload in self.link.frames():
                self._answer(header, payload)
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                held, self._out = list(self._out.values()), {}
            for writer in held:
                writer.put(_END)
            # Shut, not only closed: the thread reading requests holds the socket in its
            # recvmsg, and the daemon would see no end until that returned.
            with contextlib.suppress(OSError):
                self.chan.shutdown(socket.SHUT_RDWR)
            self.chan.close()

    def _requests(self) -> None:
        try:
            while (got := receive(self.chan)) is not None:
                self._request(*got)
        finally:  # the daemon is gone: so is the link
            with contextlib.suppress(OSError):
                self.link.send({"op": Op.KILL, "id": 0, "all": True})

    def _request(self, message: bytes, fds: list[int]) -> None:
        parsed = parse(message, fds)
        if parsed is None:
            for fd in fds:
                os.close(fd)
            return
        op, ident, req = parsed
        with self._lock:  # before the request leaves: its first answer may come at once
            for index, (_, way) in enumerate(DESCRIPTORS[op]):
                if way != IN:
                    self._out[ident, index] = _Writer(fds[index], self._budget)
        try:
            self.link.send(req)
        except (OSError, ValueError):
            return
        for index, (_, way) in enumerate(DESCRIPTORS[op]):
            if way == IN:
                _start(_pump_out, self.link, ident, index, fds[index])

    def _answer(self, header: dict[str, Any], payload: bytes) -> None:
        op = header.get("op")
        if op == Op.READY:
            if self._ready or read_hello(encode(header)[4:].rstrip(b"\n")) is not None:
                raise ValueError("the pod's agent said ready twice, or is not this version")
            self._ready = True
            self.chan.send(hello())
            return
        ident, index = header.get("id"), header.get("fd")
        if op != Op.DATA or type(ident) is not int or type(index) is not int:
            raise ValueError(f"a frame the daemon never asked for: {str(op)[:40]!r}")
        with self._lock:
            writer = self._out.get((ident, index))
            if writer is not None and not payload:
                del self._out[ident, index]
        if writer is not None:  # else its reader is gone, or it was never the pod's to write
            writer.put(payload)


class Receiver:
    """The pod's side: the agent started with `agent_argv` (its channel its standard input),
    served over `link`."""

    def __init__(self, link: Link, agent_argv: list[str]) -> None:
        self.link = link
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.agent = subprocess.Popen(agent_argv, stdin=theirs.fileno(),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.chan = ours
        self._in: dict[tuple[int, int], _Writer] = {}
        self._budget = _Budget(_HELD_MAX)

    def run(self) -> None:
        try:
            said = self.chan.recv(4096)
            if read_hello(said) is not None:
                return
            self.link.send({"op": Op.READY, "version": VERSION})
            for header, payload in self.link.frames():
                if not self._handle(header, payload):
                    return
        finally:
            self.chan.close()  # the agent ends at its channel's end, and its commands with it
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.agent.wait(10)

    def _handle(self, header: dict[str, Any], payload: bytes) -> bool:
        op = header.get("op")
        if op == Op.DATA:
            writer = self._in.get((header["id"], header["fd"]))
            if writer is not None:
                if not payload:
                    del self._in[header["id"], header["fd"]]
                writer.put(payload)
            return True
        if op == Op.KILL and header.get("all") is True:  # the daemon let the sandbox go
            return False
        if op == Op.EXEC:
            # The pod's own environment (its image's and its spec's: the proxy's variables, the
            # CA bundle) is what a command starts from, under what the request gives, as a
            # slot's built environment is on one host.
            header["env"] = {**os.environ, **(header.get("env") or {})}
        descriptors = DESCRIPTORS.get(str(op), ())
        theirs, ours = self._ends(op, len(descriptors))
        ident = int(header["id"])
        try:
            socket.send_fds(self.chan, [encode(header)[4:].rstrip(b"\n")], theirs)
        except OSError:
            return False
        finally:
            for fd in set(theirs):
                os.close(fd)
        for index, (_, way) in enumerate(descriptors):
            if way == IN:
                self._in[ident, index] = _Writer(ours[index], self._budget)
            else:
                _start(_pump_out, self.link, ident, index, ours[index])
        return True

    @staticmethod
    def _ends(op: Any, count: int) -> tuple[list[int], list[int]]:
        """The agent's descriptors for a request, and ours for each (ours to read for OUT,
        to write for IN)."""
        if op == Op.CONNECT:  # one socket, its bytes both ways, and a status pipe
            a, b = socket.socketpair()
            status_r, status_w = os.pipe()
            mine = a.detach()
            return [os.dup(b.fileno()), b.detach(), status_w], [os.dup(mine), mine, status_r]
        theirs, ours = [], []
        for _, way in DESCRIPTORS[op][:count]:
            r, w = os.pipe()
            theirs.append(r if way == IN else w)
            ours.append(w if way == IN else r)
        return theirs, ours


def main(args: list[str]) -> None:
    """The pod's end, on this process's standard input and output (the exec stream): the
    agent run as `args` (by default this package's, from where it is imported)."""
    argv = args or [sys.executable, "-I", "-S", "-c",
                    "import sys; sys.path[:0] = sys.argv[1:2]; "
                    "from guest.agent import main; main([])",
                    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    Receiver(Link(0, 1, GUEST_HEADER_MAX), argv).run()


if __name__ == "__main__":  # the pod's end: `python3 -I -m sealgate.sandbox.guest.carry`
    main(sys.argv[1:])
