"""`sealgate rules suggest`, end to end: a real proxy runs a policy in report mode while a client
makes requests (HTTPS through an intercepted CONNECT, and plain HTTP); the audit log it wrote
goes through `rules suggest`; the suggested entries, appended to the policy as its YAML says, with
the policy switched to enforce, make a second real proxy allow every one of those requests (they
reach the origins) and still refuse what was not seen (it reaches nothing)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.harness import SEALGATE, Origin, OriginCA, Proxy, ProxyFactory, key_digest

KEY = "suggest-key-71c2"


def _rules(mode: str, allow: list[dict[str, Any]]) -> str:
    return yaml.safe_dump({
        "version": 1,
        "policies": {"learner": {"mode": mode, "allow": allow,
                                 "allow_networks": ["127.0.0.1/32"]}},
        "sandboxes": {"learn-1": {"policy": "learner", "key_sha256": key_digest(KEY)}},
        "default_policy": None,
    })


@pytest.fixture(scope="module")
def origins(test_ca: OriginCA) -> Iterator[tuple[Origin, Origin]]:
    plain, tls = Origin(), Origin(tls=test_ca.issue("api.test", "a.svc.test"))
    yield plain, tls
    plain.stop()
    tls.stop()


def _session(proxy: Proxy, test_ca: OriginCA) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    url = proxy.url("learn-1", KEY)
    session.proxies = {"http": url, "https": url}
    bundle = proxy.workdir / "trust.pem"
    bundle.write_text(proxy.ca.read_text() + test_ca.path.read_text())
    session.verify = str(bundle)
    return session


def _workload(plain: Origin, tls: Origin) -> list[tuple[str, str]]:
    """What the sandbox did: many package downloads under one prefix, an API read and write,
    and a plain-HTTP call."""
    calls = [("GET", f"https://api.test:{tls.port}/packages/ab/cd/pkg{i}.whl") for i in range(8)]
    calls += [
        ("GET", f"https://api.test:{tls.port}/repos/o/r"),
        ("POST", f"https://api.test:{tls.port}/repos/o/r/issues"),
        ("GET", f"https://a.svc.test:{tls.port}/health"),
        ("GET", f"http://api.test:{plain.port}/v1/ping"),
    ]
    return calls


def _send(session: requests.Session, calls: list[tuple[str, str]]) -> list[int]:
    return [session.request(method, url, timeout=20).status_code for method, url in calls]


def test_suggested_rules_allow_what_report_mode_saw_and_nothing_else(
    proxy_with: ProxyFactory, origins: tuple[Origin, Origin], test_ca: OriginCA,
    tmp_path: Path,
) -> None:
    plain, tls = origins
    calls = _workload(plain, tls)
    with proxy_with(_rules("report", []), name="suggest-report") as reporting:
        assert _send(_session(reporting, test_ca), calls) == [200] * len(calls)
        reporting.wait_audit(lambda line: line.get("path") == "/v1/ping", timeout=30)
        audit = tmp_path / "audit.log"
        audit.write_text(reporting.audit_text())
        rules_file = reporting.rules
    assert all(line["decision"] == "report" for line in map(json.loads, audit.read_text()
               .splitlines()) if line.get("event") == "request")

    done = subprocess.run([*SEALGATE, "rules", "suggest", str(rules_file), "--from", str(audit)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    patch = yaml.safe_load(done.stdout)
    learned = patch["policies"]["learner"]["allow"]
    # Exact names only; the eight downloads became one prefix; GET and POST never share a rule.
    assert {rule["host"] for rule in learned} == {"api.test", "a.svc.test"}
    paths = [p for rule in learned for p in rule.get("paths", [])]
    assert "/packages/ab/cd/**" in paths and "/**" not in paths
    assert [r["methods"] for r in learned if "/repos/o/r/issues" in r.get("paths", [])] == [
        ["POST"]]

    # Applied and enforced: the same run passes, and each request reaches its origin.
    enforcing_rules = tmp_path / "enforce.yaml"
    enforcing_rules.write_text(_rules("enforce", learned))
    check = subprocess.run([*SEALGATE, "rules", "check", "--strict", str(enforcing_rules)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    plain.reset()
    tls.reset()
    with proxy_with(enforcing_rules, name="suggest-enforce", clean_stderr=True) as enforcing:
        session = _session(enforcing, test_ca)
        assert _send(session, calls) == [200] * len(calls)
        arrived = sorted((s.method, s.path) for s in plain.requests + tls.requests)
        assert arrived == sorted((m, "/" + u.split("/", 3)[3]) for m, u in calls)
        # Not seen, not allowed: another method, a path beside the prefix, another host.
        unseen = [("DELETE", f"https://api.test:{tls.port}/repos/o/r"),
                  ("GET", f"https://api.test:{tls.port}/packages/other"),
                  ("POST", f"https://api.test:{tls.port}/packages/ab/cd/pkg1.whl"),
                  ("GET", f"http://api.test:{plain.port}/v1/other")]
        plain.reset()
        tls.reset()
        assert _send(session, unseen) == [403] * len(unseen)
        assert plain.untouched() and tls.untouched()
