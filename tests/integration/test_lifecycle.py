"""Starting, reloading and stopping: broken rules, SIGHUP, file changes, workers, mitmdump -s."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import KEYS, client, rules_allowing
from tests.dnsstub import StubDNS
from tests.harness import (
    ROOT,
    SEALGATE,
    Origin,
    Proxy,
    ProxyFactory,
    free_port,
    key_digest,
)
from tests.security.rawclient import proxy_auth, read_response, request_bytes


def test_broken_rules_at_start_fail_clearly(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "version: 1\npolicies:\n  ci:\n    allow:\n      - host: a.test\n        ports: [0]\n"
    )
    result = subprocess.run(
        [*SEALGATE, "proxy", "--listen", f"127.0.0.1:{free_port()}", "--rules", str(rules),
         "--state", str(tmp_path / "state")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert "rules.yaml:6" in result.stderr
    assert "ports" in result.stderr
    assert "Traceback" not in result.stderr


def wait_status(session: requests.Session, url: str, status: int, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    got = -1
    while time.monotonic() < deadline:
        got = session.get(url, timeout=5).status_code
        if got == status:
            return got
        time.sleep(0.2)
    return got


def test_reload_on_change_and_sighup_keeps_old_rules_when_broken(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    with proxy_with(rules_allowing("api.test", origin_http.port), directory=tmp_path) as p:
        session = client(p)
        a_url = f"http://api.test:{origin_http.port}/"
        b_url = f"http://a.svc.test:{origin_http.port}/"
        assert session.get(a_url, timeout=5).status_code == 200
        assert session.get(b_url, timeout=5).status_code == 403

        # A valid change is picked up by the file watcher.
        p.rules.write_text(rules_allowing("a.svc.test", origin_http.port))
        assert wait_status(session, b_url, 200) == 200
        assert session.get(a_url, timeout=5).status_code == 403

        # A broken file on SIGHUP keeps the rules in force and says why.
        p.rules.write_text("version: 1\npolicies: [oops\n")
        p.signal(signal.SIGHUP)
        p.wait_audit(lambda e: e["event"] == "rules_reload_failed")
        assert session.get(b_url, timeout=5).status_code == 200
        assert "keeping the previous rules" in p.stderr()


def test_a_spent_budget_is_refused_a_second_late(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    """A client ignoring Retry-After gets at most one refusal per connection per second: the
    proxy's cheapest answer cannot be made its busiest work (docs/reliability.md, fairness)."""
    extra = """    budgets:
      requests_per_second: 0.01
      burst: 1
      max_connections: 1
"""
    rules = rules_allowing("api.test", origin_http.port).replace(
        "    allow_networks: [127.0.0.1/32]\n", "    allow_networks: [127.0.0.1/32]\n" + extra
    )
    with proxy_with(rules, directory=tmp_path) as p:
        session = client(p)
        assert session.get(f"http://api.test:{origin_http.port}/1", timeout=5).status_code == 200
        origin_http.reset()
        started = time.monotonic()
        refused = session.get(f"http://api.test:{origin_http.port}/2", timeout=5)
        took = time.monotonic() - started
        assert (refused.status_code, refused.json()["reason"]) == (429, "budget_exceeded")
        assert 0.9 <= took < 3
        assert not origin_http.requests
        # The connection budget's refusal too: a second connection while the first is open.
        with socket.create_connection(("127.0.0.1", p.port), timeout=5) as sock:
            started = time.monotonic()
            sock.sendall(request_bytes("CONNECT", f"api.test:{origin_http.port}", [
                ("Host", f"api.test:{origin_http.port}"),
                ("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"]))]))
            assert read_response(sock).status == 429
            assert 0.9 <= time.monotonic() - started < 3


def test_budget_rate_limit_429(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    extra = """    budgets:
      requests_per_second: 1
      burst: 3
"""
    rules = rules_allowing("api.test", origin_http.port).replace(
        "    allow_networks: [127.0.0.1/32]\n", "    allow_networks: [127.0.0.1/32]\n" + extra
    )
    with proxy_with(rules, directory=tmp_path) as p:
        session = client(p)
        statuses = [session.get(f"http://api.test:{origin_http.port}/b", timeout=5).status_code
                    for _ in range(6)]
        assert statuses[:3] == [200, 200, 200]
        assert 429 in statuses[3:]
        denied = session.get(f"http://api.test:{origin_http.port}/b", timeout=5)
        if denied.status_code == 429:
            assert denied.json()["reason"] == "budget_exceeded"
            assert int(denied.headers["Retry-After"]) >= 1


def test_request_body_budget_413(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    extra = """    budgets:
      max_request_bytes: 1000
"""
    rules = rules_allowing("api.test", origin_http.port).replace(
        "    allow_networks: [127.0.0.1/32]\n", "    allow_networks: [127.0.0.1/32]\n" + extra
    )
    origin_http.reset()
    with proxy_with(rules, directory=tmp_path) as p:
        r = client(p).post(f"http://api.test:{origin_http.port}/up", data=b"x" * 5000, timeout=5)
        assert r.status_code == 413
        assert r.json()["reason"] == "request_too_large"
    assert origin_http.untouched()


def test_two_workers_share_the_port(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    with proxy_with(rules_allowing("api.test", origin_http.port), directory=tmp_path,
                    options=["--workers", "2"]) as p:
        session = client(p)
        for _ in range(20):
            fresh = requests.Session()
            fresh.trust_env = False
            fresh.proxies = session.proxies
            assert fresh.get(f"http://api.test:{origin_http.port}/w", timeout=5).status_code == 200
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            started = {line["pid"] for line in p.audit() if line["event"] == "proxy_started"}
            served = sum(1 for line in p.audit() if line.get("path") == "/w")
            if len(started) == 2 and served == 20:
                break
            time.sleep(0.1)
        assert len(started) == 2, p.audit_text()
        assert served == 20
    assert p.process.returncode == 0


def test_loads_with_plain_mitmdump(tmp_path: Path, origin_http: Origin, dns: StubDNS) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_allowing("api.test", origin_http.port))
    port = free_port()
    log = (tmp_path / "mitmdump.log").open("wb")
    process = subprocess.Popen(
        [str(Path(SEALGATE[0]).parent / "mitmdump"), "-q", "--listen-host", "127.0.0.1",
         "-p", str(port), "-s", str(ROOT / "proxy" / "addon.py"),
         "--set", f"sealgate_rules={rules}", "--set", f"sealgate_state={tmp_path / 'state'}",
         "--set", f"sealgate_resolver={dns.address[0]}:{dns.address[1]}",
         "--set", "connection_strategy=lazy"],
        cwd=ROOT, stdout=log, stderr=log,
    )
    try:
        session = requests.Session()
        session.trust_env = False
        url = f"http://bot-1:{KEYS['bot-1']}@127.0.0.1:{port}"
        session.proxies = {"http": url}
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline:
            try:
                status = session.get(f"http://api.test:{origin_http.port}/m", timeout=5).status_code
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        assert status == 200
        denied = session.get(f"http://evil.test:{origin_http.port}/", timeout=5)
        assert denied.status_code == 403
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_clean_shutdown(tmp_path: Path, origin_http: Origin, dns: StubDNS, sig: int) -> None:
    """With idle keep-alive connections open, as a client pool leaves them: Python 3.11's
    asyncio wrote a CancelledError traceback for each handler the shutdown cancelled."""
    p = Proxy(tmp_path, rules_allowing("api.test", origin_http.port), resolver=dns.address)
    sessions = [client(p) for _ in range(3)]
    for session in sessions:
        assert session.get(f"http://api.test:{origin_http.port}/", timeout=10).status_code == 200
    p.signal(sig)
    assert p.process.wait(timeout=15) == 0
    assert "Traceback" not in p.stderr() and "Exception in callback" not in p.stderr()
    p.stop()
    for session in sessions:
        session.close()


def test_unwritable_audit_log_fails_closed(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    origin_http.reset()
    with proxy_with(rules_allowing("api.test", origin_http.port), directory=tmp_path,
                    options=["--set", "sealgate_audit_log=/dev/full"]) as p:
        r = client(p).get(f"http://api.test:{origin_http.port}/full", timeout=5)
        assert r.status_code == 503
        assert r.json()["reason"] == "audit_unavailable"
    assert origin_http.untouched()


def test_reload_applies_to_open_tunnels(
    tmp_path: Path, origin_https: Origin, proxy_with: ProxyFactory
) -> None:
    def rules(methods: str) -> str:
        return rules_allowing("api.test", origin_https.port).replace(
            f"        ports: [{origin_https.port}]\n",
            f"        ports: [{origin_https.port}]\n        methods: [{methods}]\n",
        )

    with proxy_with(rules("GET"), directory=tmp_path) as p:
        session = client(p)  # one pooled, intercepted tunnel for both requests
        url = f"https://api.test:{origin_https.port}/t"
        assert session.get(url, timeout=5).status_code == 200
        p.rules.write_text(rules("POST"))
        assert wait_status(session, url, 403) == 403
        assert session.post(url, timeout=5).status_code == 200


def test_bad_secret_store_at_start_names_the_store(tmp_path: Path) -> None:
    result = subprocess.run(
        [*SEALGATE, "proxy", "--listen", f"127.0.0.1:{free_port()}", "--rules",
         str(ROOT / "rules"), "--state", str(tmp_path / "state"),
         "--secret-store", "vault:https://127.0.0.1:1?auth=bogus"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert "secret stores" in result.stderr and "bogus" in result.stderr
    assert "Traceback" not in result.stderr


def test_file_added_to_rules_directory_is_picked_up(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "base.yaml").write_text(rules_allowing("api.test", origin_http.port))
    with proxy_with(rules_dir, directory=tmp_path) as p:
        session = client(p)
        late = p.url("late-1", "late-key")
        session.proxies = {"http": late}
        url = f"http://api.test:{origin_http.port}/late"
        assert session.get(url, timeout=5).status_code == 407
        (rules_dir / "late.yaml").write_text(
            f'sandboxes:\n  late-1: {{policy: ci, key_sha256: "{key_digest("late-key")}"}}\n'
            "version: 1\n"
        )
        assert wait_status(session, url, 200) == 200
