"""npm, unchanged, through a real proxy to a fake registry over HTTPS, with what `sealgate env`
prints and an npmrc that names a `cafile` of its own (Debian's images often do).

npm hands Node its `cafile` in place of Node's roots, so `NODE_EXTRA_CA_CERTS` is dropped and
the proxy's CA is not trusted: without `npm_config_cafile` (which overrides every npmrc) npm
fails certificate verification, after 70 s of retries by default.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.sdk.kit import CALL_TIMEOUT, Arrived, Reply, World, policy, rule, rules_file, world

NPM = "/usr/bin/npm"
if shutil.which(NPM) is None:
    pytest.skip("needs npm (/usr/bin/npm)", allow_module_level=True)

HOST = "registry.npm.test"
SYSTEM_ROOTS = Path("/etc/ssl/certs/ca-certificates.crt")  # an npmrc's cafile, without our CA
KEYS = {"npm-1": "npm-key-never-used-1"}  # the rules need a sandbox; npm runs as none


def rules(port: int) -> str:
    return rules_file([policy("anon", rule(HOST, [port], methods=["GET"]))],
                      {"npm-1": ("anon", KEYS["npm-1"])}, default="anon")


def route(seen: Arrived) -> Reply:
    return Reply(body={})  # npm ping reads any JSON object as the registry's pong


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    with world(tmp_path_factory.mktemp("sdk-npm"), test_ca, dns, [HOST], route, rules, KEYS,
               "npm-unused-secret-5d7f9b1c") as made:
        yield made


def npm_ping(w: World, home: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [NPM, "ping", "--registry", f"https://{HOST}:{w.fake.port}/"],
        env={**env, "HOME": str(home), "PATH": "/usr/bin:/bin",
             "npm_config_cache": str(home / "cache"), "npm_config_update_notifier": "false",
             # One try: the failure this guards against is otherwise 70 s of retries.
             "npm_config_fetch_retries": "0"},
        cwd=home, capture_output=True, text=True, timeout=CALL_TIMEOUT, check=False)


def test_npm_with_its_own_cafile_trusts_the_proxy(w: World, tmp_path: Path) -> None:
    if not SYSTEM_ROOTS.exists():
        pytest.skip(f"needs the system's roots at {SYSTEM_ROOTS}")
    (tmp_path / ".npmrc").write_text(f"cafile={SYSTEM_ROOTS}\n")
    env = w.env(None)
    w.fake.reset()
    done = npm_ping(w, tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert "PONG" in done.stderr, done.stderr
    seen = w.fake.last()
    assert (seen.method, seen.path.partition("?")[0]) == ("GET", "/-/ping")
    assert env["npm_config_cafile"] == env["SSL_CERT_FILE"]
    # What the variable is for: without it the npmrc's cafile wins and the proxy's CA is not
    # trusted (NODE_EXTRA_CA_CERTS, set all along, does not help).
    del env["npm_config_cafile"]
    w.fake.reset()
    failed = npm_ping(w, tmp_path, env)
    assert failed.returncode != 0, failed.stderr
    assert "certificate" in failed.stderr, failed.stderr
    assert w.fake.untouched()
