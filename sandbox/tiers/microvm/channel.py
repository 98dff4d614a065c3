"""The host's end of the guest agent's channel (`protocol`'s frames; `guest/vmagent.py` says
what each op does): requests one at a time, and a command's output streamed to descriptors or
gathered.

Every wait is bounded: a guest that stops answering is a SandboxError naming what was asked,
never a hang; the caller then kills the VM.
"""

from __future__ import annotations

import itertools
import os
import selectors
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import SandboxError
from ...guest.protocol import GuestFrames, Op, encode

_CHUNK = 65536
_REQUEST_SECONDS = 10.0
_EXIT_GRACE = 10.0  # how long past a command's own timeout the guest may take to report it
_NO_LIMIT = 7 * 86400.0  # a command given no timeout (epoll takes at most ~24 days)


@dataclass(frozen=True)
class GuestResult:
    code: int
    stdout: bytes
    stderr: bytes


@dataclass(frozen=True)
class GuestExit:
    code: int
    timed_out: bool  # killed by the guest at the command's time limit


@dataclass(frozen=True)
class _Limits:
    """Who a command runs as, where, and for how long."""

    uid: int
    gid: int
    cwd: str | None
    timeout: float | None
    pids: int | None
    in_root: bool = False  # in the image's root (`root`), as uid and gid there


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._frames = GuestFrames()
        self._queue: list[tuple[dict[str, Any], bytes]] = []
        self._ids = itertools.count(1)
        self.kernel = ""

    def _next(self, deadline: float, what: str,
              sel: selectors.BaseSelector | None = None) -> tuple[dict[str, Any], bytes] | None:
        """The next frame; with `sel`, None when one of its other descriptors is ready
        first (the caller handles it and asks again)."""
        while not self._queue:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError(f"the microVM's agent did not answer {what} in time")
            if sel is not None:
                ready = sel.select(left)
                if not any(key.fileobj is self.sock for key, _ in ready):
                    if ready:
                        return None
                    continue
            else:
                self.sock.settimeout(left)
            try:
                data = self.sock.recv(_CHUNK)
            except TimeoutError:
                continue
            except OSError as exc:
                raise SandboxError(f"the microVM's agent channel failed: {exc}") from None
            finally:
                self.sock.settimeout(None)
            if not data:
                raise SandboxError(f"the microVM ended while asked {what}")
            try:
                self._queue.extend(self._frames.feed(data))
            except ValueError as exc:
                raise SandboxError(f"the microVM's agent sent a bad frame: {exc}") from None
        return self._queue.pop(0)

    def take_over(self) -> tuple[GuestFrames, list[tuple[dict[str, Any], bytes]]]:
        """The frame parser and the frames read but not yet asked for, for a caller that reads
        the socket itself from here on (many requests at once: `hostserve`); this channel is
        not used again."""
        queued, self._queue = self._queue, []
        return self._frames, queued

    def wait_ready(self, timeout: float) -> str:
        """Wait for the agent's first word; the guest kernel's release."""
        header, _ = self._expect("to start", time.monotonic() + timeout, None, {Op.READY})
        self.kernel = str(header.get("kernel", ""))
        return self.kernel

    def _expect(self, what: str, deadline: float, ident: int | None,
                ops: set[Op]) -> tuple[dict[str, Any], bytes]:
        while True:
            frame = self._next(deadline, what)
            assert frame is not None
            header, payload = frame
            if ident is not None and header.get("id") != ident:
                continue  # late output of a command given up on
            if header.get("op") == Op.ERROR:
                raise SandboxError(f"the microVM's agent could not {what}: "
                                   f"{header.get('message')}")
            if header.get("op") in ops:
                return header, payload

    def request(self, header: dict[str, Any], payload: bytes = b"",
                timeout: float = _REQUEST_SECONDS) -> tuple[dict[str, Any], bytes]:
        ident = next(self._ids)
        self.sock.sendall(encode({**header, "id": ident}, payload))
        return self._expect(str(header.get("op")), time.monotonic() + timeout, ident,
                            {Op.OK, Op.DATA})

    def ping(self) -> None:
        self.request({"op": Op.PING})

    def network(self, address: str, gateway: str) -> None:
        self.request({"op": Op.NET, "address": address, "gateway": gateway})

    def seal(self) -> None:
        """The guest's root read-only from here on (puts outside /run and /tmp fail)."""
        self.request({"op": Op.SEAL})

    def root(self, dirs: Mapping[str, int], files: Sequence[str], owner: tuple[int, int],
             workspace: int | None = None, home: str | None = None) -> None:
        """An image's root made in the guest of its disk, `dirs` and `files` laid over, the
        image's /workspace seeding the workspace as `owner`'s (`guest/vmroot.py`), which is
        the guest's own tmpfs of `workspace` bytes, `owner`'s, when the host shares none, and
        `home` (one of `dirs`) `owner`'s; before the seal. Mounts and a walk under emulation:
        seconds."""
        self.request({"op": Op.ROOT, "dirs": dict(dirs), "files": list(files),
                      "owner": list(owner), "workspace": workspace, "home": home},
                     timeout=60.0)

    def renew(self, address: str, gateway: str, files: Mapping[str, bytes]) -> None:
        """A copy resumed from a saved VM made its own (`guest/vmos.renew`): this slot's
        address and files, fresh randomness from the host's, the host's clock."""
        self.request({"op": Op.RENEW, "address": address, "gateway": gateway,
                      "files": {path: data.decode("latin-1") for path, data in files.items()},
                      "seed": os.urandom(64).hex(), "time": time.time()}, timeout=60.0)

    def put(self, path: str, data: bytes, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
        self.request({"op": Op.PUT, "path": path, "mode": mode, "uid": uid, "gid": gid}, data)

    def get(self, path: str) -> bytes:
        return self.request({"op": Op.GET, "path": path})[1]

    def run(self, argv: Sequence[str], env: Mapping[str, str], *, uid: int, gid: int,
            cwd: str | None = None, timeout: float | None = None, pids: int | None = None,
            stdin: bytes = b"") -> GuestResult:
        """Run a command to its end; its exit status and everything it wrote."""
        out: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        ended = self._exec(argv, env, _Limits(uid, gid, cwd, timeout, pids), stdin=stdin,
                           stdin_fd=None, out=out)
        return GuestResult(ended.code, bytes(out[1]), bytes(out[2]))

    def stream(self, argv: Sequence[str], env: Mapping[str, str], *, uid: int, gid: int,
               cwd: str | None = None, timeout: float | None = None, pids: int | None = None,
               stdin_fd: int | None = None, stdout_fd: int = 1, stderr_fd: int = 2,
               in_root: bool = False) -> GuestExit:
        """Run a command with its input read from `stdin_fd` and its output written to the
        descriptors given, as it comes; how it ended. `in_root`: in the image's root."""
        return self._exec(argv, env, _Limits(uid, gid, cwd, timeout, pids, in_root), stdin=b"",
                          stdin_fd=stdin_fd, out={1: stdout_fd, 2: stderr_fd})

    def _exec(self, argv: Sequence[str], env: Mapping[str, str], how: _Limits, *, stdin: bytes,
              stdin_fd: int | None, out: Mapping[int, bytearray | int]) -> GuestExit:
        ident = next(self._ids)
        timeout = how.timeout
        order: dict[str, Any] = {"op": Op.EXEC, "id": ident, "argv": list(argv), "env": dict(env),
                                 "cwd": how.cwd, "uid": how.uid, "gid": how.gid,
                                 "timeout": timeout, "pids": how.pids}
        if how.in_root:
            order.update(root=True)
        self.sock.sendall(encode(order))
        if stdin_fd is None:
            if stdin:
                self.sock.sendall(encode({"op": Op.STDIN, "id": ident}, stdin))
            self.sock.sendall(encode({"op": Op.STDIN, "id": ident}))
        # The guest kills the command at its timeout; past that (and a grace for the report)
        # the guest itself is taken to be stuck.
        limit = (timeout + _EXIT_GRACE) if timeout is not None else _NO_LIMIT
        deadline = time.monotonic() + limit
        with selectors.DefaultSelector() as sel:
            sel.register(self.sock, selectors.EVENT_READ)
            if stdin_fd is not None:
                try:
                    sel.register(stdin_fd, selectors.EVENT_READ)
                except PermissionError:  # a file or /dev/null, which epoll refuses: never
                    self._send_file(ident, stdin_fd)  # blocks, so it is sent whole now
                    stdin_fd = None
            while True:
                frame = self._next(deadline, f"to run {argv[0]!r}", sel)
                if frame is None:
                    assert stdin_fd is not None
                    self._forward_stdin(ident, stdin_fd, sel)
                    continue
                header, payload = frame
                if header.get("id") != ident:
                    continue
                op = header.get("op")
                if op == Op.OUT:
                    target = out.get(int(header.get("fd", 2)), out[2])
                    if isinstance(target, bytearray):
                        target += payload
                    else:
                        _write_all(target, payload)
                elif op == Op.EXIT:
                    return GuestExit(int(header["code"]), header.get("timed_out") is True)
                elif op == Op.ERROR:
                    raise SandboxError(f"the microVM's agent could not run {argv[0]!r}: "
                                       f"{header.get('message')}")

    def _send_file(self, ident: int, fd: int) -> None:
        while data := os.read(fd, _CHUNK):
            self.sock.sendall(encode({"op": Op.STDIN, "id": ident}, data))
        self.sock.sendall(encode({"op": Op.STDIN, "id": ident}))

    def _forward_stdin(self, ident: int, fd: int, sel: selectors.BaseSelector) -> None:
        try:
            data = os.read(fd, _CHUNK)
        except OSError:
            data = b""
        if not data:
            sel.unregister(fd)
        self.sock.sendall(encode({"op": Op.STDIN, "id": ident}, data))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BrokenPipeError:
            return  # the reader went away; the command's status still counts
