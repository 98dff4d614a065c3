"""Identity by pod, its pure part (kube/claims.py): which pod owns an address, whatever order
the API's events of two pods sharing it over time arrive in."""

from __future__ import annotations

from typing import Any

import pytest

from sealgate.kube.claims import Claims, Pod, PodError

LABEL = "sealgate.dev/sandbox"


def raw(uid: str, ip: str | None, sandbox: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": uid, "labels": {LABEL: sandbox} if sandbox else {}}
    status: dict[str, Any] = {"phase": extra.pop("phase", "Running")}
    if ip:
        status["podIPs"] = [{"ip": ip}]
    if extra.pop("terminating", False):
        meta["deletionTimestamp"] = "2026-12-02T12:00:00Z"
    return {"metadata": meta, "spec": {"hostNetwork": extra.pop("host_network", False)},
            "status": status}


def pod(*args: Any, **kwargs: Any) -> Pod:
    return Pod.of(raw(*args, **kwargs), LABEL)


def test_a_new_pod_on_a_reused_address_owns_it_whatever_the_old_one_s_late_events() -> None:
    claims = Claims()
    assert claims.seen(pod("a", "10.244.0.5", "sb-a")) == [("10.244.0.5", "sb-a")]
    # The address goes to a pod without the label before the old pod's end is written.
    assert claims.seen(pod("b", "10.244.0.5")) == [("10.244.0.5", None)]
    assert claims.gone("a") == []  # the late DELETED of the old pod changes nothing
    assert claims.seen(pod("a", "10.244.0.5", "sb-a", terminating=True)) == []
    assert claims.registered() == {}
    # And to a labelled pod: its sandbox, and the old pod's end does not withdraw it.
    assert claims.seen(pod("c", "10.244.0.5", "sb-c")) == [("10.244.0.5", "sb-c")]
    assert claims.gone("b") == []
    assert claims.registered() == {"10.244.0.5": "sb-c"}


@pytest.mark.parametrize("ending", [{"terminating": True}, {"phase": "Succeeded"},
                                    {"phase": "Failed"}, {"host_network": True}])
def test_an_ending_pod_or_one_on_the_host_s_network_claims_nothing(ending: Any) -> None:
    claims = Claims()
    claims.seen(pod("a", "10.244.0.5", "sb-a"))
    assert claims.seen(pod("a", "10.244.0.5", "sb-a", **ending)) == [("10.244.0.5", None)]
    assert claims.registered() == {}


def test_a_label_changed_or_removed_changes_the_sandbox() -> None:
    claims = Claims()
    claims.seen(pod("a", "10.244.0.5", "sb-a"))
    assert claims.seen(pod("a", "10.244.0.5", "sb-b")) == [("10.244.0.5", "sb-b")]
    assert claims.seen(pod("a", "10.244.0.5")) == [("10.244.0.5", None)]
    assert claims.seen(pod("a", "10.244.0.5", "bad id!")) == []  # no sandbox id: no one's


def test_a_relist_is_the_truth_and_a_doubly_claimed_address_is_no_one_s() -> None:
    claims = Claims()
    claims.seen(pod("a", "10.244.0.5", "sb-a"))
    claims.seen(pod("b", "10.244.0.6", "sb-b"))
    changes = claims.relist([pod("b", "10.244.0.6", "sb-b"), pod("c", "10.244.0.7", "sb-c"),
                             pod("d", "10.244.0.8", "sb-d"), pod("e", "10.244.0.8", "sb-e")])
    assert sorted(changes, key=str) == [("10.244.0.5", None), ("10.244.0.7", "sb-c")]
    assert claims.registered() == {"10.244.0.6": "sb-b", "10.244.0.7": "sb-c"}


def test_dual_stack_and_a_dropped_address() -> None:
    claims = Claims()
    both = raw("a", None, "sb-a")
    both["status"]["podIPs"] = [{"ip": "10.244.0.5"}, {"ip": "fd00::5"}]
    assert sorted(claims.seen(Pod.of(both, LABEL))) == [("10.244.0.5", "sb-a"),
                                                         ("fd00::5", "sb-a")]
    assert claims.seen(pod("a", "10.244.0.5", "sb-a")) == [("fd00::5", None)]


@pytest.mark.parametrize("broken", [
    [], {"metadata": "x"}, {"metadata": {}}, {"metadata": {"uid": 7}},
    {"metadata": {"uid": "u"}, "status": {"podIP": "not-an-ip"}},
    {"metadata": {"uid": "u"}, "status": {"podIPs": [{"ip": "10.0.0.1/8"}]}},
])
def test_what_is_not_a_readable_pod_is_refused(broken: Any) -> None:
    with pytest.raises(PodError):
        Pod.of(broken, LABEL)
