"""Where the microVM tier cannot run, it says why, before anything is made for a run."""

from __future__ import annotations

import pytest

from sealgate.sandbox import tiers
from sealgate.sandbox.tiers.microvm import vm


def test_without_usable_kvm_the_tier_says_why_unless_emulation_is_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem = vm.kvm_problem()
    if problem is None:
        pytest.skip("KVM runs the guest's kernel here: nothing to refuse")
    monkeypatch.delenv(vm.ACCEL_ENV, raising=False)
    reason = tiers.available("microvm")
    assert reason is not None and problem in reason and f"{vm.ACCEL_ENV}=tcg" in reason
    monkeypatch.setenv(vm.ACCEL_ENV, "tcg")
    assert vm.accelerator() == ("tcg", f"TCG emulation ({problem})")


def test_an_unknown_accelerator_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vm.ACCEL_ENV, "xen")
    accel, why = vm.accelerator()
    assert accel is None and "use kvm or tcg" in why
