"""`sealgate kube identity`: a real watcher process, a real proxy, and a double of the
Kubernetes API (tests/kubefake.py): the proxy's source registry follows the pods, a reused
address never keeps its old pod's sandbox, a 410 re-lists, an API gone past `--stale-after`
withdraws everything, and the service account's token is in no log."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sealgate.proxy import register_source, registered_sources, unregister_source
from tests.harness import ROOT, SEALGATE, Proxy, free_port, key_digest, log_lines, quiet
from tests.integration.test_metrics import total
from tests.kubefake import TOKEN, KubeFake

LABEL = "sealgate.dev/sandbox"
RULES = f"""
version: 1
policies:
  ci:
    allow: []
sandboxes:
  sb-a: {{policy: ci, key_sha256: "{key_digest('unused-a')}"}}
  sb-b: {{policy: ci, key_sha256: "{key_digest('unused-b')}"}}
  sb-c: {{policy: ci, key_sha256: "{key_digest('unused-c')}"}}
"""


@pytest.fixture(scope="module")
def kproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    p = Proxy(tmp_path_factory.mktemp("kube-proxy"), RULES)
    yield p
    p.stop()


class Watcher:
    def __init__(self, proxy: Proxy, api: KubeFake, where: Path, *extra: str) -> None:
        config = where / "kubeconfig"
        config.write_text(api.kubeconfig())
        self.log = where / "watcher.log"
        self.proxy = proxy
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [*SEALGATE, "kube", "identity", "--state", str(proxy.state), "--kubeconfig",
                 str(config), *extra], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    def sources(self) -> dict[str, str]:
        return registered_sources(self.proxy.state / "control.sock")

    def until(self, wanted: Callable[[dict[str, str]], bool], why: str,
              seconds: float = 20) -> dict[str, str]:
        deadline = time.monotonic() + seconds
        while True:
            assert self.process.poll() is None, self.log.read_text()
            seen = self.sources()
            if wanted(seen):
                return seen
            if time.monotonic() > deadline:
                raise AssertionError(f"{why}: the registry is {seen}\n{self.log.read_text()}")
            time.sleep(0.05)

    def said(self, event: str, seconds: float = 20, **fields: object) -> None:
        """Wait for a log line of `event` with `fields`."""
        deadline = time.monotonic() + seconds
        while not [line for line in log_lines(self.log.read_text())
                   if line["event"] == event and fields.items() <= line.items()]:
            assert time.monotonic() < deadline, f"never said {event!r}: {self.log.read_text()}"
            time.sleep(0.05)

    def stop(self) -> str:
        self.process.terminate()
        assert self.process.wait(20) == 0
        return self.log.read_text()


@pytest.fixture
def started(kproxy: Proxy, tmp_path: Path) -> Iterator[Callable[..., tuple[KubeFake, Watcher]]]:
    made: list[tuple[KubeFake, Watcher]] = []

    def start(*extra: str, before: Callable[[KubeFake], Any] = lambda _: None
              ) -> tuple[KubeFake, Watcher]:
        api = KubeFake().__enter__()
        before(api)
        watcher = Watcher(kproxy, api, tmp_path, *extra)
        made.append((api, watcher))
        return api, watcher

    yield start
    for api, watcher in made:
        log = watcher.stop()
        api.__exit__()
        assert TOKEN not in log and quiet(log), log
        log_lines(log)  # every line JSON, with the operational log's fields
    for address in registered_sources(kproxy.state / "control.sock"):
        unregister_source(kproxy.state / "control.sock", address)


def test_the_registry_follows_the_pods(started: Callable[..., tuple[KubeFake, Watcher]],
                                       kproxy: Proxy) -> None:
    control = kproxy.state / "control.sock"
    register_source(control, "10.244.9.9", "sb-c")  # left by an earlier run: no pod has it

    def pods(api: KubeFake) -> None:
        api.add("a", "10.244.0.5", {LABEL: "sb-a"})
        api.add("plain", "10.244.0.6")
        api.add("node-agent", "192.0.2.10", {LABEL: "sb-b"}, host_network=True)
        api.add("pending", None, {LABEL: "sb-b"})

    api, watcher = started(before=pods)
    watcher.until(lambda s: s == {"10.244.0.5": "sb-a"}, "the list made the registry")
    b = api.add("b", "10.244.0.7", {LABEL: "sb-b"}, namespace="other")
    watcher.until(lambda s: s.get("10.244.0.7") == "sb-b", "an added pod registered")
    api.update(b, labels={LABEL: "sb-c"})
    watcher.until(lambda s: s.get("10.244.0.7") == "sb-c", "a relabelled pod")
    api.update(b, terminating=True)
    watcher.until(lambda s: "10.244.0.7" not in s, "a terminating pod withdrawn")
    u = api.add("unknown", "10.244.0.8", {LABEL: "sb-nope"})  # no such sandbox in the rules
    watcher.said("the proxy refused an address", address="10.244.0.8", sandbox="sb-nope",
                 reason="unknown_sandbox")
    api.delete(u)
    watcher.until(lambda s: s == {"10.244.0.5": "sb-a"}, "only what pods hold")


def test_a_reused_address_never_keeps_the_old_pod_s_sandbox(
        started: Callable[..., tuple[KubeFake, Watcher]]) -> None:
    api, watcher = started()
    old = api.add("old", "10.244.1.5", {LABEL: "sb-a"})
    watcher.until(lambda s: s.get("10.244.1.5") == "sb-a", "the old pod registered")
    # The address is given to a pod of another tenant, unlabelled, before the old pod's end
    # is written: at once no one's.
    other = api.add("other-tenant", "10.244.1.5", namespace="tenant-2")
    watcher.until(lambda s: "10.244.1.5" not in s, "a new pod's claim withdrew the old one's")
    api.delete(other)
    new = api.add("new", "10.244.1.5", {LABEL: "sb-b"})
    watcher.until(lambda s: s.get("10.244.1.5") == "sb-b", "the new pod's sandbox")
    api.delete(old)  # the old pod's late end: the new pod keeps its address
    api.bookmark()
    time.sleep(0.5)
    assert watcher.sources() == {"10.244.1.5": "sb-b"}
    api.delete(new)
    watcher.until(lambda s: s == {}, "the new pod's end")


def test_a_410_lists_again_and_what_ended_meanwhile_is_withdrawn(
        started: Callable[..., tuple[KubeFake, Watcher]]) -> None:
    api, watcher = started()
    a = api.add("a", "10.244.2.5", {LABEL: "sb-a"})
    api.add("b", "10.244.2.6", {LABEL: "sb-b"})
    watcher.until(lambda s: len(s) == 2, "both registered")
    lists = len(api.lists())
    api.down = True  # the watch is cut; meanwhile a pod ends and the history is compacted
    api.delete(a)
    api.compact()
    api.down = False
    watcher.until(lambda s: s == {"10.244.2.6": "sb-b"}, "the re-list withdrew the ended pod")
    assert len(api.lists()) > lists


def test_an_api_gone_past_stale_after_withdraws_everything(
        started: Callable[..., tuple[KubeFake, Watcher]]) -> None:
    api, watcher = started("--stale-after", "1")
    api.add("a", "10.244.3.5", {LABEL: "sb-a"})
    watcher.until(lambda s: s == {"10.244.3.5": "sb-a"}, "registered")
    api.down = True
    watcher.until(lambda s: s == {}, "withdrawn, failing closed", seconds=30)
    assert "every registration withdrawn" in watcher.log.read_text()
    api.down = False
    watcher.until(lambda s: s == {"10.244.3.5": "sb-a"}, "registered again once listed",
                  seconds=30)


def test_a_wrong_token_reads_nothing_and_says_so(tmp_path: Path, kproxy: Proxy) -> None:
    with KubeFake() as api:
        api.add("a", "10.244.4.5", {LABEL: "sb-a"})
        config = tmp_path / "kubeconfig"
        config.write_text(api.kubeconfig().replace(TOKEN, "not-the-service-account-token"))
        log = tmp_path / "watcher.log"
        with log.open("w") as out:
            process = subprocess.Popen([*SEALGATE, "kube", "identity", "--state",
                                        str(kproxy.state), "--kubeconfig", str(config)],
                                       cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while "Unauthorized" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.terminate()
        assert process.wait(20) == 0
    text = log.read_text()
    assert {"event": "the pods could not be read",
            "error": "ApiException: HTTP 401 Unauthorized"}.items() <= log_lines(text)[1].items()
    assert "not-the-service-account-token" not in text and quiet(text)
    assert registered_sources(kproxy.state / "control.sock") == {}


def test_the_admin_listener_says_what_the_watcher_knows(
        started: Callable[..., tuple[KubeFake, Watcher]]) -> None:
    """/readyz follows the watcher's state (an API gone past --stale-after: not ready, ready
    again once listed) and /metrics counts what it did, checked by promtool."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    api, watcher = started("--stale-after", "1", "--admin", f"127.0.0.1:{port}")
    a = api.add("a", "10.244.4.5", {LABEL: "sb-a"})
    api.add("b", "10.244.4.6", {LABEL: "sb-b"})
    watcher.until(lambda s: len(s) == 2, "both registered")
    api.add("c", "10.244.4.7", {LABEL: "sb-c"})  # seen by the watch, not a list
    watcher.until(lambda s: len(s) == 3, "an added pod registered")
    assert requests.get(f"{base}/healthz", timeout=10).json() == {"ok": True}
    assert requests.get(f"{base}/readyz", timeout=10).json() == {"ready": True}
    api.down = True
    api.delete(a)
    api.compact()
    watcher.until(lambda s: s == {}, "withdrawn, failing closed", seconds=30)
    refused = requests.get(f"{base}/readyz", timeout=10)
    assert refused.status_code == 503 and "every registration withdrawn" in \
        refused.json()["unready"][0], refused.text
    api.down = False
    watcher.until(lambda s: s == {"10.244.4.6": "sb-b", "10.244.4.7": "sb-c"}, "listed again",
                  seconds=30)
    deadline = time.monotonic() + 10
    while requests.get(f"{base}/readyz", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "never ready again"
        time.sleep(0.05)
    text = requests.get(f"{base}/metrics", timeout=10).text
    assert total(text, "sealgate_kube_lists_total") >= 2
    assert total(text, "sealgate_kube_withdrawals_total") == 1
    assert total(text, "sealgate_kube_api_failures_total") >= 1
    assert total(text, "sealgate_kube_watch_events_total", type="ADDED") >= 1
    # Registered: a, b and c, then b and c again after the outage; withdrawn: all three at it.
    assert total(text, "sealgate_kube_registry_changes_total", outcome="registered") == 5
    assert total(text, "sealgate_kube_registry_changes_total", outcome="withdrawn") == 3
    assert total(text, "sealgate_kube_addresses") == 2
    promtool = shutil.which("promtool", path=f"{ROOT / 'var' / 'tools'}:{os.environ['PATH']}")
    if promtool is not None:
        checked = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                                 capture_output=True, timeout=30, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
