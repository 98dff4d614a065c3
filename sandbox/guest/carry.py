"""The agent's packets carried over one byte stream, where no descriptor can cross: a sandbox
in a Kubernetes pod, reached through the API server's exec stream (`sandbox.kubernetes`).
Standard library only: the pod's end runs in the pod.

The daemon speaks to a sandbox as to every other (`protocol`'s packets: a request and its
descriptors); two ends stand in between, speaking `protocol`'s frames to each other over one
`carrylink.Link`:

- `Sender`, on the daemon's side: reads the daemon's packets as an agent would, sends each
  request as a frame whose header is the packet itself; each of its descriptors is then a
  stream of its own (`carrylink`): the bytes of those the agent reads go as `data` frames
  (`id`, `fd`: the descriptor's place in `DESCRIPTORS`, an empty payload for the end), those
  that come back are written to the descriptors the agent writes. A kill, signal or resize
  (no descriptors) is its header alone.
- `Receiver`, in the pod: the other way round. It starts the agent (`agent`, the same program
  every tier runs, its channel a packet pair), makes a pipe for each descriptor of a request
  (a socket pair for a `connect`'s one socket), and hands the agent the request with its ends.
  It says `ready` once the agent has.

Each stream has a window (`carrylink.WINDOW`, granted back by `credit` frames as its bytes are
written), so neither end ever stops reading the link: a get's data ahead of its status line, a
command's input it never reads, a slow reader of a port, hold back only their own stream; a
kill always arrives.

The daemon's side trusts nothing from the pod: a frame over `POD_FRAME_MAX`, a header over
`GUEST_HEADER_MAX` bytes or nested deeper than the decoder allows, an op other than `ready`
(once), `data` and `credit`, a field of the wrong type, a stream sent past its window, ends the
link (and so the sandbox); bytes for a descriptor that is not open and not the pod's to write
are dropped. A sandbox holds at most `_MOST_STREAMS` streams open: a request past it is lost.
The pod trusts the daemon.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time

from .carrylink import CHUNK, END, WINDOW, Incoming, Link, Outgoing
from .protocol import (
    DESCRIPTORS,
    GUEST_HEADER_MAX,
    IN,
    VERSION,
    Op,
    encode,
    hello,
    parse,
    read_hello,
    receive,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# What the pod's end ever sends: a chunk and a small header. The daemon's side refuses more, so
# a pod cannot make it hold a frame of protocol's 64 MiB for each sandbox.
POD_FRAME_MAX = CHUNK + 512
_MOST_STREAMS = 256  # at once per sandbox: the daemon's 64 requests, of up to 4 descriptors
_STRAYS = 16384  # frames for no open stream, a burst; a quarter of it a second after
Key = tuple[int, int]  # (request, descriptor)


class _Streams:
    """One end's open streams, each gone from here when its thread ends."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self._in: dict[Key, Incoming] = {}
        self._out: dict[Key, Outgoing] = {}
        self._lock = threading.Lock()
        self._closed = False

    def open(self, ident: int, written: dict[int, int], read: dict[int, int]
             ) -> list[Outgoing] | None:
        """Streams for request `ident`: the descriptors this end writes (`written`, started at
        once: answers may come before the request is out) and reads (`read`, returned for the
        caller to start once the request is sent). None, and the descriptors closed, once the
        link has ended or the sandbox holds its most."""
        with self._lock:
            if self._closed or len(self._in) + len(self._out) + len(written) + len(read) \
                    > _MOST_STREAMS:
                for fd in {*written.values(), *read.values()}:
                    os.close(fd)
                return None
            incoming = {(ident, i): Incoming(self.link, ident, i, fd, self._forgetter(
                self._in, (ident, i))) for i, fd in written.items()}
            outgoing = {(ident, i): Outgoing(self.link, ident, i, fd, self._forgetter(
                self._out, (ident, i))) for i, fd in read.items()}
            self._in.update(incoming)
            self._out.update(outgoing)
        for stream in incoming.values():
            stream.start()
        return list(outgoing.values())

    def data(self, key: Key, payload: bytes) -> bool:
        """Whether the stream is open here (else its reader is gone, or it is not this end's
        to write: dropped). ValueError past the stream's window."""
        with self._lock:
            stream = self._in.get(key)
        if stream is None:
            return False
        stream.put(payload)
        return True

    def credit(self, key: Key, n: int, closed: bool) -> None:
        with self._lock:
            stream = self._out.get(key)
        if stream is not None:
            stream.grant(n, closed)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            incoming, outgoing = list(self._in.values()), list(self._out.values())
        for stream in incoming:
            stream.put(END)
        for out in outgoing:
            out.stop()

    def _forgetter(self, table: dict[Key, Any], key: Key) -> Any:
        def forget() -> None:
            with self._lock:
                table.pop(key, None)
        return forget


class Sender:
    """The daemon's side: `chan` is the other end of the daemon's packet pair (as the agent's
    standard input is), `link` the stream to the pod."""

    def __init__(self, chan: socket.socket, link: Link) -> None:
        self.chan, self.link = chan, link
        self.streams = _Streams(link)
        self._ready = False
        # Frames for no open stream: a few follow a stream that ended early; a flood of them
        # is a pod spending the daemon's time (its parsing holds the interpreter's lock).
        self._strays, self._stray_at = float(_STRAYS), time.monotonic()

    def run(self) -> None:
        """Serve until either end goes; then every stream ends (the daemon sees each request's
        status end without a line: lost)."""
        threading.Thread(target=self._requests, daemon=True).start()
        try:
            for header, payload in self.link.frames():
                self._answer(header, payload)
        except (OSError, ValueError):
            pass
        finally:
            self.streams.close()
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
        ways = [way for _, way in DESCRIPTORS[op]]
        read = self.streams.open(ident, {i: fd for i, fd in enumerate(fds) if ways[i] != IN},
                                 {i: fd for i, fd in enumerate(fds) if ways[i] == IN})
        if read is None:
            return  # the daemon sees its status end without a line: lost
        with contextlib.suppress(OSError):  # a link gone: each stream ends as it finds it so
            self.link.send(req)
        for stream in read:
            stream.start()

    def _answer(self, header: dict[str, Any], payload: bytes) -> None:
        op = header.get("op")
        if op == Op.READY:
            if self._ready or read_hello(encode(header)[4:].rstrip(b"\n")) is not None:
                raise ValueError("the pod's agent said ready twice, or is not this version")
            self._ready = True
            self.chan.send(hello())
            return
        ident, index = header.get("id"), header.get("fd")
        if type(ident) is not int or type(index) is not int:
            raise ValueError(f"a {str(op)[:40]!r} frame without a request and descriptor")
        if op == Op.DATA:
            if not self.streams.data((ident, index), payload):
                self._stray()
        elif (op == Op.CREDIT and type(n := header.get("n")) is int and 0 <= n <= WINDOW
              and type(closed := header.get("closed", False)) is bool):
            self.streams.credit((ident, index), n, closed)
        else:
            raise ValueError(f"a frame the daemon never asked for: {str(op)[:40]!r}")


    def _stray(self) -> None:
        now = time.monotonic()
        self._strays = min(_STRAYS, self._strays + (now - self._stray_at) * _STRAYS / 4)
        self._stray_at = now
        self._strays -= 1
        if self._strays < 0:
            raise ValueError("a flood of frames for no open stream")


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
        self.streams = _Streams(link)

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
            self.streams.close()
            self.chan.close()  # the agent ends at its channel's end, and its commands with it
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.agent.wait(10)

    def _handle(self, header: dict[str, Any], payload: bytes) -> bool:
        op = header.get("op")
        if op == Op.DATA:
            self.streams.data((header["id"], header["fd"]), payload)
            return True
        if op == Op.CREDIT:
            self.streams.credit((header["id"], header["fd"]), header["n"],
                                header.get("closed", False))
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
        ways = [way for _, way in descriptors]
        read = self.streams.open(ident, {i: fd for i, fd in enumerate(ours) if ways[i] == IN},
                                 {i: fd for i, fd in enumerate(ours) if ways[i] != IN})
        try:
            socket.send_fds(self.chan, [encode(header)[4:].rstrip(b"\n")], theirs)
        except OSError:
            return False
        finally:
            for fd in set(theirs):
                os.close(fd)
        for stream in read or ():
            stream.start()
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
