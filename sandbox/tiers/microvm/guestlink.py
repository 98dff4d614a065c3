"""The guest agent's channel as the microVM's launcher (`hostserve`) shares it between the
requests it serves at once: frames sent under a lock; one reader thread that hands each of the
guest's frames to its request's queue (a full queue holds that read back, so a caller reading
slowly slows its sandbox's channel and never fills the launcher's memory); and the save of the
VM's memory (`Guest.save`), for which the channel is held between two frames both ways.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from ...errors import SandboxError
from ...guest.protocol import GuestFrames, Op, encode
from .pool import Booted

_QUEUED = 64  # frames held per request before the guest's channel is held back
_CHUNK = 1 << 16
_SAVE_SECONDS = 120.0  # a guest's memory written under emulation: ~0.5 s for 512 MiB here
_ANSWER_SECONDS = 30.0  # for the guest agent to answer a hold or a release


def _answered(frames: queue.Queue[tuple[dict[str, Any], bytes]], op: Op) -> None:
    """The guest's ok to the request whose frames these are. Raises SandboxError."""
    try:
        header, _ = frames.get(timeout=_ANSWER_SECONDS)
    except queue.Empty:
        raise SandboxError(f"the guest did not answer the {op}") from None
    if header.get("op") != Op.OK:
        raise SandboxError(f"the guest refused the {op}: {str(header.get('message'))[:200]}")


class Guest:
    """The guest agent's channel, shared by every request: frames sent under a lock, and
    one reader thread that hands each frame to its request's queue."""

    def __init__(self, booted: Booted) -> None:
        self.booted = booted
        self.sock = booted.channel.sock
        self._frames, queued = booted.channel.take_over()
        self._lock = threading.Lock()
        self._queues: dict[int, queue.Queue[tuple[dict[str, Any], bytes]]] = {}
        self._ids = itertools.count(1 << 20)  # apart from the ids the set-up's channel used
        for frame in queued:
            self._deliver(frame)

    def open(self) -> tuple[int, queue.Queue[tuple[dict[str, Any], bytes]]]:
        ident = next(self._ids)
        frames: queue.Queue[tuple[dict[str, Any], bytes]] = queue.Queue(_QUEUED)
        self._queues[ident] = frames
        return ident, frames

    def close(self, ident: int) -> None:
        self._queues.pop(ident, None)

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        with self._lock:
            self.sock.sendall(encode(header, payload))

    def save(self, gid: int, frames: queue.Queue[tuple[dict[str, Any], bytes]], fd: int
             ) -> int:
        """The VM's memory written to `fd` (a file's): the bytes written. The guest agent is
        held first (it sends nothing more), and nothing is sent to it until it is released
        (other requests' frames wait): the channel is between two frames both ways in what
        is saved, so a copy resumed from it reads only its own frames. QEMU is stopped for
        the copy and continued after."""
        monitor = self.booted.machine.monitor
        with self._lock:
            self.sock.sendall(encode({"op": Op.HOLD, "id": gid}))
            try:
                _answered(frames, Op.HOLD)
                monitor.execute("stop")
                try:
                    return monitor.save(fd, _SAVE_SECONDS)
                finally:
                    monitor.execute("cont")
            finally:
                # Always: a guest held would serve nothing more (one that was not answers
                # with an error, which is all the same here).
                self.sock.sendall(encode({"op": Op.RELEASE, "id": gid}))
                with contextlib.suppress(SandboxError):
                    _answered(frames, Op.RELEASE)

    def _deliver(self, frame: tuple[dict[str, Any], bytes]) -> None:
        ident = frame[0].get("id")
        while isinstance(ident, int) and (frames := self._queues.get(ident)) is not None:
            try:
                frames.put(frame, timeout=1.0)
                return
            except queue.Full:
                continue  # held back while its request lives and has not read it

    def read(self) -> None:
        """Until the guest ends or sends what is not a frame; then this process ends (the
        daemon sees the sandbox end), saying why."""
        why = relay(self.sock, self._frames, self._deliver)
        print(f"sealgate microVM launcher: {why}; the sandbox ends", file=sys.stderr, flush=True)
        end(self.booted, 0)


def relay(sock: socket.socket, frames: GuestFrames,
          deliver: Callable[[tuple[dict[str, Any], bytes]], None]) -> str:
    """Hand each of the guest's frames to `deliver` until its channel ends; why it ended. A bad
    frame ends it too (`GuestFrames`: the guest is not trusted), and so does any failure here:
    a reader that died and left the VM running would lose every later request."""
    try:
        while data := sock.recv(_CHUNK):
            for frame in frames.feed(data):
                deliver(frame)
    except OSError as exc:
        return f"the guest's channel failed: {exc}"
    except ValueError as exc:
        return f"the guest sent a bad frame: {exc}"
    except Exception as exc:  # whatever it is, it ends this VM only
        return f"reading the guest failed: {type(exc).__name__}"
    return "the guest ended"


def end(booted: Booted, code: int) -> None:
    """The VM ended and this process with it, at once."""
    booted.close()
    os._exit(code)  # other threads may be blocked on the VM's or the daemon's channel
