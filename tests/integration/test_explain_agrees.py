"""`sealgate rules explain` must say what the running proxy does: the same requests, asked of
both, get the same decision and reason code."""

from __future__ import annotations

import pytest

from sealgate.proxy.policy.explain import explain
from sealgate.proxy.policy.rulesfile import load_rules
from tests.conftest import client
from tests.harness import Origin, Proxy

CASES = [
    # (sandbox, method, host, path, decision, reason)
    ("bot-1", "GET", "api.test", "/agree/1", "allow", None),
    ("bot-1", "GET", "limited.test", "/ok/agree2", "allow", None),
    ("bot-1", "POST", "limited.test", "/ok/agree3", "deny", "not_allowed"),
    ("bot-1", "GET", "limited.test", "/nope/agree4", "deny", "not_allowed"),
    ("bot-1", "GET", "localhost", "/agree5", "deny", "localhost_name"),
    ("bot-1", "GET", "unlisted.test", "/agree6", "deny", "not_allowed"),
    ("bot-1", "GET", "127.0.0.1", "/agree7", "allow", None),
    ("rep-1", "GET", "127.0.0.1", "/agree8", "report", "not_allowed"),
    ("bot-1", "GET", "169.254.169.254", "/agree9", "deny", "not_allowed"),
]


@pytest.mark.parametrize(("sandbox", "method", "host", "path", "decision", "reason"), CASES)
def test_explain_matches_the_proxy(
    proxy: Proxy, origin_http: Origin, sandbox: str, method: str, host: str, path: str,
    decision: str, reason: str | None,
) -> None:
    url = f"http://{host}:{origin_http.port}{path}"
    said = explain(load_rules(proxy.rules), method, url, sandbox=sandbox)
    assert (said.decision, said.reason) == (decision, reason), said.detail

    client(proxy, sandbox).request(method, url, timeout=10)
    done = proxy.wait_audit(lambda e: e.get("event") == "request"
                            and e.get("sandbox") == sandbox and e.get("path") == path
                            and e.get("method") == method)
    assert (done["decision"], done["reason"]) == (decision, reason)
