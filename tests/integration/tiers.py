"""The isolation tiers the sandbox tests run over: each test that proves an escape property
takes `@pytest.mark.parametrize("tier", TIERS)`, and a tier this machine cannot run (its
program missing, no guest image) is skipped with the reason the tier itself gives.

Where KVM cannot run the microVM's guest (no /dev/kvm, or a nested PVM host like this one),
the microVM runs under QEMU's emulation (TCG) for the tests: the same guest kernel, the same
boundary around it, only slower. `ENV` is what `sealgate sandbox run` needs for that (and the
guest image's directory, when the suite was given one)."""

from __future__ import annotations

import os

import pytest

from sealgate.sandbox import tiers
from sealgate.sandbox.tiers.microvm import image, vm

ENV = {} if vm.kvm_problem() is None else {vm.ACCEL_ENV: "tcg"}
# A guest image other than var/microvm's, when the suite is pointed at one, for the sealgate
# the tests start too.
ENV.update({k: os.environ[k] for k in (image.DIR_ENV,) if k in os.environ})


def unavailable(name: str) -> str | None:
    saved = {key: os.environ.get(key) for key in ENV}
    os.environ.update(ENV)
    try:
        return tiers.available(name)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _param(name: str) -> object:
    problem = unavailable(name)
    return pytest.param(name, id=name, marks=pytest.mark.skipif(
        problem is not None, reason=f"isolation {name}: {problem}"))


TIERS = [_param(name) for name in tiers.NAMES]
