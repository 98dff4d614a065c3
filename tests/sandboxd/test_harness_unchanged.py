"""The harness of tests/sandboxharness.py against a daemon on this host: what it sees must be
what it sees against the Kubernetes backend (tests/integration/test_sandbox_kubernetes.py), so
a harness's code does not change between a laptop and a cluster."""

from __future__ import annotations

from tests.sandboxd.conftest import Daemon
from tests.sandboxharness import EXPECTED, review


def test_the_harness_runs_unchanged(sandboxd: Daemon) -> None:
    assert review(str(sandboxd.socket), "ci-bot") == EXPECTED
