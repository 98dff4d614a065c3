"""For the microVM tier's tests: whether this machine can run a guest, and how.

KVM is used where it runs Debian's kernel; where it cannot (missing, or PVM as on these
machines) the tests run the guest under QEMU's emulation (`ACCEL`, and `SEALGATE_MICROVM_ACCEL`
in the environment of the `sealgate` they start: never this process's own, which other suites
share), which proves the same behaviour, only slower. Without QEMU or a built image (`make
test` builds it before pytest: the session's own network namespace cannot reach apt) they
skip, saying which.
"""

from __future__ import annotations

import os

import pytest

from sealgate.sandbox.microvm import image, vm


def problem() -> str | None:
    if vm.qemu() is None:
        return f"needs {vm.QEMU} (Debian: qemu-system-x86)"
    if image.find() is None:
        return "no microVM guest image: run scripts/microvm-image (make test does)"
    if os.geteuid() != 0:
        return "needs root (QEMU starts as root and drops to the run's uid)"
    return None


ACCEL = "kvm" if vm.kvm_problem() is None else "tcg"
ACCEL_ENV = {vm.ACCEL_ENV: ACCEL}
PROBLEM = problem()
needs_vm = pytest.mark.skipif(PROBLEM is not None, reason=f"microVM: {PROBLEM}")
