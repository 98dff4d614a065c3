"""The microVM tier: the sandbox's processes run on their own kernel (Debian's, in a QEMU
`microvm` guest), so an escape needs a bug in that guest kernel and then one in QEMU's devices
or KVM, from a QEMU that runs as the run's uid, without capabilities, under its own seccomp
filter.

The host command is `sandbox.tiers.microvm.hostrun` (as root in the sandbox's namespace and
cgroups, `launch.host_prefix`), handed its order on a memory file: it wires the namespace's end
of the link to a tap, boots the VM on it, gives the guest the sandbox's address, the staged
files and the clean environment over the agent's channel, runs the command and exits with its
status. The guest sees the host's /usr read-only (9p), its own /etc, /proc, /dev and tmpfs, and
the workspace read-write; it holds no credential and no key (the CA bundle has certificates
only). A sandboxd slot from an image (`image_owner="guest"`) also gets the image as a read-only
erofs disk (`sandbox.images.disk`), of which the guest makes the sandbox's root
(`guest/vmroot.py`).

Limits: the guest's RAM is the workload's memory limit (up to `_MAX_GUEST_MIB`: the guest's
own kernel then refuses what is over it), the process limit applies to the command's uid inside
(RLIMIT_NPROC), and the host's cgroup bounds QEMU: the guest's RAM plus QEMU's own, QEMU's
threads, the CPU quota as given.

bubblewrap's seccomp filter is not installed in the guest: the workload's calls reach only the
guest's kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ...host.cgroup import Limits
from ...host.launch import WORKSPACE, Launch, environment, host_prefix, working_dir
from .. import Started, Tier
from ..bwrap import memfd
from . import image, vm
from .hostrun import Order

_MAX_GUEST_MIB = 2048
_QEMU_MIB = 256  # QEMU's own memory beside the guest's: its code, device state, 9p buffers
# QEMU's threads (vCPU, I/O, 9p workers) and the launcher's few processes; a sandboxd slot's
# server (`hostserve`) also runs two threads per request, at most 128 requests at once.
_QEMU_TASKS = 64 + 2 * 128 + 8
_PASSED_ENV = (vm.ACCEL_ENV, image.DIR_ENV)


def _unavailable() -> str | None:
    if vm.qemu() is None:
        return f"{vm.QEMU} is not installed (Debian package qemu-system-x86)"
    accel, why = vm.accelerator()
    if accel is None:
        return why
    if image.find() is None:
        return "no microVM guest image has been built: run scripts/microvm-image"
    return None


def _guest_mib(limits: Limits) -> int:
    return max(128, min(limits.memory >> 20, _MAX_GUEST_MIB))


def _order(launch: Launch, command: list[str], workspace: Path | None) -> Order:
    link = launch.link
    return Order(
        command=command, env=environment(launch),
        files={path: data.decode("latin-1") for path, data in launch.files.items()},
        sandbox_if=link.sandbox_if, address=f"{link.sandbox_ip}/30", gateway=str(link.host_ip),
        uid=launch.uid, gid=launch.gid, cwd=working_dir(launch),
        pids=launch.limits.pids, memory_mib=_guest_mib(launch.limits), timeout=launch.timeout,
        workspace=str(workspace) if workspace else None)


def _host_command(launch: Launch, cgroups: Sequence[Path], undo: contextlib.ExitStack,
                  module: str, order: Order) -> Started:
    fd = memfd(order.to_json(), undo)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in _PASSED_ENV if k in os.environ})
    # The launcher dies with the runtime, and QEMU with the launcher (`vm`): a runtime killed
    # outright leaves no VM running, only what the next run cleans up.
    argv = [*host_prefix(launch, cgroups), sys.executable, "-I", "-m",
            f"sealgate.sandbox.tiers.microvm.{module}", str(fd)]
    return Started(argv, env, (fd,))


def start(launch: Launch, cgroups: Sequence[Path], undo: contextlib.ExitStack) -> Started:
    return _host_command(launch, cgroups, undo, "hostrun", _image(
        launch, _order(launch, list(launch.command), launch.workspace)))


def serve(launch: Launch, cgroups: Sequence[Path], undo: contextlib.ExitStack) -> Started:
    """A sandboxd slot (`sandbox.tiers.microvm.hostserve`): its VM booted and serving the
    daemon's agent protocol. The guest's /workspace is the slot's scratch directory over 9p (so
    the daemon's `--disk` caps it, its pages count against the slot's memory, and it goes with
    the slot); the guest's RAM is fixed at its boot, before any create names its limits.
    From an image (`launch.disk`), the guest makes the sandbox's root of its disk, and its
    workspace is a tmpfs of the guest's own as large as the slot's scratch (its pages in the
    guest's memory, which the slot's cgroup caps as it does QEMU's)."""
    workspace = launch.writable.get(WORKSPACE)
    order = _image(launch, _order(launch, [], workspace))
    if launch.resume is not None:  # a copy of a saved VM (`fork`), not a boot
        order = dataclasses.replace(order, restore=str(launch.resume))
    if launch.disk is not None and workspace is not None:
        # Its own tmpfs, of the slot's: no 9p share is then mounted in the guest, which QEMU
        # could not save.
        fs = os.statvfs(workspace)
        order = dataclasses.replace(order, workspace=None,
                                    workspace_bytes=fs.f_blocks * fs.f_frsize)
    return _host_command(launch, cgroups, undo, "hostserve", order)


def _image(launch: Launch, order: Order) -> Order:
    """From an image (`launch.disk`), the guest makes the sandbox's root of its disk."""
    if launch.disk is None:
        return order
    user = list(launch.image_user) if launch.image_user else None
    return dataclasses.replace(order, disk=str(launch.disk), root_dirs=dict(launch.root_dirs),
                               user=user, home=launch.image_home or None)


def _clean_up(_: int) -> None:
    """Nothing: the bridge and tap go with the sandbox's namespace, QEMU with its cgroups."""


def _host_limits(limits: Limits) -> Limits:
    return Limits(_QEMU_TASKS, (_guest_mib(limits) + _QEMU_MIB) << 20, limits.cpus)


# A slot's first process says it serves once its guest has booted: seconds under emulation,
# several at once on a loaded host.
TIER = Tier("microvm", _unavailable, start, _clean_up, _host_limits, serve=serve,
            ready_seconds=90.0, image_owner="guest", own_clock=True,
            no_adopt="its host side (hostrun, then QEMU) runs under a parent-death signal armed "
                     "for the daemon that started it: the guest would die as that daemon exits",
            no_fork=None)
