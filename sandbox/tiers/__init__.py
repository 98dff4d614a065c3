"""Isolation tiers: what runs the sandbox's processes, inside a boundary every tier shares.

The runtime (`sandbox.runtime`) makes everything around a sandbox the same way whatever the
tier: its network namespace and link, the link's firewall table, its name server, its address
registered with the proxy, its cgroups. It then hands the tier a `Launch` (`sandbox.host.launch`:
the link, the command, the files the sandbox reads in place of the host's, the clean
environment, the uid, the workspace) and the cgroups, and the tier answers with the host
command that runs it (`Started`), which the runtime starts, waits for and kills. So the proxy's
guarantees never depend on the tier: every packet of every tier leaves through the same link
and meets the same table.

A tier is a module of this package defining `TIER`, a `Tier`:

- `host_limits(limits)`: the limits of the run's cgroups, given the caller's for the workload
  (a tier whose own processes count against them, or that enforces some inside, needs other
  figures on the host);
- `unavailable()`: why it cannot run on this host (a program missing, no /dev/kvm, ...), or
  None; asked before anything is made for a run, so an unusable tier costs nothing;
- `start(launch, cgroups, undo)`: the host command. It must run in `launch.link.netns`, put
  its first process in `cgroups` before anything of the sandbox runs (`launch.host_prefix`
  does both), never run the workload as root, and hand the sandbox no host path of the run's.
  What only its start needs (descriptors) goes on `undo`, which the caller unwinds once the
  command has started (sandboxd) or is over (`sandbox run`), or when the start failed;
- `clean_up(index)`: whatever it made on the host for the sandbox on link `index` that lasts
  the sandbox's life, removed once every process of the sandbox's cgroups is dead: at
  teardown (`sandbox.runtime`, `sandbox.daemon.slot`), after a start that failed, and by the next
  run after one whose process died without its teardown (`sandbox.host.lease`);
- `serve` (optional): for sandboxd's slots, the host command whose first process speaks the
  daemon's agent protocol (`sandbox.guest.protocol`'s packets) on its standard input, for a
  tier whose workload cannot run that agent itself (a microVM: no descriptor crosses into a
  guest).
  Without it the slot's command is the agent, run by `start`. `ready_seconds` bounds how long
  a slot's first process may take to say it serves (a guest's boot under emulation takes
  seconds);
- `image_owner` (optional): whether the tier runs sandboxes from an image's root
  (`sandbox.host.rootfs`, `Launch.root`), and whose the image's files must be on the host for
  the sandbox's root to change them: `"sandbox"`, its uid's (bubblewrap: idmapped layers), or
  `"root"` (gVisor: its gofer, host root, writes for it), or `"guest"`: a tier with a kernel
  of its own (the microVM) takes the image as one read-only disk of root's files
  (`Launch.disk`) and makes the sandbox's root of it inside. None: not yet;
- `no_fork`: why the tier cannot take a memory snapshot of a running sandbox (what `fork`
  resumes copies from), said to a caller who asks for one; None: it can, of a sandbox from an
  image (the microVM: `Launch.resume`).
- `own_clock`: for `sandbox run`, the tier counts the command's time limit (`Launch.timeout`)
  from the command's own start, so that a set-up of seconds (a guest's boot under emulation)
  does not eat it; the runtime's bound then waits `ready_seconds` longer before it kills the
  run. Without it the runtime's bound alone keeps the limit (a set-up of milliseconds).
- `no_adopt`: why a sandboxd slot of the tier cannot be handed to a successor daemon
  (`sandbox.daemon.handover`), or None: its processes must not die with the daemon that started
  them, only with the last one holding the slot's channel and watchdog.

Adding a tier is its module and its entry in `_TABLE`.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SandboxError
from ..host.cgroup import Limits
from ..host.launch import Launch


@dataclass(frozen=True)
class Started:
    """A host command that runs the sandbox: its exit status is the command's."""

    argv: list[str]
    env: dict[str, str]  # the host command's own environment
    pass_fds: tuple[int, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Tier:
    name: str
    unavailable: Callable[[], str | None]
    start: Callable[[Launch, Sequence[Path], contextlib.ExitStack], Started]
    clean_up: Callable[[int], None]
    host_limits: Callable[[Limits], Limits] = lambda limits: limits
    serve: Callable[[Launch, Sequence[Path], contextlib.ExitStack], Started] | None = None
    ready_seconds: float = 10.0
    image_owner: str | None = None
    no_fork: str | None = "it takes no memory snapshot"
    no_adopt: str | None = None
    own_clock: bool = False


# name -> its module in this package; None for a tier this sealgate knows of but lacks.
_TABLE: dict[str, str | None] = {
    "bwrap": "bwrap",
    "gvisor": "gvisor",
    "microvm": "microvm.tier",
}
NAMES = tuple(_TABLE)
DEFAULT = "bwrap"


def _load(name: str) -> Tier | None:
    module = _TABLE.get(name)
    if module is None:
        return None
    tier: Tier = importlib.import_module(f"{__name__}.{module}").TIER
    return tier


def available(name: str) -> str | None:
    """Why tier `name` cannot run here, or None if it can."""
    if name not in _TABLE:
        return f"no isolation tier {name[:32]!r} (there are {', '.join(NAMES)})"
    tier = _load(name)
    if tier is None:
        return f"the {name} tier is not part of this sealgate yet"
    return tier.unavailable()


def get(name: str) -> Tier:
    """Tier `name`, ready to run here. Raises SandboxError saying why not."""
    problem = available(name)
    tier = _load(name)
    if problem is not None or tier is None:
        raise SandboxError(f"isolation {name[:32]!r} is not available: {problem}")
    return tier


def clean_up(index: int) -> None:
    """What a dead run of any tier left on link `index`."""
    for name in NAMES:
        if (tier := _load(name)) is not None:
            tier.clean_up(index)
