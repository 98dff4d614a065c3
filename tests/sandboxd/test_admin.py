"""sandboxd's admin listener (`--admin`): /healthz, /readyz and /metrics on a real daemon after
real calls, the exposition checked by Prometheus' own promtool; readiness from the daemon's own
state; nothing of the API reachable there."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client import generate_latest

from sealgate.sandbox.clients.client import Sandbox
from sealgate.sandbox.daemon import admin
from sealgate.sandbox.daemon.daemon import Config
from sealgate.sandbox.daemon.daemon import Daemon as Sandboxd
from sealgate.sandbox.daemon.slot import SlotConfig
from tests.harness import ROOT, Proxy, free_port, quiet
from tests.integration.test_metrics import total

from .conftest import Daemon, launch, start_daemon

CANARY = "sk_live_admin_env_canary_31c9"


@pytest.fixture(scope="module")
def watched(dproxy: Proxy, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[Daemon, str]]:
    port = free_port()
    daemon = start_daemon(dproxy, tmp_path_factory.mktemp("sandboxd-admin"), "--pool", "1",
                          "--no-selftest", "--admin", f"127.0.0.1:{port}")
    yield daemon, f"http://127.0.0.1:{port}"
    daemon.stop()


def scrape(base: str) -> str:
    answer = requests.get(f"{base}/metrics", timeout=10)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("text/plain; version=")
    return answer.text


def test_health_and_readiness(watched: tuple[Daemon, str]) -> None:
    _, base = watched
    assert requests.get(f"{base}/healthz", timeout=10).json() == {"ok": True}
    ready = requests.get(f"{base}/readyz", timeout=10)
    assert (ready.status_code, ready.json()["ready"]) == (200, True)
    # Nothing of the API: no sandbox is made or listed here, with or without a key.
    for method, path in (("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"),
                         ("GET", "/v1/health")):
        assert requests.request(method, f"{base}{path}", timeout=10).status_code == 404


def test_metrics_count_what_the_api_answered(watched: tuple[Daemon, str]) -> None:
    daemon, base = watched
    before = scrape(base)
    with Sandbox.create("ci-bot", daemon=str(daemon.socket), env={"TOKEN": CANARY}) as sb:
        assert sb.run(["sh", "-c", "exit 3"]).exit_code == 3
        assert sb.run(["sleep", "5"], timeout=0.5).exit_code == 124
        alive = scrape(base)
    after = scrape(base)

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert grew("sealgate_sandboxd_commands_ended_total", ending="exit") == 1
    assert grew("sealgate_sandboxd_commands_ended_total", ending="timed_out") == 1
    assert grew("sealgate_sandboxd_requests_total", call="POST /v1/sandboxes",
                status="201") == 1
    assert grew("sealgate_sandboxd_requests_total", call="POST /v1/sandboxes/:id/exec",
                status="200") == 2
    assert grew("sealgate_sandboxd_requests_total", call="DELETE /v1/sandboxes/:id") == 1
    calls = grew("sealgate_sandboxd_request_duration_seconds_count",
                 call="POST /v1/sandboxes/:id/exec")
    assert calls == 2
    # The timed-out command ran half a second: its call is in the buckets past that.
    assert grew("sealgate_sandboxd_request_duration_seconds_bucket",
                call="POST /v1/sandboxes/:id/exec", le="0.25") <= 1
    assert total(alive, "sealgate_sandboxd_sandboxes", tier="bwrap", image="host") == 1
    # What the daemon did: one create from the pool's slot, one delete, and the pool refilled
    # (a slot prepared: the histogram's count grows, within its buckets).
    assert grew("sealgate_sandboxd_sandboxes_created_total", how="warm") == 1
    assert grew("sealgate_sandboxd_sandboxes_created_total", how="cold") == 0
    # A fork's copies have a label of their own, never counted as cold creates (this tier
    # cannot fork: the series is there, at 0).
    assert grew("sealgate_sandboxd_sandboxes_created_total", how="fork") == 0
    assert grew("sealgate_sandboxd_sandboxes_ended_total", why="deleted") == 1
    prepared = "sealgate_sandboxd_slot_prepare_duration_seconds"
    deadline = time.monotonic() + 30  # the refill runs beside the calls: on a loaded host, later
    while (refill := total(scrape(base), f"{prepared}_count") - total(before, f"{prepared}_count")
           ) < 1:
        assert time.monotonic() < deadline, "no slot prepared for the pool"
        time.sleep(0.1)
    assert total(scrape(base), f"{prepared}_bucket", le="+Inf") >= \
        total(before, f"{prepared}_bucket", le="+Inf") + refill
    assert total(after, "sealgate_sandboxd_slot_prepare_failures_total") == 0
    assert total(after, "sealgate_sandboxd_sandboxes") == 0
    assert total(after, "sealgate_sandboxd_pool_wanted") == 1
    assert total(after, "sealgate_sandboxd_ready") == 1
    assert CANARY not in alive + after and sb.id not in alive  # no id, no secret, as a label
    # Nor in any line of its log (its events and its operational log): the create's env is
    # the sandbox's, never the daemon's to repeat.
    assert CANARY not in daemon.log.read_text()
    daemon.lines()  # every line JSON
    promtool = shutil.which("promtool", path=f"{ROOT / 'var' / 'tools'}:{os.environ['PATH']}")
    if promtool is None:
        pytest.skip("no promtool (Debian's prometheus package) to check the exposition with")
    checked = subprocess.run([promtool, "check", "metrics"], input=after, capture_output=True,
                             text=True, timeout=30, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_sandbox_held_to_its_memory_limit_is_counted(watched: tuple[Daemon, str]) -> None:
    """An out-of-memory kill in a live sandbox is counted at once (read off its cgroup at the
    scrape) and stays counted after the sandbox ends (read as it ends)."""
    daemon, base = watched
    before = total(scrape(base), "sealgate_sandboxd_limit_hits_total", limit="memory")
    with Sandbox.create("ci-bot", daemon=str(daemon.socket), limits={"memory": "64M"}) as sb:
        done = sb.run(["python3", "-c", "b = bytearray(256 << 20); print(len(b))"])
        assert done.exit_code == 137 and not done.text, done  # SIGKILL, by the kernel
        live = total(scrape(base), "sealgate_sandboxd_limit_hits_total", limit="memory")
    after = total(scrape(base), "sealgate_sandboxd_limit_hits_total", limit="memory")
    assert live - before >= 1 and after == live, (before, live, after)
    assert total(scrape(base), "sealgate_sandboxd_limit_hits_total", limit="pids") == 0


def test_a_taken_admin_address_is_refused_at_start(dproxy: Proxy, tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        daemon = launch(dproxy, tmp_path, "--pool", "0", "--no-selftest", "--admin",
                        f"127.0.0.1:{taken.getsockname()[1]}")
        code = daemon.process.wait(60)
    finally:
        taken.close()
    text = daemon.log.read_text()
    assert code == 2 and "admin listener failed" in text and quiet(text), text


def test_readiness_is_the_daemon_s_own_state(tmp_path: Path) -> None:
    """The reasons, from a real daemon object in each state (none of it needs a sandbox)."""
    daemon = Sandboxd(Config(slots=SlotConfig(state=tmp_path, proxy_port=1), pool=0))
    assert admin.readiness(daemon, stopping=False) == ["starting"]
    daemon.ready, daemon.problem = True, None
    assert admin.readiness(daemon, stopping=False) == []
    daemon.unverified = "self-test failed: egress"
    assert admin.readiness(daemon, stopping=False) == ["self-test failed: egress"]
    daemon.held = True
    assert admin.readiness(daemon, stopping=False) == ["handing over to a successor"]
    assert admin.readiness(daemon, stopping=True) == ["stopping"]


def test_a_status_from_inside_chooses_no_label(tmp_path: Path) -> None:
    daemon = Sandboxd(Config(slots=SlotConfig(state=tmp_path, proxy_port=1), pool=0))
    metrics = admin.Metrics(daemon)
    for forged in ("x" * 4096, 'a"} 1\nsealgate_evil 1', None, 7, "exit"):
        metrics.ended({"ending": forged})
    text = generate_latest(metrics.registry).decode()
    assert total(text, "sealgate_sandboxd_commands_ended_total", ending="invalid") == 4
    assert total(text, "sealgate_sandboxd_commands_ended_total", ending="exit") == 1
    assert "evil" not in text and "xxxx" not in text
