"""The isolation tiers the sandbox tests run over: each test that proves an escape property
takes `@pytest.mark.parametrize("tier", TIERS)`, and a tier this machine cannot run (its
program missing, no usable /dev/kvm, not part of this sealgate yet) is skipped with the reason
the tier itself gives."""

from __future__ import annotations

import pytest

from sealgate.sandbox import tiers


def _param(name: str) -> object:
    problem = tiers.available(name)
    return pytest.param(name, id=name, marks=pytest.mark.skipif(
        problem is not None, reason=f"isolation {name}: {problem}"))


TIERS = [_param(name) for name in tiers.NAMES]
