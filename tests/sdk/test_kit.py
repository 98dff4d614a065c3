"""The promises the SDK tests rest on: a call sees exactly the environment it was given, in a
fresh interpreter or a forkserver's child alike, and nothing of the test process's; and the
CA bundle `sealgate env` points a client at can be read by that client."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.harness import ROOT, SEALGATE
from tests.sdk.kit import Forkserver, run_python

ENVIRON = """
def main():
    import os, sys
    return {"environ": dict(os.environ), "loaded": "email.mime.text" in sys.modules,
            "argv": sys.argv[1:]}
"""


@pytest.fixture()
def marker(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SEALGATE_SDK_TEST_LEAK", "leaked")  # in the test process only
    return "leaked"


def test_a_fresh_interpreter_gets_exactly_the_environment(marker: str) -> None:
    got = run_python(ENVIRON, {"HTTPS_PROXY": "http://a:b@127.0.0.1:1"}).ok()
    # Python's own locale coercion (PEP 538) may add LC_CTYPE when no locale is set.
    got["environ"].pop("LC_CTYPE", None)
    assert got["environ"] == {"HTTPS_PROXY": "http://a:b@127.0.0.1:1"}
    assert not got["loaded"]


def test_a_forkserver_child_gets_exactly_the_environment(marker: str, tmp_path: Path) -> None:
    server = Forkserver(tmp_path, ["email.mime.text"])
    try:
        first = server.run(ENVIRON, {"A": "1", "B": "two"}).ok()
        second = server.run(ENVIRON, {}).ok()
    finally:
        server.stop()
    for got in (first, second):
        got["environ"].pop("LC_CTYPE", None)
    assert (first["environ"], second["environ"]) == ({"A": "1", "B": "two"}, {})
    assert first["loaded"] and second["loaded"]
    assert "SEALGATE_SDK_TEST_LEAK" in os.environ


def _env_bundle(state: Path, *extra: str) -> Path:
    made = subprocess.run([*SEALGATE, "ca", "--create", "--state", str(state)], cwd=ROOT,
                          capture_output=True, text=True, timeout=30, check=False)
    assert made.returncode == 0, made.stderr
    done = subprocess.run([*SEALGATE, "env", "--state", str(state), "--proxy", "127.0.0.1:8080",
                           "--format", "json", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    bundle = Path(json.loads(done.stdout)["SSL_CERT_FILE"])
    assert bundle.read_text().endswith((state / "ca" / "mitmproxy-ca-cert.pem").read_text())
    return bundle


def _readable_by_others(top: Path, bundle: Path) -> list[str]:
    """What below `top` keeps a user other than the owner from reading `bundle`."""
    blocked = [f"{d} is {oct(d.stat().st_mode & 0o777)}" for d in bundle.parents
               if d.is_relative_to(top) and d != top and not d.stat().st_mode & 0o001]
    if not bundle.stat().st_mode & 0o004:
        blocked.append(f"{bundle} is {oct(bundle.stat().st_mode & 0o777)}")
    return blocked


def test_a_bundle_written_where_asked_is_readable_by_other_users(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir(mode=0o755)
    bundle = _env_bundle(tmp_path / "state", "--bundle", str(tmp_path / "out" / "bundle.pem"))
    assert _readable_by_others(tmp_path, bundle) == []


def test_the_default_bundle_says_who_cannot_read_it(tmp_path: Path) -> None:
    """The default bundle sits beside the CA's key, in <state>/ca (0700, on purpose): `sealgate
    env` says so on stderr, and that --bundle puts it where another user can read it."""
    state = tmp_path / "state"
    _env_bundle(state)
    done = subprocess.run([*SEALGATE, "env", "--state", str(state), "--proxy", "127.0.0.1:8080"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0
    assert "another user needs --bundle" in done.stderr
    out = Path(tempfile.mkdtemp(prefix="sealgate-bundle-"))  # not under pytest's 0700 tree
    try:
        out.chmod(0o755)
        done = subprocess.run([*SEALGATE, "env", "--state", str(state), "--proxy",
                               "127.0.0.1:8080", "--bundle", str(out / "b.pem")],
                              cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0 and "--bundle" not in done.stderr, done.stderr
    finally:
        shutil.rmtree(out, ignore_errors=True)
