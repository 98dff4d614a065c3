"""The issuer service as a real process: serving, and reloading on SIGHUP."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time

from sealgate import credentials as tk
from tests.harness import free_port, log_lines
from tests.unit.test_issuer_service import (  # noqa: F401 -- env: the unit tests' fixture
    API_KEYS,
    CANARY,
    ROOT,
    SEALGATE,
    Env,
    _http,
    body,
    env,
)


def test_serve_end_to_end_with_sighup(env: Env) -> None:  # noqa: F811
    """Minting, a reload on SIGHUP, and readiness on the admin listener: ready, then not ready
    naming the callers file a reload could not read, then ready again once it can."""
    audit = env.audit_path.with_name("serve.log")
    admin = free_port()
    proc = subprocess.Popen(
        [
            str(SEALGATE),
            "issuer",
            "serve",
            "--keys",
            str(env.public_dir),
            "--callers",
            str(env.callers_path),
            "--listen",
            "127.0.0.1:0",
            "--audit-log",
            str(audit),
            "--reload-interval",
            "0",
            "--admin",
            f"127.0.0.1:{admin}",
            "--log-level",  # no secret in any line at any level, the libraries' included
            "debug",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        url, read = "", []
        for _ in range(50):
            read.append(proc.stderr.readline())
            said = json.loads(read[-1])
            if said["event"] == "listening":
                url = said["url"]
                break
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), read
        reply = _http(
            "POST",
            f"{url}/v1/tokens",
            json=body(),
            headers={"Authorization": f"Bearer {API_KEYS['ci']}"},
        )
        assert reply.status_code == 200, reply.text
        assert tk.unseal(reply.json()["token"], env.keyring).secret == CANARY
        newer = env.add_key()
        assert _http("GET", f"{url}/v1/keys").json()["current"] != newer.kid  # not polled
        proc.send_signal(signal.SIGHUP)
        current = ""
        for _ in range(100):
            current = _http("GET", f"{url}/v1/keys").json()["current"]
            if current == newer.kid:
                break
            time.sleep(0.05)
        assert current == newer.kid
        refused = _http("POST", f"{url}/v1/tokens", json=body(),
                        headers={"Authorization": "Bearer not-a-caller-key"})
        assert refused.status_code == 401
        metrics = _http("GET", f"http://127.0.0.1:{admin}/metrics").text
        assert 'sealgate_issuer_tokens_minted_total{caller="ci",processor="bearer"} 1.0' in (
            metrics), metrics
        assert 'sealgate_issuer_refusals_total{reason="unauthenticated"} 1.0' in metrics, metrics
        promtool = shutil.which("promtool", path=f"{ROOT / 'var' / 'tools'}:{os.environ['PATH']}")
        if promtool is not None:
            checked = subprocess.run([promtool, "check", "metrics"], input=metrics,
                                     capture_output=True, text=True, timeout=30, check=False)
            assert checked.returncode == 0, checked.stdout + checked.stderr
        readyz = f"http://127.0.0.1:{admin}/readyz"
        assert _http("GET", f"http://127.0.0.1:{admin}/healthz").json() == {"ok": True}
        assert (_http("GET", readyz).status_code, _http("GET", readyz).json()) == (
            200, {"ready": True})
        good = env.callers_path.read_text()
        env.callers_path.write_text("callers: [", encoding="utf-8")
        proc.send_signal(signal.SIGHUP)
        for _ in range(100):
            if (reply := _http("GET", readyz)).status_code == 503:
                break
            time.sleep(0.05)
        assert reply.status_code == 503
        (reason,) = reply.json()["unready"]
        assert reason.startswith("callers: ") and "YAML" in reason, reason
        env.callers_path.write_text(good, encoding="utf-8")
        proc.send_signal(signal.SIGHUP)
        for _ in range(100):
            if (reply := _http("GET", readyz)).status_code == 200:
                break
            time.sleep(0.05)
        assert reply.json() == {"ready": True}
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
        stderr = "".join(read) + stderr
        assert proc.returncode == 0, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    issued, refused = (json.loads(text) for text in audit.read_text().splitlines())
    assert (issued["caller"], issued["outcome"]) == ("ci", "issued")
    assert (refused["outcome"], refused["reason"]) == ("refused", "unauthenticated")
    assert CANARY not in audit.read_text() and CANARY not in stderr
    assert not [key for key in API_KEYS.values() if key in stderr]
    assert "not-a-caller-key" not in stderr
    # The log: JSON lines with the shared fields; the refusal's line has its audit line's id.
    lines = log_lines(stderr)
    (said,) = [line for line in lines if line.get("request_id") == refused["request_id"]]
    assert (said["event"], said["reason"], said["level"]) == ("mint refused",
                                                              "unauthenticated", "info")
    assert issued["request_id"] and issued["request_id"] != refused["request_id"]
    (failed,) = [line for line in lines if line["level"] == "error"]
    assert (failed["event"], failed["part"], failed["why"]) == (
        "reload failed, keeping the previous", "callers", "SIGHUP"), failed
