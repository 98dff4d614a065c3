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

A fork makes copies of a live sandbox the same way, each on a slot prepared there and then as
a copy of its memory (`forking` saves it), all of them or none.

Why one module of ~580 lines: the pools, the sessions, the creates and forks under way and the
hand-over's hold are one state whose invariants span these methods (a slot is in exactly one
pool, session or teardown, `busy` counts every one in between, and a create or fork under way
counts against the capacity); what stands apart has left (`slot`, `imaging`, `forking`,
`idempotency`, `tally`, `carried`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sealgate.proxy import ControlError, SourceRefused, control_socket, register_source
from sealgate.reasons import Reason

from .. import tiers
from ..errors import SandboxError
from ..guest.protocol import read_hello
from ..host.rootfs import ImageRoot
from ..images import Image, Store
from ..runtime import clean_up_stale
from . import forking, imaging, orphans, slot
from .ended import Ended
from .events import log
from .idempotency import Creates
from .session import Options, Session, SessionError
from .tally import Tally

_HELLO_SECONDS = 10.0
_REAP_SECONDS = 0.5
_ORPHAN_ROUNDS = 20  # x _REAP_SECONDS: how long to look for a sandbox's orphaned init


@dataclass(frozen=True)
class Config:
    slots: slot.SlotConfig
    pool: int = 4  # slots kept ready on the host's system directories
    max_sandboxes: int = 256
    max_ttl: float = 24 * 3600.0
    images: Path | None = None  # the image store (`sandbox.images`); None: no images
    image_pools: Mapping[str, int] = field(default_factory=dict)  # image -> slots kept ready


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.sessions: dict[str, Session] = {}
        self.ready = False
        self.problem: str | None = "starting"
        # Why the boundary is not proved yet (serve.py's self-test), or None: no sandbox is
        # created meanwhile.
        self.unverified: str | None = None
        # Ready slots by the root they were made on (`_key`: None for the host's); what each
        # pool is to hold, and its image's root.
        self._pools: dict[str | None, list[slot.Slot]] = {None: []}
        self._wanted: dict[str | None, tuple[int, ImageRoot | None]] = {None: (config.pool, None)}
        self.store = None if config.images is None else Store(config.images)
        self._preparing = 0
        self._ended = Ended()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._spawned: set[asyncio.Task[None]] = set()
        self._dismantling: set[asyncio.Task[None]] = set()
        self._inits: dict[int, int] = {}  # inits of ended sandboxes -> rounds left to reap
        self._watched: dict[int, tuple[int, slot.Slot]] = {}  # slot index -> pidfd, slot
        self._failures = 0
        self._closing = False
        self.held = False  # while a successor takes over (`hold`): nothing made, ended, taken
        # Idempotency-Key -> when, what was asked, the create (`create`)
        self._creates = Creates()  # under way, and remembered by their Idempotency-Key
        self.tally = Tally()  # what it has done, for its metrics (`admin`)

    # -- start and stop -------------------------------------------------------------------

    def plan(self) -> None:
        """The pools' images looked up: before a hand-over (`take_over`), whose sandboxes are
        ours from its commit on; a start failing on an image after it would end them all.
        Raises SandboxError for a pool of an image the store does not have."""
        for name, count in self.config.image_pools.items():
            root = imaging.image_root(self.store, self.config.slots.isolation, name, None)[1]
            self._wanted[root.key] = (count, root)
            self._pools.setdefault(root.key, [])

    async def start(self) -> None:
        """Clean up after a daemon that died, then fill the pools in the background. Raises
        SandboxError for a pool of an image the store does not have."""
        self.plan()
        self.tally.cleaned += len(await asyncio.to_thread(clean_up_stale))
        await asyncio.to_thread(forking.sweep)  # memory a daemon killed mid-fork left
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
        pools, self._pools = self._pools, {}
        await asyncio.gather(*(self._release(s) for pool in pools.values() for s in pool),
                             return_exceptions=True)
        await asyncio.gather(*self._dismantling, return_exceptions=True)

    # -- a hand-over to a successor (`sandbox.daemon.handover`) ----------------------------

    def slots(self) -> list[tuple[slot.Slot, int, str | None, Session | None]]:
        """Every live slot: its pidfd, its pool's key if it waits in one, its session if not."""
        owner = {id(s.slot): s for s in self.sessions.values()}
        pool_of = {id(s): key for key, pool in self._pools.items() for s in pool}
        return [(made, pidfd, pool_of.get(id(made)), owner.get(id(made)))
                for pidfd, made in self._watched.values()
                if id(made) in owner or id(made) in pool_of]

    def busy(self) -> int:
        """Creates and prepares under way, and slots still being taken down."""
        return self._creates.under_way + self._preparing

    def hold(self, held: bool = True) -> None:
        """Act on nothing (no refill, no expiry, no agent's death) while a successor takes the
        slots over, or again as before once it did not."""
        self.held = held
        loop = asyncio.get_running_loop()
        for pidfd, made in self._watched.values():
            if held:
                loop.remove_reader(pidfd)
            else:  # a death meanwhile is seen now
                loop.add_reader(pidfd, self._died, made)
        self._wake.set()

    def ended(self) -> dict[str, str]:
        """Ids of sandboxes that ended, and why, oldest first: handed to a successor."""
        return self._ended.items()

    def take_over(self, adopted: list[tuple[slot.Slot, int, str | None, Session | None]],
                  ended: Mapping[str, str] | None = None) -> None:
        """Serve slots a predecessor handed over: sessions as they were, pool slots in the pool
        of their key if it wants them, else taken down; and remember what ended on it."""
        for ident, why in (ended or {}).items():
            self._ended.remember(ident, why)
        for made, pidfd, key, session in adopted:
            self._watch(made, pidfd)
            pool = self._pools.get(key)
            if session is not None:
                self.sessions[session.id] = session
            elif pool is not None and len(pool) < self._wanted[key][0]:
                pool.append(made)
            else:
                self._background(self._release(made))
        self._wake.set()

    def relinquish(self) -> None:
        """Stop without ending a sandbox: a successor holds them all now. Our descriptors of
        them close (so they die with the successor, never with us nor with neither)."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        for pidfd, made in self._watched.values():
            with contextlib.suppress(ValueError):
                asyncio.get_running_loop().remove_reader(pidfd)
            os.close(pidfd)
            made.names.close()
            made.channel.close()
            made.guard.close()
        self._watched.clear()
        self.sessions.clear()
        self._pools.clear()

    @property
    def isolation(self) -> str:
        return self.config.slots.isolation

    @property
    def max_ttl(self) -> float:
        return self.config.max_ttl

    def status(self) -> dict[str, Any]:
        return {"ready": self.ready and self.unverified is None,
                "problem": self.unverified or self.problem,
                "pool": sum(len(p) for p in self._pools.values()),
                "preparing": self._preparing, "sandboxes": len(self.sessions),
                "releasing": len(self._dismantling)}

    # -- the pool -------------------------------------------------------------------------

    async def canary(self) -> slot.Slot:
        """A slot of its own for the self-test: known to no proxy, in no pool."""
        return await self._prepare()

    async def discard(self, canary: slot.Slot) -> None:
        await self._release(canary)

    async def _prepare(self, image: ImageRoot | None = None,
                       resume: Path | None = None) -> slot.Slot:
        # Counted as under way (`busy`) to its agent's hello: until it is watched, a slot is in
        # no pool and no session, where a hand-over would not see it.
        self._preparing += 1
        started = time.monotonic()
        try:
            made = await asyncio.to_thread(slot.prepare, self.config.slots, image, resume)
            await self._hello(made)
        except BaseException:
            self.tally.prepare_failures += 1
            raise
        finally:
            self._preparing -= 1
        made.init = orphans.init_of(made.process.pid)
        self._watch(made, os.pidfd_open(made.process.pid))
        self.tally.prepared(time.monotonic() - started)  # to its agent's hello
        return made

    async def _hello(self, made: slot.Slot) -> None:
        """The slot's agent says it serves, or the slot is released. Raises SandboxError."""
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

    def _watch(self, made: slot.Slot, pidfd: int) -> None:
        made.names.start(asyncio.get_running_loop())
        self._watched[made.index] = (pidfd, made)
        asyncio.get_running_loop().add_reader(pidfd, self._died, made)

    def _short(self) -> tuple[str | None, ImageRoot | None] | None:
        """The first pool short of what it is to hold, within the daemon's capacity."""
        room = self.config.max_sandboxes - len(self.sessions) - sum(
            len(p) for p in self._pools.values())
        if room <= 0 or self.held:
            return None
        for key, (count, root) in self._wanted.items():
            if len(self._pools.get(key, ())) < count:
                return key, root
        return None

    async def _fill(self) -> None:
        while not self._closing:
            short = self._short()
            if short is None:
                self.ready, self.problem = True, None
                self._wake.clear()
                await self._wake.wait()
                continue
            key, root = short
            try:
                made = await self._prepare(root)
            except SandboxError as exc:
                self._failures += 1
                self.problem = f"cannot prepare a sandbox: {exc}"
                log("pool_failed", detail=str(exc))
                await asyncio.sleep(min(30.0, 0.5 * 2 ** min(self._failures, 6)))
                continue
            self._failures = 0
            pool = self._pools.setdefault(key, [])
            if len(pool) >= self._wanted[key][0]:  # a slot came back meanwhile
                await self._release(made)
                continue
            pool.append(made)
            self.ready, self.problem = True, None

    def _died(self, dead: slot.Slot) -> None:
        """Its bubblewrap ended (the agent died, or was killed from inside)."""
        for pool in self._pools.values():
            if dead in pool:
                pool.remove(dead)
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
        watched = self._watched.pop(gone.index, None)
        if watched is not None:
            asyncio.get_running_loop().remove_reader(watched[0])
            os.close(watched[0])

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

    async def create(self, options: Options, key: str | None = None) -> Session:
        """A new sandbox; with `key` (an Idempotency-Key), the one an earlier create with the
        same key made (`Creates.once`)."""
        return await self._creates.once(
            options, key, self._room, lambda: self._create(options),
            lambda made: self._background(self.delete(made.id, "its creator left")))

    def _room(self, under_way: int) -> None:
        if len(self.sessions) + under_way >= self.config.max_sandboxes:
            raise SessionError(f"the daemon already holds {self.config.max_sandboxes} "
                               "sandboxes", reason=Reason.AT_CAPACITY)

    async def _create(self, options: Options) -> Session:
        if self._closing or self.held:
            raise SessionError("the daemon is stopping", reason=Reason.AT_CAPACITY)
        if self.unverified is not None:
            raise SessionError(f"not ready: {self.unverified}", reason=Reason.AT_CAPACITY)
        if options.ttl > self.config.max_ttl:
            raise SessionError(f"ttl over the daemon's maximum of {self.config.max_ttl:g} s",
                               reason=Reason.BAD_REQUEST)
        # Before a slot is taken: nothing to give back if it fails.
        ident = self._ended.new_id(self.sessions)
        base = root = None
        if options.image is not None:
            base, root = imaging.image_root(self.store, self.config.slots.isolation,
                                              options.image, options.sandbox)
        pool = self._pools.get(None if root is None else root.key, [])
        cold = not pool
        try:
            taken = pool.pop(0) if pool else await self._prepare(root)
        except SandboxError as exc:
            raise SessionError(str(exc), reason=Reason.SANDBOX_FAILED) from None
        self._wake.set()
        try:
            await self._admit(taken, options)
        except SessionError as exc:
            # An untouched slot goes back, unless the pool was refilled meanwhile (the refill
            # starts as soon as a slot is taken): never over its size.
            key = None if root is None else root.key
            if (exc.reason is Reason.UNKNOWN_SANDBOX and key in self._wanted
                    and len(self._pools[key]) < self._wanted[key][0]):
                self._pools[key].append(taken)
            else:
                await self._release(taken)
            raise
        session = Session(ident, taken, options)
        session.base = base
        self.sessions[ident] = session
        self.tally.create("cold" if cold else "warm")
        log("created", id=ident, sandbox=options.sandbox, address=str(taken.link.sandbox_ip),
             uid=taken.uid, warm=not cold, image=options.image)
        return session

    async def _admit(self, taken: slot.Slot, options: Options) -> None:
        """A slot made the sandbox `options` say: known to the proxy as its policy's, held
        to its limits. Raises SessionError (the caller releases the slot)."""
        await asyncio.to_thread(self._register, taken, options.sandbox)
        try:
            taken.group.apply(tiers.get(self.config.slots.isolation).host_limits(
                options.limits))
        except OSError as exc:
            raise SessionError(f"cannot set the sandbox's limits: {exc}",
                               reason=Reason.SANDBOX_FAILED) from None

    async def fork(self, ident: str, n: int) -> list[Session]:
        """`n` copies of sandbox `ident`, each resumed from one memory snapshot of it on a slot
        of its own: its own id, address and proxy registration, the source's options, a
        lifetime from now (`forking`). All of them or none. Raises SessionError."""
        source = self.get(ident)
        if self._closing or self.held:  # as a create: nothing is made while stopping or held
            raise SessionError("the daemon is stopping", reason=Reason.AT_CAPACITY)
        tier = tiers.get(self.config.slots.isolation)
        if tier.no_fork is not None or source.slot.image is None:
            why = (tier.no_fork or "a sandbox on the host's system has the host's /usr in its "
                   "guest over 9p, which QEMU cannot save: create it from an image")
            raise SessionError(f"fork needs a memory snapshot, which the {tier.name} tier "
                               f"cannot take here: {why}; snapshot the filesystem and create "
                               "from it instead", reason=Reason.UNSUPPORTED)
        if not 1 <= n <= forking.MOST:
            raise SessionError(f"'n' must be 1 to {forking.MOST}", reason=Reason.BAD_REQUEST)
        if len(self.sessions) + self._creates.under_way + n > self.config.max_sandboxes:
            raise SessionError(f"the daemon holds at most {self.config.max_sandboxes} "
                               "sandboxes", reason=Reason.AT_CAPACITY)
        # Run to its end even if its caller leaves, as a create does: what it made is deleted.
        self._creates.under_way += n
        work = asyncio.create_task(self._fork(source, n))
        work.add_done_callback(lambda _: self._forked(n))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            work.add_done_callback(self._forks_abandoned)
            raise

    def _forked(self, n: int) -> None:
        self._creates.under_way -= n

    def _forks_abandoned(self, work: asyncio.Task[list[Session]]) -> None:
        if not work.cancelled() and work.exception() is None:
            for copy in work.result():
                self._background(self.delete(copy.id, "its creator left"))

    async def _fork(self, source: Session, n: int) -> list[Session]:
        async with forking.saved(source) as memory:
            made = await asyncio.gather(*(self._prepare(source.slot.image, memory)
                                          for _ in range(n)), return_exceptions=True)
        slots = [m for m in made if isinstance(m, slot.Slot)]
        try:
            failed = [m for m in made if not isinstance(m, slot.Slot)]
            if failed:
                raise SessionError(f"a copy did not resume: {failed[0]}",
                                   reason=Reason.SANDBOX_FAILED)
            for taken in slots:
                await self._admit(taken, source.options)
        except BaseException:
            for taken in slots:
                await self._release(taken)
            raise
        copies = []
        for taken in slots:
            copy = Session(self._ended.new_id(self.sessions), taken, source.options)
            copy.base = source.base
            self.sessions[copy.id] = copy
            self.tally.create("fork")
            log("forked", id=copy.id, source=source.id, sandbox=source.options.sandbox,
                address=str(taken.link.sandbox_ip), uid=taken.uid)
            copies.append(copy)
        return copies

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
        return self._ended.find(self.sessions, ident)

    async def update(self, ident: str, *, ttl: float | None = None,
                     idle_timeout: float | None = None,
                     metadata: Mapping[str, str] | None = None,
                     sandbox: str | None = None) -> Session:
        """Change a live sandbox: its time left and idle timeout, its labels, and who it is to
        the proxy (another sandbox id of the rules: its policy from the next request on).
        Raises SessionError, and then changes nothing."""
        session = self.get(ident)
        if session.ended.is_set():
            raise SessionError(f"sandbox {ident[:64]} has ended", reason=Reason.SANDBOX_ENDED)
        if ttl is not None and ttl > self.config.max_ttl:
            raise SessionError(f"ttl over the daemon's maximum of {self.config.max_ttl:g} s",
                               reason=Reason.BAD_REQUEST)
        if sandbox is not None and sandbox != session.options.sandbox:
            await asyncio.to_thread(self._register, session.slot, sandbox)
            log("identity_changed", id=ident, sandbox=sandbox, was=session.options.sandbox)
            session.options = dataclasses.replace(session.options, sandbox=sandbox)
        if metadata is not None:
            session.options = dataclasses.replace(session.options, metadata=metadata)
        session.extend(ttl, idle_timeout)
        return session

    async def snapshot(self, ident: str, name: str | None) -> Image:
        """Sandbox `ident`'s filesystem as a new image (`imaging.snapshot`)."""
        return await imaging.snapshot(self.store, self.config.slots.isolation, self.get(ident),
                                      name, self.config.slots.disk)

    async def delete(self, ident: str, why: str = "deleted") -> None:
        session = self.get(ident)
        if session.paused:  # its processes die thawed: a frozen one could hold its teardown
            with contextlib.suppress(SessionError):
                await session.pause(False)
        # Its cgroups' counts, read while they exist and in the same step as it leaves the
        # sessions: a scrape sees it live or ended, never neither.
        self.tally.hits_final(ident, session.slot.group.limit_hits())
        del self.sessions[ident]
        session.ended.set()
        await session.processes.close()  # each one's exec ends, its status said
        self._ended.remember(ident, why)
        self._wake.set()
        await self._release(session.slot, wait=False)
        self.tally.end(why)
        log("ended", id=ident, sandbox=session.options.sandbox, why=why,
             commands=session.commands)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(_REAP_SECONDS)
            if self.held:
                continue
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

