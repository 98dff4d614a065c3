"""One sandboxed run, start to finish: `sealgate sandbox run`.

Order matters and every step is undone on the way out, whatever happened:

1. the seccomp filter is built first: on a machine without one nothing is created at all;
2. the network (namespace and link) and its firewall table; the proxy learns the sandbox's
   address through its control API (`sandbox.runtime`: what every sandbox holds, whatever runs
   it);
3. the cgroups with the run's limits (`sandbox.host.cgroup`), which the first process joins before
   it executes anything;
4. its name server (`sandbox.host.dns`) is bound on the host end of its link; the CA bundle (system
   roots plus the proxy's CA) and the sandbox's other files are handed over in memory
   (`launch.staged`), never written where the host's paths would show;
5. from an image (`sandbox.host.rootfs`), its root: the image's layers shared read-only under
   the run's own writes, on a scratch tmpfs of `disk` bytes that goes with the run; the image's
   `Env` and `WorkingDir` apply, under the proxy's variables, as in a sandboxd sandbox;
6. the command runs under its isolation tier (`sandbox.tiers`: bubblewrap, gVisor, ...), which
   is all that differs between tiers; its exit status is the run's (128 + N for signal N), or
   124 once it has run past its time limit: then it is killed with everything it started;
7. teardown: whatever is left in the cgroups is killed and they are removed, the address is
   unregistered, and the namespace deleted before its firewall table, so nothing is ever left
   in it unfiltered.

While it holds a link a run keeps a lease on it (`sandbox.host.lease`); the next run cleans up after
any whose process died without its teardown (SIGKILL, the OOM killer).

SIGINT, SIGTERM and SIGHUP end the sandbox (its PID namespace dies with it) and then the run;
during set-up they stop it at the next step, and teardown always runs to its end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from . import tiers
from .errors import SandboxError
from .guest.protocol import TIMED_OUT, over_time
from .host import scratch
from .host.cgroup import Group, Limits
from .host.dns import FakeDns
from .host.launch import NOBODY, Launch, environment, staged
from .host.network import Plan
from .host.rootfs import ImageRoot
from .host.watchdog import Watchdog
from .runtime import image_root, image_variables, prerequisites, register, take_link, trust

_STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class Run:
    sandbox: str
    command: Sequence[str]
    state: Path  # the proxy's state directory: its control socket and CA
    proxy_port: int
    transparent_port: int | None = None
    mcp_port: int | None = None  # the gateway's MCP endpoint (`--mcp-port`)
    plan: Plan = field(default_factory=Plan)
    workspace: Path | None = None
    uid: int = NOBODY
    gid: int = NOBODY
    env: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    timeout: float | None = 600.0  # seconds the command may run; None: no limit
    isolation: str = tiers.DEFAULT
    image: ImageRoot | None = None  # None: the host's system directories, read-only
    disk: int = 1 << 30  # bytes of the scratch tmpfs an image's root writes to


def run(spec: Run) -> int:
    """Run the command in a new sandbox; its exit status. Raises SandboxError."""
    if spec.uid == 0 or spec.gid == 0:
        raise SandboxError("a sandbox never runs as root (uid or gid 0)")
    tier = tiers.get(spec.isolation)
    program, proxy_ca = prerequisites(spec.state)
    with _signals() as stop:
        try:
            with contextlib.ExitStack() as undo:
                link, names = take_link(spec.plan, spec.state, spec.proxy_port,
                                        spec.transparent_port, names_kind=FakeDns, undo=undo,
                                        mcp_port=spec.mcp_port)
                stop.check()
                register(spec.sandbox, spec.state, link, undo)
                stop.check()
                if spec.image is not None:  # its root's writes: gone once its processes are
                    scratch.create(link.index, spec.uid, spec.gid, spec.disk)
                    undo.callback(scratch.remove, link.index)
                # Unwound after the cgroups' removal, which kills every process of the run.
                undo.callback(tier.clean_up, link.index)
                group = Group.create(f"run-{link.index}-{os.getpid()}",
                                     tier.host_limits(spec.limits))
                try:
                    watchdog = Watchdog(group.dirs)
                except OSError as exc:
                    group.remove()
                    raise SandboxError(f"cannot prepare the run: {exc}") from None
                # Stood down only once the groups are empty: a kill during the teardown
                # before that still has it empty them.
                undo.callback(_remove_watched, group, watchdog)
                try:
                    bundle, ca = trust(proxy_ca)
                    launch = Launch(link, spec.command, spec.proxy_port,
                                    staged(link, bundle, ca, spec.image is not None), program,
                                    spec.workspace, spec.uid, spec.gid, spec.env,
                                    limits=spec.limits, timeout=spec.timeout,
                                    mcp_port=spec.mcp_port)
                    if spec.image is not None:
                        launch = _from_image(launch, spec.image, spec, tier)
                    started = tier.start(launch, group.dirs, undo)
                except OSError as exc:
                    raise SandboxError(f"cannot prepare the run: {exc}") from None
                stop.check()
                # A tier that keeps the limit from the command's start is given its set-up's.
                code = _supervise(started, stop, names, timeout=spec.timeout,
                                  grace=tier.ready_seconds if tier.own_clock else 0.0)
        except _Stopped as exc:
            return 128 + exc.signum
    return code


def _from_image(launch: Launch, image: ImageRoot, spec: Run, tier: tiers.Tier) -> Launch:
    """The launch with `image` as its root, on the run's scratch tmpfs."""
    index = launch.link.index
    root, disk, dirs = image_root(tier, image, index, spec.uid, launch.files)
    # The image's variables reach the host's own programs of the launch too (bubblewrap's
    # setpriv): no loader variable, as for --env. The caller's --env wins over the image's.
    env = {name: value for name, value in image_variables(environment(launch), image).items()
           if not name.startswith("LD_")}
    workdir = image.workdir
    cwd = workdir if workdir.startswith("/") and spec.workspace is None else None
    return dataclasses.replace(launch, env={**env, **spec.env}, root=root, disk=disk,
                               root_dirs=dirs if disk is not None else {}, cwd=cwd,
                               image_user=image.user, image_home=image.home)


def _remove_watched(group: Group, watchdog: Watchdog) -> None:
    try:
        group.remove()
    finally:
        watchdog.stop()


def _supervise(started: tiers.Started, stop: _Stop, names: FakeDns, *,
               timeout: float | None, grace: float) -> int:
    try:
        proc = subprocess.Popen(started.argv, env=started.env, pass_fds=started.pass_fds)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"cannot start the sandbox: {exc}") from None
    stop.sandbox = proc
    if stop.signum is not None:  # arrived while it was being started
        proc.kill()
    names.start()
    try:
        code = proc.wait(None if timeout is None else timeout + grace)
    except subprocess.TimeoutExpired:
        # Its PID namespace dies with it, and teardown empties its cgroups: nothing it
        # started, in whatever session or process group, outlives it.
        proc.kill()
        proc.wait()
        stop.sandbox = None
        if timeout is not None:  # always: no bound, no expiry
            print(over_time(timeout), file=sys.stderr)
        return TIMED_OUT
    stop.sandbox = None
    if stop.signum is not None:
        return 128 + stop.signum
    return 128 - code if code < 0 else code


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


class _Stop:
    """A stop signal is only recorded, and kills the sandbox if it runs (its PID namespace
    dies with it). The set-up looks at it between steps (`check`) and unwinds from there:
    never an exception from inside a handler, which could land where an undo is not yet
    registered or cut a teardown short."""

    def __init__(self) -> None:
        self.sandbox: subprocess.Popen[bytes] | None = None
        self.signum: int | None = None

    def __call__(self, signum: int, _: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        if self.sandbox is not None:
            self.sandbox.kill()

    def check(self) -> None:
        if self.signum is not None:
            raise _Stopped(self.signum)


@contextlib.contextmanager
def _signals() -> Iterator[_Stop]:
    stop = _Stop()
    previous: dict[int, Any] = {}
    try:
        for sig in _STOP:
            previous[sig] = signal.signal(sig, stop)
        yield stop
    finally:
        # SIGINT last: a Ctrl-C then cannot leave the others ours.
        for signum in sorted(previous, key=lambda s: s == signal.SIGINT):
            signal.signal(signum, previous[signum])
