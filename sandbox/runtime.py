"""One sandboxed run, start to finish: `sealgate sandbox run`.

Order matters and every step is undone on the way out, whatever happened:

1. the seccomp filter is built first: on a machine without one nothing is created at all;
2. the network (namespace and link) and its firewall table; the proxy learns the sandbox's
   address through its control API, which is how it knows whose requests these are (no proxy
   password needs to be inside the sandbox);
3. the cgroups with the run's limits (`sandbox.cgroup`), which the first process joins before
   it executes anything;
4. its name server (`sandbox.dns`) is bound on the host end of its link; the CA bundle (system
   roots plus the proxy's CA) and the sandbox's other files are handed over in memory
   (`launch.staged`), never written where the host's paths would show;
5. the command runs under its isolation tier (`sandbox.tiers`: bubblewrap, gVisor, ...), which
   is all that differs between tiers; its exit status is the run's (128 + N for signal N), or
   124 once it has run past its time limit: then it is killed with everything it started;
6. teardown: whatever is left in the cgroups is killed and they are removed, the address is
   unregistered, and the namespace deleted before its firewall table, so nothing is ever left
   in it unfiltered.

While it holds a link a run keeps a lease on it (`sandbox.lease`); the next run cleans up after
any whose process died without its teardown (SIGKILL, the OOM killer).

SIGINT, SIGTERM and SIGHUP end the sandbox (its PID namespace dies with it) and then the run;
during set-up they stop it at the next step, and teardown always runs to its end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from sealgate.proxy import (
    ControlError,
    SourceRefused,
    ca_bundle_path,
    control_socket,
    register_source,
    unregister_source,
)

from . import firewall, lease, network, scratch, seccomp, tiers
from .cgroup import CgroupError, Group, Limits
from .dns import FakeDns, LoopDns
from .errors import SandboxError
from .launch import NOBODY, Launch, staged
from .network import Link, Plan
from .watchdog import Watchdog

SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
_STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TIMED_OUT = 124  # as timeout(1) says it
_N = TypeVar("_N", FakeDns, LoopDns)


@dataclass(frozen=True)
class Run:
    sandbox: str
    command: Sequence[str]
    state: Path  # the proxy's state directory: its control socket and CA
    proxy_port: int
    transparent_port: int | None = None
    plan: Plan = field(default_factory=Plan)
    workspace: Path | None = None
    uid: int = NOBODY
    gid: int = NOBODY
    env: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    timeout: float | None = 600.0  # seconds the command may run; None: no limit
    isolation: str = tiers.DEFAULT


def setup(plan: Plan) -> None:
    """What every sandbox shares, once per host: the gateway address and its guard table.
    The proxy's listeners on the gateway need this before they can bind."""
    network.ensure_gateway(plan)
    firewall.load(firewall.shared_rules(plan), replace=firewall.shared_table(plan))


def teardown(plan: Plan) -> None:
    firewall.remove(firewall.shared_table(plan))
    network.remove_gateway(plan)


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
                                        spec.transparent_port, names_kind=FakeDns, undo=undo)
                stop.check()
                _register(spec, link, undo)
                stop.check()
                # Unwound after the cgroups' removal, which kills every process of the run.
                undo.callback(tier.clean_up, link.index)
                try:
                    group = Group.create(f"run-{link.index}-{os.getpid()}",
                                         tier.host_limits(spec.limits))
                except CgroupError as exc:
                    raise SandboxError(str(exc)) from None
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
                                    staged(link, bundle, ca), program, spec.workspace, spec.uid,
                                    spec.gid, spec.env, limits=spec.limits)
                    started = tier.start(launch, group.dirs, undo)
                except OSError as exc:
                    raise SandboxError(f"cannot prepare the run: {exc}") from None
                stop.check()
                code = _supervise(started, stop, names, timeout=spec.timeout)
        except _Stopped as exc:
            return 128 + exc.signum
    return code


def _remove_watched(group: Group, watchdog: Watchdog) -> None:
    try:
        group.remove()
    finally:
        watchdog.stop()


def prerequisites(state: Path) -> tuple[bytes, Path]:
    """The seccomp filter and the proxy's CA, before anything is created: on a machine without
    a filter, or with the wrong state directory, nothing is."""
    try:
        program = seccomp.program()
    except seccomp.SeccompUnsupported as exc:
        raise SandboxError(str(exc)) from None
    proxy_ca = ca_bundle_path(state)
    if not proxy_ca.is_file():
        raise SandboxError(f"no proxy CA at {proxy_ca}: is the proxy's state directory right?")
    return program, proxy_ca


def take_link(
    plan: Plan, state: Path, proxy_port: int, transparent_port: int | None, *,
    names_kind: type[_N], undo: contextlib.ExitStack,
) -> tuple[Link, _N]:
    """A link, its name server and its firewall table, taken under the links' lock (after
    cleaning up whatever runs that died left) and leased to this process; `undo` removes
    them."""
    if not firewall.exists(firewall.shared_table(plan)):
        raise SandboxError("the sandbox gateway is not set up: run 'sealgate sandbox setup'")
    try:
        with network.lock():
            for left in lease.stale():
                clean_up_after(left)
            link = network.free(plan)
            table = firewall.table_name(link)
            # Leased before any of it exists: a run killed at whatever instant after this
            # leaves a stale lease, so the next run cleans up what it had built (a namespace
            # built first was lost for good, and its index with it, when the kill came between).
            lease.take(link.index, state, str(link.sandbox_ip))
            undo.callback(remove_link, link.index, table)
            network.build(link)
            try:
                names = names_kind(link.host_ip, link.host_ip)
            except OSError as exc:
                raise SandboxError(f"cannot start the sandbox's name server: {exc}") from None
            undo.callback(names.close)
            rules = firewall.sandbox_rules(link, [proxy_port], transparent_port, names.port)
            firewall.load(rules, replace=table)
    except (network.NetworkError, firewall.FirewallError) as exc:
        raise SandboxError(str(exc)) from None
    return link, names


def clean_up_stale() -> list[lease.Lease]:
    """Clean up after every run or daemon that died holding links; the leases it found."""
    with network.lock():
        found = lease.stale()
        for left in found:
            clean_up_after(left)
    return found


def remove_link(index: int, table: str) -> None:
    # The namespace first, then its table: nothing is ever left in it unfiltered. The lease
    # goes last, once nothing of the run is left: until then the index is not free
    # (`network._exists`), so no lock is needed here.
    try:
        network.destroy(index)
    finally:
        firewall.remove(table)
    lease.release(index)


def clean_up_after(left: lease.Lease) -> None:
    """Everything a run that died without its teardown left: its cgroups (and any process in
    them), its registration with the proxy, its link, namespace and table."""
    Group.left_by(f"run-{left.index}-{left.pid}").remove()
    tiers.clean_up(left.index)
    scratch.remove(left.index)
    if left.state:
        unregister(Path(left.state), left.address)
    remove_link(left.index, firewall.table_name_for(left.index))


def _register(spec: Run, link: Link, undo: contextlib.ExitStack) -> None:
    try:
        register_source(control_socket(spec.state), link.sandbox_ip, spec.sandbox)
    except SourceRefused as exc:
        raise SandboxError(f"the proxy refused sandbox {spec.sandbox!r}: {exc.reason}: "
                           f"{exc.detail}") from None
    except ControlError as exc:
        raise SandboxError(f"{exc}: is the proxy running with --state {spec.state}?") from None
    undo.callback(unregister, spec.state, str(link.sandbox_ip))


def unregister(state: Path, address: str) -> None:
    with contextlib.suppress(ControlError):
        unregister_source(control_socket(state), address)


def trust(proxy_ca: Path) -> tuple[bytes, bytes]:
    """System roots plus the proxy's CA, and the CA alone: copies for the sandbox (the proxy's
    state directory is closed to it)."""
    ca = proxy_ca.read_bytes()
    roots = SYSTEM_BUNDLE.read_bytes() if SYSTEM_BUNDLE.is_file() else b""
    return roots.rstrip(b"\n") + b"\n" + ca, ca


def _supervise(started: tiers.Started, stop: _Stop, names: FakeDns, *,
               timeout: float | None) -> int:
    try:
        proc = subprocess.Popen(started.argv, env=started.env, pass_fds=started.pass_fds)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"cannot start the sandbox: {exc}") from None
    stop.sandbox = proc
    if stop.signum is not None:  # arrived while it was being started
        proc.kill()
    names.start()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        # Its PID namespace dies with it, and teardown empties its cgroups: nothing it
        # started, in whatever session or process group, outlives it.
        proc.kill()
        proc.wait()
        stop.sandbox = None
        print(f"sealgate: the command ran past its time limit ({timeout:g} s) and was killed",
              file=sys.stderr)
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
