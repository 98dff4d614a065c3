"""The admin listener's /healthz and /readyz on a real proxy: ready once every worker reports
rules, a writable audit log and its secret stores; not ready, naming why, while the audit log's
disk is full or a secret store is down past its grace; ready again when they recover. (The
drain's turn to not ready is in test_supervision.py.)"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import KEYS, client, rules_allowing
from tests.fulldisk import fill, small_tmpfs
from tests.harness import Origin, ProxyFactory, free_port, key_digest
from tests.integration.test_supervision import workers
from tests.vaultfake import VaultFake

VAULT_TOKEN = "hvs.readiness-token-5e1f"


def until(check: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    r = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    return r.status_code, r.json()


@pytest.fixture(scope="module")
def vault() -> Iterator[VaultFake]:
    with VaultFake() as server:
        server.add_kv_mount("kv", version=2)
        server.put("kv/ci/api", {"token": "vault-readiness-canary"})
        server.add_token(VAULT_TOKEN, paths=["kv/data/ci/*"])
        yield server


def test_two_workers_ready_then_a_secret_store_down_past_grace_and_back(
    tmp_path: Path, proxy_with: ProxyFactory, vault: VaultFake, origin_https: Origin
) -> None:
    token_file = tmp_path / "vault-token"
    token_file.write_text(VAULT_TOKEN)
    os.chmod(token_file, 0o600)
    rules = f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{origin_https.port}]
        inject:
          - secret: vault:kv/data/ci/api#token
            as: bearer
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
"""
    admin = free_port()
    with proxy_with(rules, directory=tmp_path, options=[
            "--workers", "2", "--admin", f"127.0.0.1:{admin}",
            "--secret-store", f"vault:{vault.url}?auth=token&token_file={token_file}",
            "--set", "sealgate_secret_ttl=1", "--set", "sealgate_secret_grace=1"]) as p:
        assert requests.get(f"http://127.0.0.1:{admin}/healthz", timeout=5).json() == {
            "ok": True}
        until(lambda: readyz(admin) == (200, {"ready": True, "workers": 2}), "both ready")
        url = f"https://api.test:{origin_https.port}/x"
        assert client(p).get(url, timeout=10).status_code == 200
        vault.down = True
        try:
            time.sleep(2.2)  # past the 1 s TTL and the 1 s grace
            r = client(p).get(url, timeout=20)
            assert (r.status_code, r.json()["reason"]) == (503, "secret_unavailable")
            _, said = until(lambda: (got := readyz(admin))[0] == 503 and got,
                                 "not ready for the store")
            assert said == {"ready": False,
                            "unready": ["secrets: the vault store is unavailable past its grace"]}
        finally:
            vault.down = False
        # The next request that reaches the store (in whichever worker failed) brings it back.
        until(lambda: client(p).get(url, timeout=10).status_code == 200 and readyz(admin)[0]
              == 200, "ready again once the store answers")


def test_a_full_audit_disk_is_not_ready_until_it_has_room(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    admin = free_port()
    rules = rules_allowing("api.test", origin_http.port)
    with small_tmpfs() as disk, proxy_with(rules, directory=tmp_path, options=[
            "--admin", f"127.0.0.1:{admin}", "--set", f"sealgate_audit_log={disk / 'audit.log'}"
    ]) as p:
        until(lambda: readyz(admin)[0] == 200, "ready")
        session = client(p)
        url = f"http://api.test:{origin_http.port}"
        filler = fill(disk)
        until(lambda: session.get(f"{url}/during", timeout=5).status_code == 503,
              "a refusal for the full disk")
        _, said = until(lambda: (got := readyz(admin))[0] == 503 and got, "not ready")
        assert said == {"ready": False, "unready": ["audit: the audit log cannot be written"]}
        filler.unlink()
        until(lambda: session.get(f"{url}/after", timeout=5).status_code == 200
              and readyz(admin)[0] == 200, "ready again with room on the disk")


def test_a_hung_worker_is_not_reporting_in_readyz_or_metrics(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    """Found by review: /metrics counted a worker that had stopped writing its snapshot as
    reporting, and summed its last gauges as now, while /readyz said it was not reporting."""
    admin = free_port()
    rules = rules_allowing("127.0.0.1", origin_http.port)
    with proxy_with(rules, directory=tmp_path,
                    options=["--workers", "2", "--admin", f"127.0.0.1:{admin}"]) as p:
        until(lambda: readyz(admin) == (200, {"ready": True, "workers": 2}), "both ready")
        assert _reporting(admin) == 2
        hung = workers(p)[1]
        os.kill(hung, signal.SIGSTOP)
        try:
            _, said = until(lambda: (got := readyz(admin))[0] == 503 and got, "not ready")
            assert said["unready"] == ["workers: 1 of 2 reporting"], said
            assert until(lambda: _reporting(admin) == 1 or None, "one reporting in /metrics")
        finally:
            os.kill(hung, signal.SIGCONT)
        until(lambda: readyz(admin)[0] == 200 and _reporting(admin) == 2, "both again")


def _reporting(admin: int) -> float:
    text = requests.get(f"http://127.0.0.1:{admin}/metrics", timeout=5).text
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith("sealgate_workers "))
