"""The TypeScript client (`@sealgate/sandbox`, sandbox/clients/typescript) through a real daemon:
its own `node --test` suite, pointed at this package's daemon by SEALGATE_SANDBOXD. How node is
found and run is tests/tsclient.py's (shared with the Kubernetes backend's test of the client)."""

from __future__ import annotations

import re
import secrets
import subprocess
from pathlib import Path

from tests.harness import Proxy, free_port
from tests.tsclient import PACKAGE, find_node, node_env

from .conftest import Daemon, start_daemon


def test_the_typescript_client_drives_a_session(
    sandboxd: Daemon, dproxy: Proxy, tmp_path: Path
) -> None:
    """Every test file, none skipped: through the package's daemon on its unix socket, and
    through one over TCP (the bearer key's) started here."""
    node = find_node()
    files = sorted(str(f.relative_to(PACKAGE)) for f in (PACKAGE / "test").glob("*.test.js"))
    assert files, f"no tests under {PACKAGE / 'test'}"
    key = secrets.token_urlsafe(24)
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    port = free_port()
    tcp = start_daemon(dproxy, tmp_path, "--pool", "0", "--no-selftest",
                       "--listen", f"127.0.0.1:{port}", "--key-file", str(key_file))
    try:
        _run(node, files, sandboxd, {"SEALGATE_TEST_TCP": f"http://127.0.0.1:{port}",
                                     "SEALGATE_TEST_TCP_KEY": key})
        assert tcp.client.list() == []  # what the tests made over TCP they deleted
    finally:
        tcp.stop()


def _run(node: str, files: list[str], sandboxd: Daemon, extra: dict[str, str]) -> None:
    before = {s["id"] for s in sandboxd.client.list()}
    env = node_env(node, str(sandboxd.socket), {"SEALGATE_TEST_SANDBOX": "ci-bot",
                                                "SEALGATE_TEST_OTHER_SANDBOX": "other-bot",
                                                **extra})
    try:
        done = subprocess.run([node, "--test", "--test-reporter=tap", *files], cwd=PACKAGE,
                              env=env, capture_output=True, text=True, timeout=300, check=False)
    finally:  # never left to the package's other tests, whatever failed
        for info in sandboxd.client.list():
            if info["id"] not in before:
                sandboxd.client.call("DELETE", f"/v1/sandboxes/{info['id']}")
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert re.search(r"^# skipped 0$", report, re.MULTILINE), report  # the daemon's ran too
    assert re.search(r"^# fail 0$", report, re.MULTILINE), report
