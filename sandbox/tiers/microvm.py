"""The microVM tier: the sandbox's processes run on their own kernel (Debian's, in a QEMU
`microvm` guest), so an escape needs a bug in that guest kernel and then one in QEMU's devices
or KVM, from a QEMU that runs as the run's uid, without capabilities, under its own seccomp
filter.

The host command is `sandbox.microvm.hostrun` (as root in the sandbox's namespace and cgroups,
`launch.host_prefix`), handed its order on a memory file: it wires the namespace's end of the
link to a tap, boots the VM on it, gives the guest the sandbox's address, the staged files and
the clean environment over the agent's channel, runs the command and exits with its status. The
guest sees the host's /usr read-only (9p), its own /etc, /proc, /dev and tmpfs, and the
workspace read-write; it holds no credential and no key (the CA bundle has certificates only).

Limits: the guest's RAM is the workload's memory limit (up to `_MAX_GUEST_MIB`: the guest's
own kernel then refuses what is over it), the process limit applies to the command's uid inside
(RLIMIT_NPROC), and the host's cgroup bounds QEMU: the guest's RAM plus QEMU's own, QEMU's
threads, the CPU quota as given.

bubblewrap's seccomp filter is not installed in the guest: the workload's calls reach only the
guest's kernel.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sealgate.sandbox.cgroup import Limits
from sealgate.sandbox.launch import HOME, WORKSPACE, Launch, environment, host_prefix, tool
from sealgate.sandbox.microvm import image, vm
from sealgate.sandbox.microvm.hostrun import Order
from sealgate.sandbox.tiers import Started, Tier
from sealgate.sandbox.tiers.bwrap import memfd

_MAX_GUEST_MIB = 2048
_QEMU_MIB = 256  # QEMU's own memory beside the guest's: its code, device state, 9p buffers
_QEMU_TASKS = 64  # its threads (vCPU, I/O, 9p workers) and the launcher's few processes
_PASSED_ENV = (vm.ACCEL_ENV, "SEALGATE_MICROVM_DIR")


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


def start(launch: Launch, cgroups: Sequence[Path], undo: contextlib.ExitStack) -> Started:
    link = launch.link
    order = Order(
        command=list(launch.command), env=environment(launch),
        files={path: data.decode("latin-1") for path, data in launch.files.items()},
        sandbox_if=link.sandbox_if, address=f"{link.sandbox_ip}/30", gateway=str(link.host_ip),
        uid=launch.uid, gid=launch.gid, cwd=WORKSPACE if launch.workspace else HOME,
        pids=launch.limits.pids, memory_mib=_guest_mib(launch.limits),
        workspace=str(launch.workspace) if launch.workspace else None)
    fd = memfd(order.to_json(), undo)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in _PASSED_ENV if k in os.environ})
    # The launcher dies with the runtime, and QEMU with the launcher (`vm`): a runtime killed
    # outright leaves no VM running, only what the next run cleans up.
    argv = [*host_prefix(launch, cgroups), tool("setpriv"), "--pdeathsig=KILL", "--",
            sys.executable, "-I", "-m", "sealgate.sandbox.microvm.hostrun", str(fd)]
    return Started(argv, env, (fd,))


def _clean_up(_: int) -> None:
    """Nothing: the bridge and tap go with the sandbox's namespace, QEMU with its cgroups."""


def _host_limits(limits: Limits) -> Limits:
    return Limits(_QEMU_TASKS, (_guest_mib(limits) + _QEMU_MIB) << 20, limits.cpus)


TIER = Tier("microvm", _unavailable, start, _clean_up, _host_limits)
