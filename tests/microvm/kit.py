"""For the microVM tier's tests: whether this machine can run a guest, and how.

KVM is used where it runs Debian's kernel; where it cannot (missing, or PVM as on these
machines) the tests run the guest under QEMU's emulation (`ACCEL`, and `VM_ENV` in the
environment of the `sealgate` they start: never this process's own, which other suites share),
which proves the same behaviour, only slower. Without QEMU or a built image (`make test` builds
it before pytest: the session's own network namespace cannot reach apt) they skip, saying
which. `spec` and `run` boot and drive a guest as the tier does (`conftest`'s `guest`
fixture), without a network.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sealgate.sandbox.tiers.microvm import image, vm
from sealgate.sandbox.tiers.microvm.channel import Channel, GuestResult

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/sandbox", "LANG": "C.UTF-8"}
NOBODY = 65534


def problem() -> str | None:
    if vm.qemu() is None:
        return f"needs {vm.QEMU} (Debian: qemu-system-x86)"
    if image.find() is None:
        return "no microVM guest image: run scripts/microvm-image (make test does)"
    if os.geteuid() != 0:
        return "needs root (QEMU starts as root and drops to the run's uid)"
    return None


ACCEL = "kvm" if vm.kvm_problem() is None else "tcg"
# What the `sealgate` a test starts needs: the accelerator, and the image's directory when the
# suite was given one.
VM_ENV = {vm.ACCEL_ENV: ACCEL, **{k: os.environ[k] for k in (image.DIR_ENV,) if k in os.environ}}
PROBLEM = problem()
needs_vm = pytest.mark.skipif(PROBLEM is not None, reason=f"microVM: {PROBLEM}")


def spec(workspace: Path | None = None) -> vm.Spec:
    found = image.find()
    assert found is not None
    return vm.Spec(found, ACCEL, NOBODY, NOBODY, memory_mib=256, workspace=workspace)


def run(channel: Channel, *argv: str, stdin: bytes = b"", pids: int | None = None,
        timeout: float = 30) -> GuestResult:
    """A command in the guest as the run's uid (nobody), with `ENV` only."""
    return channel.run(argv, ENV, uid=NOBODY, gid=NOBODY, timeout=timeout, stdin=stdin,
                       pids=pids)
