"""A slot: everything a long-lived sandbox holds on the host, made ahead of time for the pool.

A slot is a link (namespace, veth, its firewall table) leased to the daemon, its name server,
its cgroups, its scratch tmpfs and its uid (the range's base plus the link index: unique while
the link is held, so two sandboxes never share a uid's kernel limits, signals or files), and,
running in all of that, bubblewrap with the agent (`sandbox.guest.agent`) waiting for requests.
What a caller adds at create (who the sandbox is to the proxy, its limits, its environment, its
lifetime) is cheap to set on a running slot, so the pool can hold everything else warm.

`prepare` and `release` block (ip, nft, mount): the daemon runs them in threads. The parts the
event loop owns (the name server, the agent's channel) are started and stopped by the daemon.
The order of teardown is `runtime`'s: processes killed with their cgroups, then the tmpfs, then
the namespace before its table, the lease last.

A slot dies with the last holder of two descriptors, never with a parent: the agent exits at the
end of its channel, and a watchdog (`sandbox.host.watchdog`) empties the slot's cgroups at the end
of its pipe. Both are handed to a successor daemon (`sandbox.daemon.handover`) with the rest of
the slot, which parent-death signals could not follow: bubblewrap's --die-with-parent would kill
the sandbox as the daemon that started it exits, whoever holds it then.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .. import tiers
from ..errors import SandboxError
from ..guest import staging
from ..host import firewall, rootfs, scratch
from ..host.cgroup import Group, Limits
from ..host.dns import LoopDns
from ..host.launch import Launch, environment, staged
from ..host.network import Link, Plan
from ..host.watchdog import Watchdog
from ..runtime import (
    image_root,
    image_variables,
    prerequisites,
    remove_link,
    take_link,
    trust,
    unregister,
)

SECCOMP = "/run/sealgate/seccomp.bpf"  # the filter the agent installs on every command
PYTHON = "/usr/bin/python3"  # the host system's, which the sandbox sees read-only


@dataclass(frozen=True)
class SlotConfig:
    """What every slot of a daemon shares."""

    state: Path  # the proxy's state directory: its control socket and CA
    proxy_port: int
    transparent_port: int | None = None
    plan: Plan = field(default_factory=Plan)
    uid_base: int = 3_000_000
    disk: int = 1 << 30  # bytes of the scratch tmpfs
    isolation: str = tiers.DEFAULT  # every slot's tier (`sandbox.tiers`)
    mcp_port: int | None = None  # the gateway's MCP endpoint, if one serves the sandboxes

    def __post_init__(self) -> None:
        if self.uid_base < 1000 or self.uid_base + len(self.plan.links) >= 1 << 31:
            raise SandboxError(f"--uid-base {self.uid_base}: needs a free range of "
                               f"{len(self.plan.links)} uids at or above 1000")


class Process(Protocol):
    """The slot's first process (bubblewrap, runsc, ...): our child, or one a predecessor
    started (`sandbox.daemon.carried.Held`)."""

    @property
    def pid(self) -> int: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


@dataclass
class Slot:
    link: Link
    names: LoopDns
    group: Group
    uid: int
    process: Process
    channel: socket.socket  # the daemon's end of the agent's
    environment: dict[str, str]  # what every command starts from
    tier: tiers.Tier
    guard: Watchdog  # empties the cgroups once no daemon holds its pipe
    image: rootfs.ImageRoot | None = None  # None: the host's system directories, read-only
    init: int | None = None  # the PID namespace's init, once the agent has said hello

    @property
    def index(self) -> int:
        return self.link.index

    @property
    def address(self) -> str:
        return str(self.link.sandbox_ip)

    @property
    def upper(self) -> Path | None:
        return None if self.image is None else scratch.mount_point(self.index) / "upper"

    def freeze(self, frozen: bool) -> None:
        self.group.freeze(frozen)

    @property
    def netns(self) -> Path | None:
        # A tier that serves the agent's protocol itself (the microVM) runs the workload on a
        # kernel of its own: the namespace's loopback is not the sandbox's.
        return None if self.tier.serve is not None else Path("/run/netns") / self.link.netns


def prepare(config: SlotConfig, image: rootfs.ImageRoot | None = None,
            resume: Path | None = None) -> Slot:
    """A new slot with its agent started (not yet known to be serving: the daemon waits for
    its hello), its root `image`'s if given, a copy of the saved VM `resume` if given (`fork`).
    Raises SandboxError with nothing left behind."""
    if not os.access(PYTHON, os.X_OK):
        raise SandboxError(f"the agent needs {PYTHON}, the host system's Python")
    tier = tiers.get(config.isolation)
    program, proxy_ca = prerequisites(config.state)
    with contextlib.ExitStack() as undo:
        link, names = take_link(config.plan, config.state, config.proxy_port,
                                config.transparent_port, names_kind=LoopDns, undo=undo,
                                mcp_port=config.mcp_port)
        uid = config.uid_base + link.index
        undo.callback(tier.clean_up, link.index)  # after the cgroups' removal kills the slot
        group = Group.create(f"run-{link.index}-{os.getpid()}", tier.host_limits(Limits()))
        undo.callback(group.remove)
        try:
            guard = Watchdog(group.dirs)
        except OSError as exc:
            raise SandboxError(f"cannot start the sandbox's watchdog: {exc}") from None
        undo.callback(guard.stop)
        places = scratch.create(link.index, uid, uid, config.disk)
        undo.callback(scratch.remove, link.index)
        bundle, ca = trust(proxy_ca)
        files = {**staged(link, bundle, ca, image is not None), **staging.agent_files(),
                 SECCOMP: program}
        command = [PYTHON, "-I", "-S", staging.AGENT, "--seccomp", SECCOMP]
        root = disk = None
        dirs: dict[str, int] = {}
        if image is not None:
            root, disk, dirs = image_root(tier, image, link.index, uid, files)
            if root is not None:
                # What it writes, /workspace and its home included, is its overlay's: one
                # cap, and all of it in a snapshot.
                places = {}
                command = [*_host_python(), "-I", "-S", staging.AGENT, "--seccomp", SECCOMP,
                           "--hide", rootfs.HOST]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        undo.callback(ours.close)
        try:
            with contextlib.ExitStack() as handed:  # the descriptors only the child keeps
                handed.callback(theirs.close)
                launch = Launch(link, command, config.proxy_port, files, program, None, uid, uid,
                                {}, writable=places, agent=True, root=root, disk=disk,
                                root_dirs=dirs if disk is not None else {},
                                image_user=None if image is None else image.user,
                                image_home="" if image is None else image.home,
                                mcp_port=config.mcp_port, resume=resume)
                # A tier whose workload cannot run the agent serves its protocol itself.
                started = (tier.serve or tier.start)(launch, group.dirs, handed)
                # Whatever a tier's parent-death signal follows (the thread that forked it, for
                # gVisor and the microVM), the channel and the watchdog end the slot with the
                # last daemon holding it.
                process = subprocess.Popen(  # the agent's channel is its stdin
                    started.argv, env=started.env, stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, pass_fds=started.pass_fds)
        except OSError as exc:
            raise SandboxError(f"cannot start the sandbox: {exc}") from None
        undo.pop_all()
    ours.setblocking(False)
    return Slot(link, names, group, uid, process, ours, _environment(launch, image), tier,
                guard, image)


def _host_python() -> list[str]:
    """The host's Python, run in an image's root from where the host's /usr is bound
    (`rootfs.HOST`) by its own ELF interpreter, with the host's libraries only."""
    interpreter, python = rootfs.loader()
    return [rootfs.HOST + interpreter, "--inhibit-cache", "--library-path",
            rootfs.HOST + os.path.dirname(interpreter), rootfs.HOST + python]


def _environment(launch: Launch, image: rootfs.ImageRoot | None) -> dict[str, str]:
    """What every command starts from: ours, and over an image its `Env` (its PATH first
    among them), under the variables that keep the proxy and its CA in force. The agent
    itself never runs with the image's variables (an LD_PRELOAD of the image's)."""
    ours = environment(launch)
    if image is None:
        return ours
    env = {k: v for k, v in ours.items() if k != "NPM_CONFIG_PREFIX"}  # its root is writable
    return {**env, **image_variables(ours, image)}


def release(slot: Slot, config: SlotConfig) -> None:
    """Everything of the slot, gone (the name server and channel are closed first, on the
    loop). Never raises: what cannot be removed is left for the next start's clean-up."""
    end(slot, config)
    dismantle(slot)


def end(slot: Slot, config: SlotConfig) -> None:
    """What makes the sandbox over: every process of it dead and its address no longer anyone's
    at the proxy. What is left (`dismantle`) can act for no one."""
    _kill(slot.process)
    # bubblewrap itself is in the groups: it must have reaped the sandbox's init before the
    # groups are emptied, or that init is orphaned to the host's pid 1 as a zombie.
    with contextlib.suppress(subprocess.TimeoutExpired):
        slot.process.wait(10)
    slot.group.kill()
    slot.guard.stop()  # once the groups are empty: a kill before that still has it empty them
    unregister(config.state, str(slot.link.sandbox_ip))


def dismantle(slot: Slot) -> None:
    """The rest, after `end`: cgroups, tmpfs, namespace, link, table and, last, the lease (so
    the index is not taken again before all of it is gone)."""
    slot.group.remove()
    slot.tier.clean_up(slot.index)
    scratch.remove(slot.index)
    remove_link(slot.index, firewall.table_name(slot.link))


def _kill(bwrap: Process) -> None:
    """End the sandbox: the init of its PID namespace (bubblewrap's child), so that every
    process of the namespace dies with it and bubblewrap, still alive, reaps it and exits.
    Killing bubblewrap first would orphan that init to the host's pid 1, which is not always
    one that reaps (a container's or a VM's minimal init): a zombie per sandbox, for good."""
    try:
        children = Path(f"/proc/{bwrap.pid}/task/{bwrap.pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(child), signal.SIGKILL)
    try:
        bwrap.wait(2 if children else 0)
    except subprocess.TimeoutExpired:
        bwrap.kill()

