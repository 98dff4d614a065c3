"""The daemon proves its boundary before it is ready: a canary sandbox fails every forbidden way
out (judged by what arrived on listeners, not only by what the canary saw) and reaches the
proxy; a daemon whose check fails says which and creates nothing."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from sealgate.sandbox.clients.client import Client, DaemonError
from sealgate.sandbox.daemon import selftest
from tests.harness import ROOT, SEALGATE, Proxy, free_port
from tests.sandboxd.conftest import PLAN, UID_BASE, Daemon, start_daemon

EXPECTED = {
    "tcp to the host's loopback", "tcp to the link's host end", "tcp to the gateway's other ports",
    "tcp to the outside", "tcp to another sandbox", "tcp over IPv6", "the proxy answers",
    "udp to the link's host end", "udp to the gateway", "udp to the outside",
    "dns to the outside", "metadata, directly", "metadata, through the proxy",
    "control.sock not in the sandbox", "sandboxd.sock not in the sandbox",
    "names answer only with the proxy", "IPv6 off in the sandbox",
    "nothing arrived on the host", "nothing arrived in another sandbox",
    "no other process within a command's reach",
}


def test_the_daemon_is_ready_only_after_its_self_test_passes(
    dproxy: Proxy, tmp_path: Path
) -> None:
    daemon = start_daemon(dproxy, tmp_path, "--pool", "1")
    try:
        assert [line["checks"] for line in daemon.said("self-test passed")] == [20]
        # Its whole output is JSON lines: the events on stdout, the operational log on stderr.
        assert daemon.said("serving")[0]["pool"] == 1
        done = subprocess.run([*SEALGATE, "sandbox", "selftest", "--json", "--daemon",
                               str(daemon.socket)], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        answer = json.loads(done.stdout)
        assert answer["ok"] is True
        assert {c["name"] for c in answer["checks"]} == EXPECTED
        assert all(c["ok"] for c in answer["checks"]), answer
    finally:
        daemon.stop()


def test_a_failed_check_is_named_and_no_sandbox_is_created(
    dproxy: Proxy, tmp_path: Path
) -> None:
    # The proxy is not where this daemon is told it listens: the allowed way fails.
    sock = tmp_path / "sandboxd.sock"
    log = tmp_path / "sandboxd.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*SEALGATE, "sandboxd", *PLAN, "--state", str(dproxy.state), "--socket", str(sock),
             "--proxy-port", str(free_port()), "--uid-base", str(UID_BASE), "--pool", "0"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
    daemon = Daemon(process, sock, log)
    try:
        deadline = time.monotonic() + 60
        while '"self-test failed"' not in log.read_text():
            assert time.monotonic() < deadline and process.poll() is None, log.read_text()
            time.sleep(0.1)
        assert "the proxy answers" in {line["check"] for line in daemon.said("self-test failed")}
        health = Client(str(sock)).health()
        assert health["ready"] is False
        assert "the proxy answers" in health["problem"]
        with pytest.raises(DaemonError) as refused:
            Client(str(sock)).call("POST", "/v1/sandboxes", {"sandbox": "ci-bot"})
        assert refused.value.code == "at_capacity"
        assert "self-test failed: the proxy answers" in str(refused.value)
    finally:
        daemon.stop()


def test_the_reach_check_fails_where_a_command_can_reach_another_process() -> None:
    """The check can fail: the canary's probe run where the protection is off (outside any
    sandbox, as a uid beside another process of that uid, which is what a command saw of
    bubblewrap's init and the agent before #22) reports what it could reach, and the check
    fails naming it."""
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    other = subprocess.Popen([*drop, "sleep", "30"])
    try:
        time.sleep(0.2)  # past setpriv's exec: the sleep runs as that uid
        probe = subprocess.run([*drop, "/usr/bin/python3", "-I", "-S",
                                str(ROOT / "sandbox" / "guest" / "probe.py")],
                               input=json.dumps({"reach": True}), capture_output=True,
                               text=True, timeout=60, check=True)
        seen = json.loads(probe.stdout)
        assert other.pid in seen["reach"]["signal"], seen["reach"]
        checks = selftest._judge({"tcp": [], "udp": [], "http": [], "absent": []}, seen,
                                 "10.0.0.1", [], b"0")
        reach = next(c for c in checks if c.name == "no other process within a command's reach")
        assert not reach.ok and str(other.pid) in reach.detail, reach
    finally:
        other.kill()
        other.wait()
