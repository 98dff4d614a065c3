"""A sandboxd slot's microVM, on the host: the command the microVM tier hands a slot
(`sandbox.tiers.microvm.serve`), started as root in the sandbox's namespace and cgroups.

It boots the slot's VM as `hostrun` does (the namespace wired to a tap, the guest given its
address and the staged files), says it is ready, and then speaks the daemon's agent protocol
on its standard input (`protocol`'s packets: a request and its descriptors per packet), each
request turned into the guest agent's frames (`guest/vmagent.py`):

- `exec`: the guest's exec as the slot's uid, its input read from the request's stdin and its
  output written to the request's stdout and stderr as it comes, then the status line the
  daemon reads (`exit`, `ending`: killed when the daemon asked, timed_out when the guest's
  timeout ended it);
- every other op (`put`, `get`: `guest/shim.py`'s): run inside the guest as the slot's uid by
  the other tiers' own agent code (`staging.ZIP`, staged in the guest like every slot's): the
  same walk of the workspace that never follows a link, with the workload's rights and no
  more; the guest agent's own root file calls are only ever used for what the host stages.
  The request's descriptors become the process's standard streams (`shim.main`); a
  `connect`'s (`guest/portdial.py`, a port on the guest's own loopback) are one socket, shut
  down here once the shim ends, so the daemon's end sees the connection's end;
- `layer`: an image's sandbox's root as a layer, made by the guest agent itself as the guest's
  root (`vmagent`), its stream and status lines written to the request's as they come;
- `kill`: the guest kills the command's process group; `signal`: it sends it the signal;
  `resize`: the guest resizes an exec's terminal (an exec with `tty` runs on one there).

A slot from an image (`Order.disk`) has its root made in the guest at set-up (`hostrun`); its
execs run there as the guest's root (`root`: the image's files are root's, and the VM is the
boundary), and its workspace is a tmpfs of the guest's own (`Order.workspace_bytes`: no 9p
share, so QEMU can save the VM), root's too: put and get run as the guest's root in the
guest's own root, on the same /workspace the image's root has bound, with the same walk that
never follows a link (nothing there is the host's, and the image's commands are that root).

The VM is this slot's alone and lives as long as this process: when the daemon's end of the
channel closes, or the daemon kills QEMU (this process's child), or the guest ends, this
process ends, which the daemon watches. The daemon's warm pool of slots is the pool of booted
VMs: each is booted for one slot, handed to one sandbox, and killed with it.

Requests run at once, each in a thread, over the guest's one channel (`guestlink`: one thread
reads the guest's frames and hands each to its request's queue).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import sys
import threading
import time
from typing import Any

from ...errors import SandboxError
from ...guest import staging
from ...guest.protocol import (
    DESCRIPTORS,
    FIELDS,
    IN,
    SIGNALS,
    WORKSPACE,
    Ending,
    Op,
    failed,
    hello,
    parse,
    receive,
    status_line,
)
from . import hostrun
from .guestlink import Guest, end

_MAX_RUNNING = 128  # requests at once (the daemon sends at most 64 per sandbox)
_CHUNK = 1 << 16
_EXIT_GRACE = 10.0  # past a command's own timeout, for the guest to report it
_NO_LIMIT = 7 * 86400.0
_HELD_MAX = 8 << 20  # a get's bytes that may arrive before its status line
_PYTHON = "/usr/bin/python3"


class Server:
    def __init__(self, guest: Guest, order: hostrun.Order) -> None:
        self.guest = guest
        self.order = order
        self._running: dict[int, int] = {}  # the daemon's request id -> the guest's
        self._killed: set[int] = set()  # guest ids the daemon asked to kill
        self._slots = threading.BoundedSemaphore(_MAX_RUNNING)  # requests served at once

    def serve(self, chan: socket.socket) -> None:
        chan.send(hello())
        while (got := receive(chan)) is not None:
            self._dispatch(*got)

    def _dispatch(self, message: bytes, fds: list[int]) -> None:
        op, ident, req = parse(message, fds) or (None, 0, {})
        if op in (Op.KILL, Op.SIGNAL, Op.RESIZE):
            number = req.get("signal") if op == Op.SIGNAL else SIGNALS["KILL"]
            if (gid := self._running.get(ident)) is None:
                return
            if op == Op.RESIZE:
                self.guest.send({"op": Op.RESIZE, "id": gid, "rows": req.get("rows"),
                                 "cols": req.get("cols")})
            elif number in SIGNALS.values():  # the guest kills its group for KILL
                self._killed.update([gid] if op == Op.KILL else [])
                self.guest.send({"op": Op.KILL, "id": gid, "signal": number})
            return
        if op is not None and self._slots.acquire(blocking=False):
            # Known before its thread runs: a kill right behind the request finds it.
            opened = self.guest.open()
            gid = self._running[ident] = opened[0]
            try:
                threading.Thread(target=self._request, args=(op, ident, opened, req, fds),
                                 daemon=True).start()
                return
            except RuntimeError:  # no thread to be had: this request is lost, not the VM
                self._running.pop(ident, None)
                self.guest.close(gid)
                self._slots.release()
        for fd in fds:  # the daemon then sees no status: the request is lost
            os.close(fd)

    def _request(self, op: Op, ident: int,
                 opened: tuple[int, queue.Queue[tuple[dict[str, Any], bytes]]],
                 req: dict[str, Any], fds: list[int]) -> None:
        gid, frames = opened
        try:
            if op == Op.EXEC:
                self._exec(gid, frames, req, fds)
            elif op == Op.LAYER:
                self._layer(gid, frames, fds)
            elif op == Op.SAVE:
                self._save(gid, frames, fds)
            else:
                self._shim(gid, frames, op, req, fds)
        except Exception as exc:  # the request's failure, never the sandbox's end
            # Said on its status (the daemon reads no stderr of ours), if that is still open.
            status = fds[-1]
            if status >= 0:
                _write_all(status, status_line({
                    "exit": None, "ending": Ending.LOST,
                    "error": f"the microVM's launcher failed the {op}: {type(exc).__name__}",
                }))
        finally:
            self._running.pop(ident, None)
            self._killed.discard(gid)
            self.guest.close(gid)
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._slots.release()

    def _start(self, gid: int, argv: list[str], env: dict[str, Any], stdin: int, *,
               cwd: str | None, timeout: float | None, pids: int | None = None,
               in_root: bool = False, tty: list[int] | None = None) -> None:
        # The create's process limit is each command's RLIMIT_NPROC inside, as in the agent
        # (or its cgroup's, in an image's root: `vmagent`).
        order = self.order
        frame = {"op": Op.EXEC, "id": gid, "argv": argv, "env": env, "cwd": cwd or WORKSPACE,
                 "uid": order.uid, "gid": order.gid, "timeout": timeout,
                 "pids": pids or order.pids, "tty": tty}
        if order.disk is not None:
            # An image's commands are its User, else the guest's root, in its root, and so are
            # the shims in the guest's, on a workspace (the guest's own tmpfs) that is theirs.
            frame["uid"], frame["gid"] = order.image_ids()
        if in_root:
            frame.update(root=True)
        self.guest.send(frame)
        # The feeder owns the request's stdin from here: it closes it at its end.
        threading.Thread(target=self._feed, args=(gid, stdin), daemon=True).start()

    def _feed(self, gid: int, fd: int) -> None:
        try:
            while data := os.read(fd, _CHUNK):
                self.guest.send({"op": Op.STDIN, "id": gid}, data)
            self.guest.send({"op": Op.STDIN, "id": gid})
        except OSError:
            pass
        finally:
            os.close(fd)

    def _exec(self, gid: int, frames: queue.Queue[tuple[dict[str, Any], bytes]],
              req: dict[str, Any], fds: list[int]) -> None:
        stdin, stdout, stderr, status = fds
        fds[0] = -1  # the feeder's now
        timeout = req.get("timeout")
        self._start(gid, [str(a) for a in req["argv"]], dict(req.get("env") or {}), stdin,
                    cwd=req.get("cwd"), timeout=None if timeout is None else float(timeout),
                    pids=req.get("pids"), in_root=self.order.disk is not None,
                    tty=req.get("tty"))
        ended, error = _drain(frames, {1: stdout, 2: stderr}, timeout)
        for fd in (stdout, stderr):
            os.close(fd)
        fds[1] = fds[2] = -1
        answer: dict[str, Any] = {"exit": None, "ending": Ending.EXIT}
        if ended is None:
            answer.update(ending=Ending.LOST, error=error or "the guest did not report the command")
        else:
            answer["exit"] = int(ended["code"])
            if ended.get("timed_out") is True:
                answer["ending"] = Ending.TIMED_OUT
            else:
                if gid in self._killed:
                    answer["ending"] = Ending.KILLED
                if isinstance(ended.get("signal"), int):
                    answer["signal"] = ended["signal"]
            if error is not None:
                answer["error"] = error
        _write_all(status, status_line(answer))

    def _layer(self, gid: int, frames: queue.Queue[tuple[dict[str, Any], bytes]],
               fds: list[int]) -> None:
        """The image root's layer, made by the guest agent itself (`vmagent`'s `layer`): its
        stream to the request's data, its status lines to its status."""
        if self.order.disk is None:
            _write_all(fds[-1], status_line({"error": "this sandbox has no image root"}))
            return
        self.guest.send({"op": Op.LAYER, "id": gid})
        _drain(frames, {1: fds[0], 2: fds[1]}, None, status_first=True)

    def _save(self, gid: int, frames: queue.Queue[tuple[dict[str, Any], bytes]],
              fds: list[int]) -> None:
        if self.order.disk is None:
            _write_all(fds[-1], status_line({"error": "a VM with the host's /usr over 9p "
                                                      "cannot be saved (only one from an image)"}))
            return
        try:
            size = self.guest.save(gid, frames, fds[0])
        except SandboxError as exc:
            _write_all(fds[-1], status_line({"error": str(exc)}))
            return
        _write_all(fds[-1], status_line({"ok": True, "size": size}))

    def _shim(self, gid: int, frames: queue.Queue[tuple[dict[str, Any], bytes]], op: Op,
              req: dict[str, Any], fds: list[int]) -> None:
        """An op the agent serves in a shim, run in the guest as the slot's uid: the request's
        descriptors become the process's standard streams (`shim.main`)."""
        stdin, outputs = -1, {2: fds[-1]}
        for index, (_, way) in enumerate(DESCRIPTORS[op][:-1]):
            if way == IN:
                stdin, fds[index] = fds[index], -1  # the feeder's now
            else:
                outputs[1] = fds[index]
        if stdin < 0:  # it reads nothing
            stdin, empty_w = os.pipe()
            os.close(empty_w)
        request = {name: req.get(name) for name in FIELDS[op]}
        argv = [_PYTHON, "-I", "-S", "-c", staging.entry("shim"), op, json.dumps(request)]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        self._start(gid, argv, env, stdin, cwd=WORKSPACE, timeout=None)
        # A status must reach the daemon before the bytes it announces: it reads them after.
        _drain(frames, outputs, None, status_first=True)
        if op == Op.CONNECT:
            # The shim ended with the server's end of the connection: the daemon's end must
            # see it too, while the feeder still holds the socket it reads the caller's from.
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(outputs[1])) as sock:
                sock.shutdown(socket.SHUT_RDWR)


def _drain(
    frames: queue.Queue[tuple[dict[str, Any], bytes]], outputs: dict[int, int],
    timeout: float | None, *, status_first: bool = False,
) -> tuple[dict[str, Any] | None, str | None]:
    """Write a command's output to `outputs` (fd 1, 2 -> descriptor; what has none is dropped)
    until its exit: (the guest's exit frame, its error), or (None, why) if it never came."""
    limit = _NO_LIMIT if timeout is None else float(timeout) + _EXIT_GRACE
    deadline = time.monotonic() + limit
    closed: set[int] = set()
    held: list[bytes] = []  # a get's bytes ahead of its status line
    said = not status_first
    while (left := deadline - time.monotonic()) > 0:
        try:
            header, payload = frames.get(timeout=min(left, 60.0))
        except queue.Empty:
            continue
        op = header.get("op")
        if op == Op.OUT:
            which = int(header.get("fd", 2))
            if which == 1 and not said:
                held.append(payload)
                if sum(map(len, held)) > _HELD_MAX:
                    return None, "the file's bytes came without its status"
                continue
            target = outputs.get(which)
            if target is not None and which not in closed and not _write_all(target, payload):
                closed.add(which)
            if which == 2 and not said:
                said = True
                for chunk in held:
                    if 1 not in closed and not _write_all(outputs[1], chunk):
                        closed.add(1)
                held.clear()
        elif op == Op.EXIT:
            return header, None
        elif op == Op.ERROR:
            return {"code": 127}, str(header.get("message"))[:500]
    return None, "the guest did not report the command in time"


def _write_all(fd: int, data: bytes) -> bool:
    """False once the reader is gone."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:
            return False
    return True


def main() -> int:
    chan = socket.socket(fileno=0)
    try:
        fd = int(sys.argv[1])
        with os.fdopen(fd, "rb") as fh:
            order = hostrun.Order.from_json(fh.read())
        booted = hostrun.resume(order) if order.restore else hostrun.start(order)
    except (SandboxError, OSError, ValueError, IndexError, TypeError) as exc:
        # What the daemon reads in place of its hello, so a failed slot says why.
        with contextlib.suppress(OSError):
            chan.send(failed(str(exc)))
        return hostrun.SETUP_FAILED
    guest = Guest(booted)
    threading.Thread(target=guest.read, daemon=True).start()
    try:
        Server(guest, order).serve(chan)
    finally:
        end(booted, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
