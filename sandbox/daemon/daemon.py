"""`sealgate sandboxd`'s core: live sandboxes, the warm pool behind them, and their lifetimes.

A create takes a prepared slot from the pool (`sandbox.daemon.slot`: everything but who the sandbox
is), tells the proxy whose address it now is, sets the caller's limits on its cgroups, and
returns; the pool is refilled behind it, one slot at a time. With the pool empty, the slot is
prepared there and then (a cold create). A slot is used once: deleting a sandbox removes all of
it (processes, tmpfs, registration, namespace, table, lease), and the next sandbox gets a new
one, so nothing of one sandbox's can be found by the next.

Sandboxes end when deleted, at their time to live, after their idle timeout (no request
running, none for that long), or when their agent dies; an id that ended is remembered for a
while so a caller learns why (`sandbox_ended`) rather than that it never was.

Everything the daemon holds is leased in its name (`sandbox.host.lease`); a daemon that was killed
outright leaves leases the next start cleans up before it prepares anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import sys
import time
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from sealgate.proxy import ControlError, SourceRefused, control_socket, register_source
from sealgate.reasons import Reason

from .. import tiers
from ..errors import SandboxError
from ..guest.protocol import read_hello
from ..runtime import clean_up_stale
from . import orphans, slot
from .session import Options, Session, SessionError

_HELLO_SECONDS = 10.0
_ENDED_KEPT = 4096
_REAP_SECONDS = 0.5
_ORPHAN_ROUNDS = 20  # x _REAP_SECONDS: how long to look for a sandbox's orphaned init


@dataclass(frozen=True)
class Config:
    slots: slot.SlotConfig
    pool: int = 4  # slots kept ready
    max_sandboxes: int = 256
    max_ttl: float = 24 * 3600.0


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.sessions: dict[str, Session] = {}
        self.ready = False
        self.problem: str | None = "starting"
        # Why the boundary is not proved yet (serve.py's self-test), or None: no sandbox is
        # created meanwhile.
        self.unverified: str | None = None
        self._pool: list[slot.Slot] = []
        self._preparing = 0
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._spawned: set[asyncio.Task[None]] = set()
        self._dismantling: set[asyncio.Task[None]] = set()
        self._creating = 0
        self._inits: dict[int, int] = {}  # inits of ended sandboxes -> rounds left to reap
        self._watched: dict[int, int] = {}  # slot index -> pidfd of its sandbox
        self._failures = 0
        self._closing = False

    # -- start and stop -------------------------------------------------------------------

    async def start(self) -> None:
        """Clean up after a daemon that died, then fill the pool in the background."""
        await asyncio.to_thread(clean_up_stale)
        orphans.become_subreaper()
        self._tasks = [asyncio.create_task(self._fill()), asyncio.create_task(self._reap())]

    async def close(self) -> None:
        self._closing = True
        self.ready = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.gather(*(self.delete(i, "daemon stopped") for i in list(self.sessions)),
                             return_exceptions=True)
        pool, self._pool = self._pool, []
        await asyncio.gather(*(self._release(s) for s in pool), return_exceptions=True)
        await asyncio.gather(*self._dismantling, return_exceptions=True)

    def status(self) -> dict[str, Any]:
        return {"ready": self.ready and self.unverified is None,
                "problem": self.unverified or self.problem,
                "pool": len(self._pool),
                "preparing": self._preparing, "sandboxes": len(self.sessions),
                "releasing": len(self._dismantling)}

    # -- the pool -------------------------------------------------------------------------

    async def canary(self) -> slot.Slot:
        """A slot of its own for the self-test: known to no proxy, in no pool."""
        return await self._prepare()

    async def discard(self, canary: slot.Slot) -> None:
        await self._release(canary)

    async def _prepare(self) -> slot.Slot:
        self._preparing += 1
        try:
            made = await asyncio.to_thread(slot.prepare, self.config.slots)
        finally:
            self._preparing -= 1
        loop = asyncio.get_running_loop()
        try:
            hello = await asyncio.wait_for(loop.sock_recv(made.channel, 4096),
                                           max(_HELLO_SECONDS, made.tier.ready_seconds))
            if (why := read_hello(hello)) is not None:
                # A tier that serves the protocol itself (`Tier.serve`) says why it failed.
                raise SandboxError(why or "the sandbox's agent did not start (is "
                                          "/usr/bin/python3 the host system's Python 3?)")
        except (TimeoutError, ValueError, OSError) as exc:
            await self._release(made)
            raise SandboxError(f"the sandbox's agent did not start: {exc or 'no answer'}") \
                from None
        except BaseException:
            await self._release(made)
            raise
        made.init = orphans.init_of(made.process.pid)
        made.names.start(loop)
        pidfd = os.pidfd_open(made.process.pid)
        self._watched[made.index] = pidfd
        loop.add_reader(pidfd, self._died, made)
        return made

    async def _fill(self) -> None:
        while not self._closing:
            want = min(self.config.pool,
                       self.config.max_sandboxes - len(self.sessions)) - len(self._pool)
            if want <= 0:
                self.ready, self.problem = True, None
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                made = await self._prepare()
            except SandboxError as exc:
                self._failures += 1
                self.problem = f"cannot prepare a sandbox: {exc}"
                _log("pool_failed", detail=str(exc))
                await asyncio.sleep(min(30.0, 0.5 * 2 ** min(self._failures, 6)))
                continue
            self._failures = 0
            if len(self._pool) >= self.config.pool:  # a slot came back meanwhile
                await self._release(made)
                continue
            self._pool.append(made)
            self.ready, self.problem = True, None

    def _died(self, dead: slot.Slot) -> None:
        """Its bubblewrap ended (the agent died, or was killed from inside)."""
        if dead in self._pool:
            self._pool.remove(dead)
            self._background(self._release(dead))
            self._wake.set()
            return
        for ident, session in self.sessions.items():
            if session.slot is dead:
                session.ended.set()
                self._background(self.delete(ident, "agent ended"))
                return
        self._unwatch(dead)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(_quietly(work))
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    def _unwatch(self, gone: slot.Slot) -> None:
        pidfd = self._watched.pop(gone.index, None)
        if pidfd is not None:
            asyncio.get_running_loop().remove_reader(pidfd)
            os.close(pidfd)

    async def _release(self, gone: slot.Slot, *, wait: bool = True) -> None:
        """Release a slot; without `wait`, return once the sandbox is over (`slot.end`) and
        take the rest down behind (`status()["releasing"]` counts them)."""
        self._unwatch(gone)
        gone.names.close()
        gone.channel.close()
        if gone.init is not None:  # it may come to us (`sandbox.daemon.orphans`)
            self._inits[gone.init] = _ORPHAN_ROUNDS
        if wait:
            await asyncio.to_thread(slot.release, gone, self.config.slots)
            return
        await asyncio.to_thread(slot.end, gone, self.config.slots)
        task = asyncio.create_task(asyncio.to_thread(slot.dismantle, gone))
        self._dismantling.add(task)
        task.add_done_callback(self._dismantling.discard)

    # -- sandboxes ------------------------------------------------------------------------

    async def create(self, options: Options) -> Session:
        # Creates under way count: concurrent cold ones all wait on a prepare.
        if len(self.sessions) + self._creating >= self.config.max_sandboxes:
            raise SessionError(f"the daemon already holds {self.config.max_sandboxes} "
                               "sandboxes", reason=Reason.AT_CAPACITY)
        self._creating += 1
        # A create runs to its end even when its caller leaves (aiohttp then cancels the
        # handler, a client past its call_timeout among others): a slot being made in a thread
        # cannot be stopped halfway, and one cancelled there was never released (its link,
        # namespace, table and agent held until the daemon stopped). What it made is deleted.
        work = asyncio.create_task(self._create(options))
        work.add_done_callback(self._created)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            work.add_done_callback(self._abandoned)
            raise

    def _created(self, _: asyncio.Task[Session]) -> None:
        self._creating -= 1

    def _abandoned(self, work: asyncio.Task[Session]) -> None:
        if not work.cancelled() and work.exception() is None:
            self._background(self.delete(work.result().id, "its creator left"))

    async def _create(self, options: Options) -> Session:
        if self._closing:
            raise SessionError("the daemon is stopping", reason=Reason.AT_CAPACITY)
        if self.unverified is not None:
            raise SessionError(f"not ready: {self.unverified}", reason=Reason.AT_CAPACITY)
        if options.ttl > self.config.max_ttl:
            raise SessionError(f"ttl over the daemon's maximum of {self.config.max_ttl:g} s",
                               reason=Reason.BAD_REQUEST)
        cold = not self._pool
        try:
            taken = self._pool.pop(0) if self._pool else await self._prepare()
        except SandboxError as exc:
            raise SessionError(str(exc), reason=Reason.SANDBOX_FAILED) from None
        self._wake.set()
        try:
            await asyncio.to_thread(self._register, taken, options.sandbox)
            taken.group.apply(tiers.get(self.config.slots.isolation).host_limits(
                options.limits))
        except SessionError as exc:
            # An untouched slot goes back, unless the pool was refilled meanwhile (the refill
            # starts as soon as a slot is taken): never over its size.
            if exc.reason is Reason.UNKNOWN_SANDBOX and len(self._pool) < self.config.pool:
                self._pool.append(taken)
            else:
                await self._release(taken)
            raise
        except OSError as exc:
            await self._release(taken)
            raise SessionError(f"cannot set the sandbox's limits: {exc}",
                               reason=Reason.SANDBOX_FAILED) from None
        ident = "sb-" + secrets.token_hex(8)
        session = Session(ident, taken, options)
        self.sessions[ident] = session
        _log("created", id=ident, sandbox=options.sandbox, address=str(taken.link.sandbox_ip),
             uid=taken.uid, warm=not cold)
        return session

    def _register(self, taken: slot.Slot, sandbox: str) -> None:
        try:
            register_source(control_socket(self.config.slots.state), taken.link.sandbox_ip,
                            sandbox)
        except SourceRefused as exc:
            raise SessionError(f"the proxy refused sandbox {sandbox[:64]!r}: {exc.detail}",
                               reason=exc.reason) from None
        except ControlError as exc:
            raise SessionError(f"{exc}: is the proxy running with --state "
                               f"{self.config.slots.state}?",
                               reason=Reason.REGISTRY_UNAVAILABLE) from None

    def get(self, ident: str) -> Session:
        session = self.sessions.get(ident)
        if session is not None:
            return session
        why = self._ended.get(ident)
        if why is not None:
            raise SessionError(f"sandbox {ident[:64]} has ended ({why})",
                               reason=Reason.SANDBOX_ENDED)
        raise SessionError(f"no sandbox {ident[:64]!r}", reason=Reason.NO_SUCH_SANDBOX)

    async def delete(self, ident: str, why: str = "deleted") -> None:
        session = self.get(ident)
        del self.sessions[ident]
        session.ended.set()
        self._ended[ident] = why
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)
        self._wake.set()
        await self._release(session.slot, wait=False)
        _log("ended", id=ident, sandbox=session.options.sandbox, why=why,
             commands=session.commands)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(_REAP_SECONDS)
            slots = self.config.slots
            uids = range(slots.uid_base, slots.uid_base + len(slots.plan.links))
            for pid, rounds in list(self._inits.items()):
                if orphans.reap(pid, uids) or rounds <= 1:
                    del self._inits[pid]
                else:
                    self._inits[pid] = rounds - 1
            now = time.monotonic()
            for ident, session in list(self.sessions.items()):
                why = "agent not answering" if session.ended.is_set() else session.expired(now)
                if why is not None:
                    with contextlib.suppress(SessionError):
                        await self.delete(ident, why)


async def _quietly(work: Coroutine[Any, Any, None]) -> None:
    with contextlib.suppress(SessionError):  # already ended by another way
        await work


def _log(event: str, **fields: Any) -> None:
    """One JSON line per lifecycle event, on stdout (what an operator's collector reads)."""
    line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields})
    with contextlib.suppress(OSError):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
