"""A lease's cgroup name (`sandbox.host.lease`) becomes a path a clean-up removes and kills
in: only a run's group name is one, never a way out of the cgroups' parent."""

from __future__ import annotations

import json

import pytest

from sealgate.sandbox.host import lease


def written(group: str) -> str:
    return json.dumps({"index": 7, "pid": 1, "started": "1", "state": "/s",
                       "address": "10.0.0.2", "group": group})


@pytest.mark.parametrize("group", ["", "run-7-123", "run-7-4294967295"])
def test_a_runs_group_name_is_a_lease(group: str) -> None:
    held = lease.parse(written(group))
    assert held.groups == (group or "run-7-1")


@pytest.mark.parametrize("group", ["../../system.slice", "run-7-1/../../x", "/etc",
                                   "run-7-1\x00", "run-7-" + "1" * 300, "..", "run-7-1 ",
                                   "x" * 5000])
def test_a_group_name_that_leads_elsewhere_is_refused(group: str) -> None:
    with pytest.raises(ValueError, match="not a run's cgroup name"):
        lease.parse(written(group))
    with pytest.raises(ValueError, match="not a run's cgroup name"):
        lease.Lease(7, 1, "1", "/s", "10.0.0.2", group)


def test_a_lease_nested_past_the_parsers_depth_is_refused() -> None:
    with pytest.raises(RecursionError):  # `stale` counts it unreadable: cleaned by index
        lease.parse("[" * 200_000)
