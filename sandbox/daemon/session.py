"""A live sandbox of the daemon, as the event loop sees it: its commands through its agent, and
what every request to it shares (`begin`, `send`, `end`; put and get are `transfer.py`'s).

Every request gets descriptors of its own (pipes the daemon made), handed to the agent with the
request; the output of a command flows from those pipes straight to whoever asked, with the
pipe's own back-pressure (a slow reader slows the command, never the daemon's memory). What
comes back is the sandbox's word and is bounded: a status line of at most `STATUS_MAX` bytes,
a file of at most the size it announced.

Each command's own time limit is kept inside (the agent's shim kills its tree); the daemon keeps
a backstop a little later (a workload may have killed its shim), after which it reports the
command lost. A caller that goes away mid-stream ends its command the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import socket
import time
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol
from typing import TypeVar as _PlainTypeVar

from typing_extensions import TypeVar

from sealgate.reasons import Reason

from ..errors import SandboxError
from ..guest.protocol import MAX_REQUEST, STATUS_MAX, Ending, Op, packet
from ..host.cgroup import Limits
from ..host.rootfs import ImageRoot
from ..images import Image
from . import replies
from .background import MAX_PROCESSES, STDIN_QUEUED, Background, Processes
from .pipes import feed, feed_from, pump, read_all
from .slot import Slot

_BACKSTOP = 5.0  # seconds past a command's limit before the daemon asks, then gives up
MAX_REQUESTS = 64  # at once per sandbox
MAX_KEYS = 256  # Idempotency-Keys of background starts remembered per sandbox
MAX_PATH = 4096
IO_STALL = 60.0  # seconds a file transfer may go without progress
_T = _PlainTypeVar("_T")


class SessionError(SandboxError):
    """A request to a sandbox refused; its reason says why."""

    reason = Reason.INTERNAL_ERROR  # each is raised with its own


@dataclass(frozen=True)
class Options:
    """What a caller chooses at create."""

    sandbox: str  # the id the rules name (its policy)
    limits: Limits = field(default_factory=Limits)
    env: Mapping[str, str] = field(default_factory=dict)
    ttl: float = 600.0
    idle_timeout: float = 180.0
    isolation: str = "bwrap"
    image: str | None = None  # its root's image (`sandbox.images`); None: the host's system
    metadata: Mapping[str, str] = field(default_factory=dict)  # the caller's labels


@dataclass(frozen=True)
class Command:
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    stdin: bytes = b""
    timeout: float | None = 600.0
    background: bool = False
    tty: tuple[int, int] | None = None  # rows, cols: on a terminal inside (`terminal`)


Event = tuple[str, bytes] | tuple[str, dict[str, Any]]


def check_path(path: str) -> str:
    """A path inside the workspace, as the agent will walk it; SessionError(bad_path)."""
    parts = path.split("/")
    if (not path or len(path) > MAX_PATH or path.startswith("/") or "\0" in path
            or any(p in ("", ".", "..") or len(p.encode()) > 255 for p in parts)):
        raise SessionError("a path inside the workspace: names joined by '/', none of them "
                           "'.' or '..', not absolute", reason=Reason.BAD_PATH)
    return path


class Holder(Protocol):
    """Where a session's sandbox runs, as the session needs it: a slot on this host (`slot`),
    or a pod (`sealgate.kube.backend`). The agent's channel is the same packets either way."""

    channel: socket.socket  # the daemon's end of the agent's
    environment: dict[str, str]  # what every command starts from

    @property
    def uid(self) -> int | None:
        """Who its commands run as, where the daemon knows."""

    @property
    def image(self) -> ImageRoot | None: ...
    @property
    def address(self) -> str: ...
    @property
    def upper(self) -> Path | None:
        """Where what it wrote over its image's layers is (its overlay's upper directory)."""
    def freeze(self, frozen: bool) -> None:
        """Every process of it frozen or thawed. Raises OSError or SandboxError."""
    @property
    def netns(self) -> Path | None:
        """The network namespace whose loopback is the sandbox's, which the daemon can reach;
        None: its ports are reached through the agent (`guestdial`)."""


H = TypeVar("H", bound=Holder, default=Slot)


class Session(Generic[H]):
    def __init__(self, ident: str, slot: H, options: Options) -> None:
        self.id, self.slot, self.options = ident, slot, options
        self.created, self._started = time.time(), time.monotonic()
        self.last_active = self._started
        self.active = 0
        self.commands = 0
        self.ended = asyncio.Event()
        self.paused = False
        self.processes = Processes()
        self._keys: dict[str, tuple[Command, Background]] = {}  # Idempotency-Key -> start
        self.base: Image | None = None  # the image its root is of, if any
        self._ids = itertools.count(1)
        self._loop = asyncio.get_running_loop()

    # -- lifetime -------------------------------------------------------------------------

    def expired(self, now: float) -> str | None:
        """Why the sandbox should end now ("ttl", "idle"), or None."""
        if now - self._started >= self.options.ttl:
            return "ttl"
        if self.active == 0 and now - self.last_active >= self.options.idle_timeout:
            return "idle"
        return None

    @property
    def upper(self) -> Path | None:
        """Where what it wrote over its image's layers is (its overlay's upper directory)."""
        return self.slot.upper

    @property
    def _workdir(self) -> str | None:
        """Where a command runs unless it says: the image's WorkingDir, if it names one
        (else the agent's default, /workspace)."""
        image = self.slot.image
        return image.workdir if image is not None and image.workdir not in ("", "/") else None

    def info(self) -> dict[str, Any]:
        now = time.monotonic()
        limits = self.options.limits
        return {
            "id": self.id, "sandbox": self.options.sandbox, "isolation": self.options.isolation,
            "image": self.options.image,
            "address": self.slot.address, "uid": self.slot.uid,
            "created": round(self.created, 3), "commands": self.commands,
            "running": self.active,
            "expires_in": round(max(0.0, self.options.ttl - (now - self._started)), 1),
            "idle_for": 0.0 if self.active else round(now - self.last_active, 1),
            "limits": {"pids": limits.pids, "memory": limits.memory, "cpus": limits.cpus},
            "ended": self.ended.is_set(), "paused": self.paused,
            "metadata": dict(self.options.metadata), "idle_timeout": self.options.idle_timeout,
        }

    def extend(self, ttl: float | None, idle_timeout: float | None) -> None:
        """Its time left (`ttl` seconds from now) and its idle timeout, longer or shorter."""
        now = time.monotonic()
        changes: dict[str, Any] = {}
        if ttl is not None:
            changes["ttl"] = now - self._started + ttl
        if idle_timeout is not None:
            changes["idle_timeout"] = idle_timeout
        self.options = dataclasses.replace(self.options, **changes)

    async def pause(self, paused: bool = True) -> None:
        """Freeze (or thaw) every process of the sandbox, its agent included: while paused it
        takes no request (`sandbox_paused`), and its time to live runs on."""
        if paused != self.paused:
            try:
                await asyncio.to_thread(self.slot.freeze, paused)
            except SessionError:  # a holder that cannot (`unsupported`) says so itself
                raise
            except (OSError, SandboxError) as exc:
                raise SessionError(f"cannot {'pause' if paused else 'resume'} sandbox "
                                   f"{self.id}: {exc}", reason=Reason.SANDBOX_FAILED) from None
            self.paused = paused
        self.last_active = time.monotonic()

    # -- requests -------------------------------------------------------------------------

    def start(self, command: Command, key: str | None = None) -> Background:
        """`command` in the background (`sandbox.daemon.background`): its handle at once; with
        `key` (an Idempotency-Key), the one an earlier start with that key made. Raises
        SessionError as an exec would (ended, paused, busy), or past MAX_PROCESSES."""
        if key is not None and (known := self._keys.get(key)) is not None:
            if known[0] != command:
                raise SessionError("Idempotency-Key already used for another exec",
                                   reason=Reason.BAD_REQUEST)
            return known[1]
        if self.processes.running() >= MAX_PROCESSES:
            raise SessionError(f"sandbox {self.id} already has {MAX_PROCESSES} processes in "
                               "the background", reason=Reason.SANDBOX_BUSY)
        ident = self.begin()
        # One place more than the writes it holds, for its end (None).
        stdin: asyncio.Queue[bytes | None] = asyncio.Queue(STDIN_QUEUED + 1)
        if command.stdin:
            stdin.put_nowait(command.stdin)
        events = self.run(command, (ident, stdin))
        made = self.processes.add(list(command.argv), events, stdin,
                                  lambda op, **fields: self.control(op, ident, **fields))
        if key is not None:
            self._keys[key] = (command, made)
            while len(self._keys) > MAX_KEYS:  # the oldest forgotten first
                del self._keys[next(iter(self._keys))]
        return made

    def begin(self) -> int:
        if self.ended.is_set():
            raise SessionError(f"sandbox {self.id} has ended", reason=Reason.SANDBOX_ENDED)
        if self.paused:
            raise SessionError(f"sandbox {self.id} is paused", reason=Reason.SANDBOX_PAUSED)
        if self.active >= MAX_REQUESTS:
            raise SessionError(f"sandbox {self.id} is already serving {MAX_REQUESTS} requests",
                               reason=Reason.SANDBOX_BUSY)
        self.active += 1
        return next(self._ids)

    def end(self) -> None:
        self.active -= 1
        self.last_active = time.monotonic()

    @contextlib.contextmanager
    def serving(self) -> Iterator[int]:
        """A connection to one of its ports, for as long as it lasts: activity, so the idle
        timeout waits for it, and one of the MAX_REQUESTS at once (refused, as an exec is,
        when the sandbox has ended, is paused, or is at the most); its request id."""
        ident = self.begin()
        try:
            yield ident
        finally:
            self.end()

    def send(self, op: Op, ident: int, fds: Sequence[int], **fields: Any) -> None:
        """Hand a request and its descriptors to the agent (ours are closed either way). An agent
        that does not take it (gone, or stopped from inside with its channel full) ends the
        sandbox: the daemon deletes it."""
        try:
            data = packet(op, ident, **fields)
            if len(data) > MAX_REQUEST:
                raise SessionError(f"argv, env and cwd together over {MAX_REQUEST} bytes: put "
                                   "a long script in a file", reason=Reason.TOO_LARGE)
            socket.send_fds(self.slot.channel, [data], list(fds))
        except OSError:
            self.ended.set()
            raise SessionError(f"sandbox {self.id}'s agent is gone or not reading",
                               reason=Reason.SANDBOX_ENDED) from None
        finally:
            for fd in fds:
                os.close(fd)

    def control(self, op: Op, ident: int, **fields: Any) -> None:
        """A request about a running exec (kill, signal, resize): no descriptors, no answer."""
        with contextlib.suppress(SessionError):
            self.send(op, ident, [], **fields)

    async def run(self, command: Command,
                  begun: tuple[int, asyncio.Queue[bytes | None]] | None = None
                  ) -> AsyncGenerator[Event, None]:
        """("stdout" | "stderr", bytes) as they come, then ("exit", status). `begun`: the
        request id `start` took and the queue its stdin comes from."""
        ident = self.begin() if begun is None else begun[0]
        self.commands += 1
        pipes = [os.pipe() for _ in range(4)]  # stdin, stdout, stderr, status
        ours = [pipes[0][1], pipes[1][0], pipes[2][0], pipes[3][0]]
        env = {**self.slot.environment, **self.options.env, **command.env}
        started = time.monotonic()
        finished = False
        tasks: list[asyncio.Task[None]] = []
        status_task: asyncio.Task[bytes] | None = None
        try:
            self.send(Op.EXEC, ident, [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1]],
                       argv=list(command.argv), env=env, cwd=command.cwd or self._workdir,
                       timeout=command.timeout, pids=self.options.limits.pids, tty=command.tty)
            queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(maxsize=16)
            stdin, ours[0] = ours[0], -1
            tasks.append(asyncio.create_task(
                feed(stdin, command.stdin) if begun is None else feed_from(stdin, begun[1])))
            for name, slot in (("stdout", 1), ("stderr", 2)):
                fd, ours[slot] = ours[slot], -1
                tasks.append(asyncio.create_task(pump(fd, name, queue)))
            status_fd, ours[3] = ours[3], -1
            status_task = asyncio.create_task(read_all(status_fd, STATUS_MAX))
            deadline = None if command.timeout is None else started + command.timeout + _BACKSTOP
            asked = False

            async def waiting(what: Callable[[], Awaitable[_T]]) -> tuple[bool, _T | None]:
                """`what()` within the command's limit and the backstop; past it the agent is
                asked to kill the command once, and then the wait is given up."""
                nonlocal deadline, asked
                while True:
                    wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                    try:
                        return True, await asyncio.wait_for(what(), wait)
                    except TimeoutError:
                        if asked:
                            return False, None
                        self.control(Op.KILL, ident)
                        asked = True
                        deadline = time.monotonic() + _BACKSTOP

            open_streams = 2
            while open_streams:
                got, item = await waiting(queue.get)
                if not got or item is None:
                    break
                name, data = item
                if data:
                    yield name, data
                else:
                    open_streams -= 1
            # A command may close its output and go on running: its status comes when it
            # ends, within its own limit (the shim's) and the backstop after it, as above.
            raw: bytes | None = b""
            if not open_streams:
                _, raw = await waiting(lambda: asyncio.shield(status_task))
            else:  # the backstop passed with output still open
                with contextlib.suppress(TimeoutError):
                    raw = await asyncio.wait_for(asyncio.shield(status_task), _BACKSTOP)
            status = replies.status(raw or b"")
            status["duration_ms"] = round((time.monotonic() - started) * 1000, 3)
            # Without a status the shim is gone or stuck: whatever is left of it is killed.
            finished = status.get("ending") != Ending.LOST
            yield "exit", status
        finally:
            if not finished:
                self.control(Op.KILL, ident)
            for task in (*tasks, *([status_task] if status_task else [])):
                task.cancel()
            try:
                for fd in ours:
                    if fd >= 0:
                        with contextlib.suppress(OSError):
                            os.close(fd)
            finally:
                self.end()


async def stalled(step: Awaitable[_T], what: str) -> _T:
    """One step of a transfer, which the sandbox's side (its own uid: it may stop its shim)
    must make within `IO_STALL` seconds, or the transfer fails rather than hang."""
    try:
        return await asyncio.wait_for(step, IO_STALL)
    except TimeoutError:
        raise SessionError(f"the sandbox {what} for {IO_STALL:g} s",
                           reason=Reason.SANDBOX_FAILED) from None
