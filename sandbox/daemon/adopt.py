"""The successor's side of a hand-over (`sandbox.daemon.handover`): at its start, a daemon takes
the live sandboxes of the one serving its API socket, or refuses to start and says why.

Whether it tries is `--adopt` (it must: no daemon to adopt from is an error), the default (it
adopts if a daemon is there, else starts afresh), or `--no-adopt` (it never does, and will not
start while a daemon serves its socket: it would take the socket from under it). Everything it
receives is checked (`sandbox.daemon.carried`) and rebuilt before it answers `taken`; the
leases are rewritten in its name under the links' lock just before, each only if it is still
the old daemon's. A refusal closes every descriptor received, so the old daemon's own copies are
the sandboxes' only holders again, and it serves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..host import lease, network
from . import carried, handover
from .daemon import Config, Daemon
from .handover import HandoverError
from .session import Session
from .slot import Slot


class Settings(Protocol):
    """What of a daemon's settings (`serve.Settings`) a hand-over depends on."""

    @property
    def config(self) -> Config: ...
    @property
    def socket(self) -> Path: ...
    @property
    def listen(self) -> tuple[str, int] | None: ...

Item = tuple[Slot, int, str | None, Session | None]  # as `Daemon.slots` gives them


@dataclass
class Taken:
    items: list[Item]
    listeners: list[socket.socket]
    predecessor: int  # its pid
    ms: float  # from hello to taken
    ended: dict[str, str]  # sandboxes that ended on the old daemon -> why (`Daemon._ended`)


def want(settings: Settings) -> dict[str, Any]:
    """What a sandbox of the daemon depends on: a successor must run with the same."""
    slots = settings.config.slots
    return {"socket": os.path.abspath(settings.socket), "state": str(slots.state),
            "proxy_port": slots.proxy_port, "transparent_port": slots.transparent_port,
            "mcp_port": slots.mcp_port,
            "range": str(slots.plan.range), "gateway": str(slots.plan.gateway),
            "uid_base": slots.uid_base, "isolation": slots.isolation,
            "images": str(settings.config.images),
            "listen": None if settings.listen is None else list(settings.listen)}


async def take_over(settings: Settings, daemon: Daemon, mode: str,
                    stopping: Callable[[], bool] = lambda: False) -> Taken | None:
    """The sandboxes of the daemon serving our API socket, or None if none does (and `mode`
    is not "must"). Raises HandoverError saying why not. `stopping`: we were told to stop
    (SIGTERM) meanwhile: we do not commit, so the old daemon keeps them."""
    path = handover.path_for(settings.config.slots.state, settings.socket)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        if mode == "must":
            raise HandoverError(f"--adopt: no daemon serves {settings.socket} (no hand-over "
                                f"socket at {path})") from None
        return None
    with sock:
        pid = handover.peer_is_root(sock)
        if mode == "never":
            raise HandoverError(f"daemon {pid} serves {settings.socket}: stop it first, or "
                                "start this one without --no-adopt to take its sandboxes over")
        started = time.monotonic()
        sock.settimeout(handover.TAKE_SECONDS)
        try:
            records, listeners, ended = await asyncio.to_thread(
                _receive, sock, want(settings), len(settings.config.slots.plan.links))
        except Exception as exc:
            raise HandoverError(f"daemon {pid} serving {settings.socket} did not hand its "
                                f"sandboxes over, and serves on: {_why(exc)}") from None
        items: list[Item] = []
        try:
            if len(listeners) != 1 + (settings.listen is not None):
                raise HandoverError(f"{len(listeners)} listening sockets handed over")
            seen: set[Any] = set()
            for n, (record, fds) in enumerate(records):
                _unique(record, seen)
                made, pidfd = carried.rebuild_slot(record, fds, settings.config.slots)
                records[n] = (record, [])  # the slot's own from here on: dropped with it
                items.append((made, pidfd, None, None))
                items[-1] = (made, pidfd, *_owner(record, made, seen))
            room = daemon.config.max_sandboxes
            if len(items) > room:
                raise HandoverError(f"{len(items)} sandboxes and ready slots, over this "
                                    f"daemon's --max-sandboxes {room}")
            await asyncio.to_thread(_commit, sock, items, pid, settings, started,
                                    stopping=stopping)
        except BaseException as exc:  # each descriptor closed once, whatever went wrong
            with contextlib.suppress(OSError):
                handover.send(sock, {"refused": _why(exc)})
            for made, pidfd, *_ in items:
                _drop(made, pidfd)
            for _, fds in records:
                handover.close(fds)
            for listener in listeners:
                listener.close()
            if not isinstance(exc, Exception):
                raise
            raise HandoverError(f"cannot take over from daemon {pid}, which serves on: "
                                f"{_why(exc)}") from None
    return Taken(items, listeners, pid, round((time.monotonic() - started) * 1000, 1), ended)


def _why(exc: BaseException) -> str:
    """Ours (HandoverError, ValueError, OSError) say why; anything else is a record we could
    not read, named by its kind: never a traceback, and never a peer's text unbounded."""
    if isinstance(exc, (HandoverError, ValueError, OSError)):
        return (str(exc) or type(exc).__name__)[:1000]
    return f"a malformed hand-over ({type(exc).__name__})"


def _unique(record: Any, seen: set[Any]) -> None:
    """A slot handed over twice would be two slots on one link, each ending it: refused."""
    if not isinstance(record, dict):
        raise ValueError("a slot's record is not a JSON object")
    index = record.get("index")
    if ("index", index) in seen:
        raise ValueError(f"slot {str(index)[:16]} handed over twice")
    seen.add(("index", index))


def _receive(sock: socket.socket, wanted: dict[str, Any], most: int
             ) -> tuple[list[tuple[Any, list[int]]], list[socket.socket], dict[str, str]]:
    handover.send(sock, {"sealgate": handover.MAGIC, "version": handover.VERSION,
                         "want": wanted})
    offer, fds = handover.receive(sock)
    handover.close(fds)
    if "refused" in offer:
        raise HandoverError(str(offer["refused"])[:1000])
    count = offer.get("offer")
    if fds or not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise HandoverError("not the hand-over protocol (no offer)")
    if count > most:  # a slot per link at most: the loop below is bounded by our plan
        raise HandoverError(f"{count} slots offered, over the {most} links of the range")
    records: list[tuple[Any, list[int]]] = []
    try:
        for _ in range(count):
            message, fds = handover.receive(sock)
            records.append((message.get("slot"), fds))
        end, last = handover.receive(sock)
        records.append((None, last))  # closed with the rest should it not do
        if end.get("end") is not True or not all(_listening(fd) for fd in last):
            raise HandoverError("not the hand-over protocol (no listeners at the end)")
        ended = carried.ended(end.get("ended"))
    except BaseException:
        for _, fds in records:
            handover.close(fds)
        raise
    records.pop()
    return records, [socket.socket(fileno=fd) for fd in last], ended


def _listening(fd: int) -> bool:
    """A listening socket, checked before anything wraps it (a wrapped one closes its
    number when dropped: the caller's close would then be a second)."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
        probe = socket.socket(fileno=fd)
        try:
            return bool(probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        finally:
            probe.detach()
    except OSError:
        return False


def _owner(record: dict[str, Any], made: Slot, seen: set[Any]
           ) -> tuple[str | None, Session | None]:
    """The pool a slot waits in, or the sandbox it is. Raises ValueError."""
    pool = record.get("pool")
    if pool is not None and not isinstance(pool, str):
        raise ValueError(f"slot {made.index}: a malformed pool key")
    data = record.get("session")
    if data is None:
        return pool, None
    session = carried.rebuild_session(data, made)
    if ("id", session.id) in seen:  # two slots for one sandbox: which would it be?
        raise ValueError(f"sandbox {session.id} handed over twice")
    seen.add(("id", session.id))
    return pool, session


def _commit(sock: socket.socket, items: list[Item], predecessor: int, settings: Settings,
            started: float, *, stopping: Callable[[], bool]) -> None:
    """The leases ours, then `taken`: from here on the sandboxes die with us. The commit is
    the leases' rewriting, all or none, under the links' lock: the old daemon decides whether
    it still holds them under that lock too (`Giver._settle`), after shutting its end down, so
    an end that is readable here (its refusal, or its close) means it gave up: no commit."""
    with network.lock():
        if stopping():
            raise HandoverError("told to stop (SIGTERM) before the hand-over was complete")
        said = select.poll()  # not select: the descriptor's number may be past 1024
        said.register(sock, select.POLLIN)
        if said.poll(0):  # its refusal, its shutdown (POLLHUP is always reported) or its close
            raise HandoverError("the old daemon gave the hand-over up")
        if time.monotonic() - started > handover.TAKE_SECONDS / 2:
            raise HandoverError("the hand-over took too long")
        for made, *_ in items:
            if lease.holder(made.index) != predecessor:
                raise HandoverError(f"slot {made.index}'s lease is no longer daemon "
                                    f"{predecessor}'s")
        written: list[tuple[int, bytes | None]] = []
        try:
            for made, *_ in items:
                was = lease.saved(made.index)
                # A lease whose write failed is unchanged (written aside, then renamed).
                lease.take(made.index, settings.config.slots.state, str(made.link.sandbox_ip),
                           made.group.dirs[0].name)
                written.append((made.index, was))
        except BaseException:  # none of them ours, not some: the old daemon's as they were
            for index, was in reversed(written):
                # Each on its own: one that cannot be is the old daemon's to take back
                # (`Giver._settle`), and must not keep the others ours.
                with contextlib.suppress(OSError):
                    lease.restore(index, was)
            raise
    with contextlib.suppress(OSError):  # a predecessor gone meanwhile has nothing to hear
        handover.send(sock, {"taken": True})


def _drop(made: Slot, pidfd: int) -> None:
    """Our descriptors of a slot we do not take, closed: it is the old daemon's alone."""
    made.channel.close()
    made.names.close()
    made.guard.close()
    os.close(pidfd)
    if isinstance(made.process, carried.Held):
        made.process.close()
