"""An upgrade without losing work: a daemon hands its live sandboxes to its successor.

The pattern of haproxy's `-x` and nginx's binary upgrade, while both daemons live: every daemon
serves a hand-over socket (`path_for`: under the proxy's state directory, root's only: the
directory 0700, the socket 0600, and a peer that is not root refused by its credentials). A new
daemon for the same API socket connects to it at its start (`sandbox.daemon.adopt`) and says
hello with what it would run as (`want`); the old one

- refuses, saying why, a successor whose settings differ where a sandbox depends on them (the
  state directory, the proxy's ports, the range, the uid base, the tier, the listeners), a tier
  whose sandboxes die with the daemon that started them (`Tier.no_adopt`), and sandboxes with
  background processes running (their output is read by this daemon's tasks, from pipes a
  transfer would have to freeze mid-byte: they are named, to be waited for or killed first);
- stops taking requests (503 `at_capacity`, "handing over") and making or ending anything
  (`Daemon.hold`), and waits a bounded time (`DRAIN_SECONDS`) for requests under way to end;
  past it, it refuses, naming the sandboxes still busy;
- sends every slot, sandboxes' and the pools' (`sandbox.daemon.carried`: JSON and descriptors
  by SCM_RIGHTS), then its API's listening sockets, so no connection is refused meanwhile;
- on the successor's `taken` (sent once it holds everything and has rewritten the leases in
  its name), closes its own descriptors of them and exits without deleting anything. On
  anything else (a refusal, the successor's death, a timeout) it takes its leases back and
  serves on: a hand-over is whole or not at all.

Every message is one JSON object in one SOCK_SEQPACKET packet of at most `MAX_MESSAGE` bytes;
anything else (not JSON, not the protocol's hello, truncated, descriptors where none belong) is
refused, and the daemon serves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from sealgate.reasons import Reason

from .. import tiers
from ..errors import SandboxError
from ..guest.protocol import receive_fds
from ..host import lease, network
from . import carried
from .api import error
from .daemon import Daemon
from .events import log
from .session import Session

MAGIC = "sealgate-sandboxd-handover"
VERSION = 1
MAX_MESSAGE = 1 << 20
MAX_FDS = 8  # in one message: a slot's, or the listeners
HELLO_SECONDS = 5.0
DRAIN_SECONDS = 10.0  # for requests under way to end
TAKE_SECONDS = 120.0  # for the successor to rebuild and answer
_T = TypeVar("_T")


class HandoverError(SandboxError):
    """The hand-over could not be done; its words say why."""


def path_for(state: Path, api_socket: Path) -> Path:
    """The hand-over socket of the daemon serving `api_socket` (one per API socket: several
    daemons may share a state directory)."""
    digest = hashlib.sha256(os.fsencode(os.path.abspath(api_socket))).hexdigest()[:16]
    return state / "handover" / f"{digest}.sock"


def send(sock: socket.socket, message: Mapping[str, Any], fds: Iterable[int] = ()) -> None:
    data = json.dumps(message).encode()
    if len(data) > MAX_MESSAGE:
        raise HandoverError(f"a hand-over message of {len(data)} bytes, over {MAX_MESSAGE}")
    socket.send_fds(sock, [data], list(fds))


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One message and the descriptors it came with (the caller's to close). Raises
    HandoverError for what is not one of the protocol's (and closes what came with it)."""
    try:
        data, fds, flags = receive_fds(sock, MAX_MESSAGE, MAX_FDS)
    except TimeoutError:
        raise HandoverError("no answer in time") from None
    except OSError as exc:
        raise HandoverError(f"the hand-over socket failed: {exc.strerror}") from None
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise HandoverError("a message over the protocol's size, or too many descriptors")
        if not data:
            raise HandoverError("the other daemon closed the hand-over")
        try:
            message = json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the stack
            message = None
        if not isinstance(message, dict):
            raise HandoverError("not the hand-over protocol (a JSON object per packet)")
    except HandoverError:
        close(fds)
        raise
    return message, fds


def close(fds: Iterable[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def peer_is_root(sock: socket.socket) -> int:
    """The peer's pid; HandoverError unless it is root's."""
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                      struct.calcsize("3i")))
    if uid != 0:
        raise HandoverError(f"the peer (pid {pid}) is not root")
    return int(pid)


def differences(ours: Mapping[str, Any], theirs: Any) -> list[str]:
    if not isinstance(theirs, dict):
        return ["no settings given"]
    return [f"{key}: {ours.get(key)!r} here, {theirs.get(key)!r} there"
            for key in sorted(set(ours) | set(theirs)) if ours.get(key) != theirs.get(key)]


def refuse_while_held(daemon: Daemon) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware: while a successor takes over, every call but health is refused (503)."""

    @web.middleware
    async def held(request: web.Request,
                   handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                   ) -> web.StreamResponse:
        if daemon.held and request.path != "/v1/health":
            return error(Reason.AT_CAPACITY, "the daemon is handing its sandboxes over to its "
                                             "successor: retry in a moment")
        return await handler(request)

    return held


class Giver:
    """The old daemon's side, served beside its API; `done` is set once a successor holds
    everything, and the daemon then exits without deleting (`Daemon.relinquish`)."""

    def __init__(self, daemon: Daemon, want: Mapping[str, Any],
                 listeners: list[socket.socket]) -> None:
        self.daemon = daemon
        self.want = dict(want)
        self.listeners = listeners
        self.done = asyncio.Event()
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        old = os.umask(0o177)  # no moment when others could connect
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        sock.listen(4)
        sock.setblocking(False)
        self._sock, self._path = sock, path
        self._task = asyncio.create_task(self._serve(sock))

    async def stop(self) -> None:
        """Never raises: what stops after us (the daemon's own close, deleting or relinquishing
        every sandbox) must run whatever became of a hand-over."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception as exc:
                log("handover_failed", why=type(exc).__name__)
        if self._sock is not None:
            self._sock.close()
            if not self.done.is_set():  # else the successor's by now
                with contextlib.suppress(FileNotFoundError):
                    self._path.unlink()

    async def _serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while not self.done.is_set():  # one hand-over at a time
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:  # out of descriptors, say: the API serves on regardless
                log("handover_refused", why=f"accept: {exc.strerror or exc}")
                await asyncio.sleep(1.0)
                continue
            with conn:
                conn.setblocking(True)
                try:
                    await self._give(conn)
                except (HandoverError, OSError) as exc:
                    why = str(exc) or type(exc).__name__
                except Exception as exc:
                    why = f"a malformed hand-over ({type(exc).__name__})"
                else:
                    continue
                log("handover_refused", why=why)
                with contextlib.suppress(OSError):
                    send(conn, {"refused": why})

    async def _give(self, conn: socket.socket) -> None:
        successor = peer_is_root(conn)
        conn.settimeout(HELLO_SECONDS)
        hello, fds = await asyncio.to_thread(receive, conn)
        close(fds)
        if fds or hello.get("sealgate") != MAGIC or hello.get("version") != VERSION:
            raise HandoverError(f"not a hand-over hello of version {VERSION}")
        if diff := differences(self.want, hello.get("want")):
            raise HandoverError("settings differ: " + "; ".join(diff)[:2000])
        tier = tiers.get(self.daemon.config.slots.isolation)
        if tier.no_adopt is not None:
            raise HandoverError(f"the {tier.name} tier's sandboxes cannot change daemons: "
                                f"{tier.no_adopt}")
        running = [f"{s.id} (pids {_pids(s)})" for s in self.daemon.sessions.values()
                   if s.processes.running()]
        if running:
            raise HandoverError("background processes are running in " + ", ".join(running)
                                + ": wait for them or kill them, then hand over")
        started = time.monotonic()
        items: list[Any] = []
        self.daemon.hold()
        try:
            await self._drain()
            items = self.daemon.slots()
            conn.settimeout(TAKE_SECONDS)
            await _in_thread(conn, lambda: self._send(conn, items))
            answer, fds = await _in_thread(conn, lambda: receive(conn))
            close(fds)
            if answer.get("taken") is not True:
                raise HandoverError(f"the successor did not take them: "
                                    f"{str(answer.get('refused', answer))[:300]}")
        except BaseException:
            # Whatever ended it (a refusal, a timeout, the successor's death, our SIGTERM),
            # the leases say who holds the sandboxes: a successor that rewrote them all did
            # take them, whether or not its `taken` reached us.
            settled = False
            try:
                settled = await asyncio.to_thread(self._settle, conn, items, successor)
            finally:  # held for good, every call would be refused 503 until a restart
                if not settled:
                    self.daemon.hold(False)
            if not settled:
                raise
        log("handed_over", to=successor, sandboxes=len(self.daemon.sessions),
             slots=len(items), ms=round((time.monotonic() - started) * 1000, 1))
        self.done.set()

    async def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_SECONDS
        while busy := [s.id for s in self.daemon.sessions.values() if s.active] \
                or self.daemon.busy():
            if time.monotonic() >= deadline:
                raise HandoverError(f"still busy after {DRAIN_SECONDS:g} s: "
                                    + (", ".join(busy) if isinstance(busy, list)
                                       else "sandboxes being made"))
            await asyncio.sleep(0.02)

    def _send(self, conn: socket.socket, items: list[Any]) -> None:
        send(conn, {"offer": len(items), "pid": os.getpid()})
        for made, pidfd, pool, session in items:
            record, fds = carried.slot_record(made, pidfd, pool)
            record["session"] = None if session is None else carried.session_record(session)
            send(conn, {"slot": record}, fds)
        ended = {k: v[:100] for k, v in self.daemon.ended().items()}
        send(conn, {"end": True, "ended": ended}, [s.fileno() for s in self.listeners])

    def _settle(self, conn: socket.socket, items: list[Any], successor: int) -> bool:
        """A hand-over cut short: True if the successor holds every lease (it committed:
        the sandboxes are its), else the leases ours again and False. Decided under the
        links' lock, under which the successor commits only while our end is open: the
        shutdown first, so it cannot commit after we looked."""
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        with network.lock():
            if items and all(lease.holder(made.index) == successor for made, *_ in items):
                return True
            for made, *_ in items:
                if lease.holder(made.index) != os.getpid():
                    lease.take(made.index, self.daemon.config.slots.state,
                               str(made.link.sandbox_ip), made.group.dirs[0].name)
        return False


async def _in_thread(conn: socket.socket, work: Callable[[], _T]) -> _T:
    """`work` (blocking on `conn`) in a thread. Cancelled (SIGTERM), it shuts `conn` down, so
    the thread ends at once, and waits for it: nothing of a hand-over runs on behind us."""
    running = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            await running
        raise


def _pids(session: Session) -> str:
    return ", ".join(str(p.pid) for p in session.processes.table.values() if p.running)
