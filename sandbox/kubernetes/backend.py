"""sandboxd on Kubernetes (`sealgate sandboxd --backend kubernetes`): the same API and the same
clients as on one host (`sandbox.daemon.api`), each sandbox an Agent Sandbox claim on a warm
pool (`claims`), driven through the agent in its pod.

**How a pod is reached: the exec API, not the pod network.** The agent runs in the pod as a
process the backend starts with `pods/exec` (`execstream`), and the daemon's packets travel
over that one stream (`guest/carry.py`). The other way, an agent listening on the pod network
with a per-sandbox key, was not taken:

- a warm pod cannot hold a per-claim key (nothing may be added to a warm pod at its claim
  without a cold start: the claim's env and volumes force one), so the key would be shared by
  the pool, or sent after the claim over a connection that needs one to be trusted;
- the sandboxes' NetworkPolicy would have to let the backend in (today: no ingress at all),
  and a listening agent is one more thing a workload in the pod can reach and stop;
- the exec API is authorized by the API server (RBAC on `pods/exec` in one namespace) and
  audited by it, and needs nothing in the pod but the agent's code.

What it costs: every byte goes through the API server and the kubelet. A command is one more
message each way on a stream already open (the stream is opened once, at create), so the
per-command cost is two hops of a cluster's network; the create pays one exec's set-up (tens of
milliseconds on a cluster, the published figures for `kubectl exec`), beside the claim itself.
There is no cluster here to measure either on (docs/kubernetes.md).

The backend keeps no pool of its own: the warm pool is the cluster's (`SandboxWarmPool`). A
sandbox id maps to a pool (`--warm-pool ID=POOL`), whose template labels its pods with that id
for the proxy's pod watcher. A claim carries a `shutdownTime` past its ttl, so a backend that
dies leaves nothing running past it. What a pod cannot do is refused with `unsupported`:
pause (no freezer reachable), snapshot and fork (no memory or filesystem snapshot), images (the
pool's template names its image).

A create's limits: its memory and CPU are the pod's (its template's resources), not the
create's, which the backend cannot change on a warm pod; its process limit is each command's
RLIMIT_NPROC, as on every tier, which counts the pod's uid across its kernel: under gVisor (the
template's RuntimeClass) that kernel is the pod's own, under runc it is the node's, where other
pods of the same uid count too (give such a pool a uid of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sealgate.reasons import Reason

from ..daemon.ended import Ended
from ..daemon.events import log
from ..daemon.idempotency import Creates
from ..daemon.session import Options, Session, SessionError
from ..guest.carry import POD_FRAME_MAX, Sender
from ..guest.carrylink import Link
from ..guest.protocol import GUEST_HEADER_MAX, read_hello
from ..host.rootfs import ImageRoot
from ..images import Image
from .claims import OWNER, Bound, ClaimError, Claims
from .execstream import ExecError, join, open_exec

# In the pod: its python3, and the agent an init container wrote (`sealgate sandbox pod-agent`).
AGENT = ("python3", "-I", "/opt/sealgate/agent.pyz")
_HELLO_SECONDS = 30.0
_REAP_SECONDS = 1.0
_SHUTDOWN_GRACE = 300  # seconds past its ttl that a claim's own shutdownTime comes


@dataclass(frozen=True)
class Config:
    namespace: str
    pools: Mapping[str, str]  # sandbox id -> the warm pool whose pods are that sandbox's
    container: str | None = None  # the pod's container the agent runs in; None: its only one
    agent: tuple[str, ...] = AGENT
    instance: str = "sandboxd"  # its claims' OWNER label: one daemon per name and namespace
    max_sandboxes: int = 256
    max_ttl: float = 24 * 3600.0
    ready_seconds: float = 180.0


@dataclass
class Pod:
    """A claimed pod, as a session holds it (`Holder`)."""

    bound: Bound
    channel: socket.socket  # the daemon's end of the packets the link carries
    environment: dict[str, str] = field(default_factory=dict)  # the pod's own is the base
    uid: int | None = None  # the pod's to say (its image, its securityContext)
    joined: asyncio.Task[None] | None = None

    @property
    def image(self) -> ImageRoot | None:
        return None

    @property
    def address(self) -> str:
        return self.bound.address

    @property
    def upper(self) -> Path | None:
        return None

    @property
    def netns(self) -> Path | None:
        return None

    def freeze(self, frozen: bool) -> None:
        raise SessionError("a Kubernetes sandbox cannot be paused (its pod's freezer is the "
                           "node's)", reason=Reason.UNSUPPORTED)


class KubeBackend:
    def __init__(self, config: Config, api: Any, ws_api: Any) -> None:
        self.config = config
        self._ws_api = ws_api
        self._claims = Claims(api, config.namespace, config.ready_seconds)
        self._sessions: dict[str, Session[Pod]] = {}
        self._ended = Ended()
        self._creates = Creates()
        self._closing = False
        self._reaper: asyncio.Task[None] | None = None
        self._spawned: set[asyncio.Task[None]] = set()

    @property
    def sessions(self) -> Mapping[str, Session[Pod]]:
        return self._sessions

    @property
    def isolation(self) -> str:
        return "kubernetes"

    @property
    def max_ttl(self) -> float:
        return self.config.max_ttl

    def status(self) -> dict[str, Any]:
        return {"ready": not self._closing, "problem": "stopping" if self._closing else None,
                "sandboxes": len(self._sessions), "creating": self._creates.under_way,
                "namespace": self.config.namespace}

    async def start(self) -> None:
        """Before the first create: delete the claims an earlier run of this daemon left (it
        was killed, or its node lost; a daemon that stops deletes its own), whose pods would
        otherwise hold their warm pool's capacity until their shutdownTime, up to a ttl and
        five minutes, with no one able to reach them (the sessions were in that run's memory)."""
        await self._claims.sweep({OWNER: self.config.instance})
        self._reaper = asyncio.create_task(self._reap())

    async def close(self) -> None:
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(self.delete(i, "daemon stopped") for i in list(self._sessions)),
                             return_exceptions=True)

    # -- sandboxes ------------------------------------------------------------------------

    async def create(self, options: Options, key: str | None = None) -> Session[Pod]:
        if self._closing:
            raise SessionError("the daemon is stopping", reason=Reason.AT_CAPACITY)
        if options.ttl > self.config.max_ttl:
            raise SessionError(f"ttl over the daemon's maximum of {self.config.max_ttl:g} s",
                               reason=Reason.BAD_REQUEST)
        if options.image is not None:
            raise SessionError("a Kubernetes sandbox's image is its warm pool's template's",
                               reason=Reason.UNSUPPORTED)
        pool = self.config.pools.get(options.sandbox)
        if pool is None:
            raise SessionError(f"no warm pool serves sandbox {options.sandbox!r} (sandboxd "
                               "--warm-pool ID=POOL)", reason=Reason.UNKNOWN_SANDBOX)
        # As on one host: a claim half made is a pod held for nothing (`Creates.once`).
        return await self._creates.once(
            options, key, self._room, lambda: self._create(options, pool),
            lambda made: self._background(made.id, "its creator left"))

    def _room(self, under_way: int) -> None:
        if len(self._sessions) + under_way >= self.config.max_sandboxes:
            raise SessionError(f"the daemon already holds {self.config.max_sandboxes} "
                               "sandboxes", reason=Reason.AT_CAPACITY)

    async def _create(self, options: Options, pool: str) -> Session[Pod]:
        ident = self._ended.new_id(self._sessions)
        shutdown = datetime.datetime.now(datetime.UTC) + datetime.timedelta(
            seconds=options.ttl + _SHUTDOWN_GRACE)
        started = time.monotonic()
        try:
            bound = await self._claims.claim(
                ident, pool, {OWNER: self.config.instance, "sealgate.dev/sandboxd-id": ident},
                shutdown, options.sandbox)
        except ClaimError as exc:
            raise SessionError(str(exc), reason=Reason.SANDBOX_FAILED) from None
        try:
            pod = await self._connect(bound)
        except BaseException:
            await self._claims.release(bound.claim)
            raise
        session: Session[Pod] = Session(ident, pod, options)
        self._sessions[ident] = session
        assert pod.joined is not None
        pod.joined.add_done_callback(lambda _: self._link_ended(ident))
        log("created", id=ident, sandbox=options.sandbox, address=bound.address,
            pod=bound.pod, claim=bound.claim, ms=round((time.monotonic() - started) * 1000))
        return session

    async def _connect(self, bound: Bound) -> Pod:
        """The agent started in the pod and serving over the exec stream. Raises
        SessionError."""
        try:
            ws = await open_exec(self._ws_api, bound.namespace, bound.pod,
                                 self.config.container, self.config.agent)
        except ExecError as exc:
            raise SessionError(str(exc), reason=Reason.SANDBOX_FAILED) from None
        ours, link = socket.socketpair()
        daemon_end, sender_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        daemon_end.setblocking(False)
        sender = Sender(sender_end, Link(link.fileno(), link.fileno(), GUEST_HEADER_MAX,
                                         POD_FRAME_MAX, sock=link))

        def serve() -> None:
            try:
                sender.run()
            finally:
                # Never a bare close: another thread may still be sending, and the number
                # would then be written into whatever reuses it (another sandbox's link).
                sender.link.close()

        threading.Thread(target=serve, name=f"carry-{bound.pod}", daemon=True).start()
        pod = Pod(bound, daemon_end)
        pod.joined = asyncio.create_task(join(ws, ours))
        loop = asyncio.get_running_loop()
        try:
            said = await asyncio.wait_for(loop.sock_recv(daemon_end, 4096), _HELLO_SECONDS)
            if read_hello(said) is not None:
                raise ValueError("not this version's agent")
        except (TimeoutError, ValueError, OSError) as exc:
            daemon_end.close()
            pod.joined.cancel()
            raise SessionError(f"the agent in pod {bound.pod} did not start: "
                               f"{exc or 'no answer'}", reason=Reason.SANDBOX_FAILED) from None
        return pod

    def _link_ended(self, ident: str) -> None:
        session = self._sessions.get(ident)
        if session is not None and not self._closing:
            session.ended.set()
            self._background(ident, "agent ended")

    def get(self, ident: str) -> Session[Pod]:
        return self._ended.find(self._sessions, ident)

    async def update(self, ident: str, *, ttl: float | None = None,
                     idle_timeout: float | None = None,
                     metadata: Mapping[str, str] | None = None,
                     sandbox: str | None = None) -> Session[Pod]:
        session = self.get(ident)
        if ttl is not None and ttl > self.config.max_ttl:
            raise SessionError(f"ttl over the daemon's maximum of {self.config.max_ttl:g} s",
                               reason=Reason.BAD_REQUEST)
        if sandbox is not None and sandbox != session.options.sandbox:
            raise SessionError("a Kubernetes sandbox is its warm pool's: its pods' label says "
                               "who it is to the proxy", reason=Reason.UNSUPPORTED)
        if ttl is not None:
            when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(
                seconds=ttl + _SHUTDOWN_GRACE)
            try:
                await self._claims.shutdown_at(session.slot.bound.claim, when)
            except ClaimError as exc:
                raise SessionError(str(exc), reason=Reason.SANDBOX_FAILED) from None
        if metadata is not None:
            session.options = dataclasses.replace(session.options, metadata=metadata)
        session.extend(ttl, idle_timeout)
        return session

    async def snapshot(self, ident: str, name: str | None) -> Image:
        self.get(ident)
        raise SessionError("a Kubernetes sandbox has no snapshot here", reason=Reason.UNSUPPORTED)

    async def fork(self, ident: str, n: int) -> list[Session[Any]]:
        self.get(ident)
        raise SessionError("a Kubernetes sandbox cannot be forked", reason=Reason.UNSUPPORTED)

    async def delete(self, ident: str, why: str = "deleted") -> None:
        session = self.get(ident)
        del self._sessions[ident]
        session.ended.set()
        await session.processes.close()
        self._ended.remember(ident, why)
        pod = session.slot
        pod.channel.close()  # the link's end: the agent in the pod ends, and its commands
        if pod.joined is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(pod.joined), 10)
            pod.joined.cancel()
        await self._claims.release(pod.bound.claim)
        log("ended", id=ident, sandbox=session.options.sandbox, why=why,
            commands=session.commands)

    def _background(self, ident: str, why: str) -> None:
        task = asyncio.create_task(self._quietly(ident, why))
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    async def _quietly(self, ident: str, why: str) -> None:
        with contextlib.suppress(SessionError):
            await self.delete(ident, why)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(_REAP_SECONDS)
            now = time.monotonic()
            for ident, session in list(self._sessions.items()):
                why = "agent ended" if session.ended.is_set() else session.expired(now)
                if why is not None:  # each apart: a pod slow to let go holds up no other
                    self._background(ident, why)

