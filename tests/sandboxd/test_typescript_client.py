"""The TypeScript client (`@sealgate/sandbox`, sandbox/clients/typescript) through a real daemon:
its own `node --test` suite, pointed at this package's daemon by SEALGATE_SANDBOXD.

The client is plain JavaScript with nothing to build and no runtime dependency, so only `node`
(>= 20) is needed here; `make ts-client` installs its dev dependencies and type-checks it before
pytest (the test session's network namespace cannot reach npm)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness import ROOT, Proxy, free_port

from .conftest import Daemon, start_daemon

PACKAGE = ROOT / "sandbox" / "clients" / "typescript"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on PATH: the TypeScript client's tests need Node.js >= 20")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout.strip()
    major = re.match(r"v(\d+)\.", version)
    if major is None or int(major.group(1)) < 20:
        pytest.skip(f"node {version or '?'} is older than the client's 20")
    return node


def test_the_typescript_client_drives_a_session(
    sandboxd: Daemon, dproxy: Proxy, tmp_path: Path
) -> None:
    """Every test file, none skipped: through the package's daemon on its unix socket, and
    through one over TCP (the bearer key's) started here."""
    node = _node()
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
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(PACKAGE),
           "SEALGATE_SANDBOXD": str(sandboxd.socket), "SEALGATE_TEST_SANDBOX": "ci-bot",
           "SEALGATE_TEST_OTHER_SANDBOX": "other-bot", "NO_COLOR": "1", **extra}
    # Node 20 and 21 have the global WebSocket (the client's terminals) behind a flag.
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    if re.match(r"v2[01]\.", version):
        env["NODE_OPTIONS"] = "--experimental-websocket"
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
