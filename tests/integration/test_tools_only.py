"""`tools_only` rules (docs/rules.md): a rule kept for sealgate's own calls (declared MCP tools,
the MCP gateway's upstreams) is never a proxied request's, nor an `http_request` call's (the
agent's own request in another form: review found it reached an MCP server's unlisted tools
with the gateway's bearer). Without it, the rule
that lets the gateway inject an upstream MCP server's credential also let a sandbox POST to that
server straight through the proxy, with the credential injected: any tool, no argument
constraint (found by a test of the gateway from inside a sandbox). Checked at the origin, through
the real proxy, and with `rules explain` / `rules explain-tool`, which decide as both paths do.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import KEYS, client
from tests.dnsstub import StubDNS
from tests.harness import ROOT, SEALGATE, Origin, OriginCA, Proxy, ProxyFactory, key_digest
from tests.mcpkit import McpServer, basic, needs_mcp_venv

CANARY = "tools-only-canary-9f3e1c"


@pytest.fixture(scope="module")
def origin(test_ca: OriginCA) -> Iterator[Origin]:
    made = Origin(tls=test_ca.issue("api.test", "limited.test"))
    yield made
    made.stop()


def _rules(port: int) -> str:
    return f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{port}]
        methods: [POST]
        paths: ["/mcp"]
        tools_only: true
        inject:
          - {{secret: "file:mcp_token", as: bearer, name: docs_mcp}}
      - host: limited.test
        ports: [{port}]
        methods: [GET]
    allow_networks: [127.0.0.1/32]
    http_request: {{methods: [GET, POST]}}
    mcp_servers:
      - name: docs
        url: https://api.test:{port}/mcp
        credential: docs_mcp
        tools:
          - name: search
  open:
    allow:
      - host: api.test
        ports: [{port}]
        methods: [POST]
        paths: ["/mcp"]
        inject:
          - {{secret: "file:mcp_token", as: bearer}}
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
  rep-1: {{policy: open, key_sha256: "{key_digest(KEYS['rep-1'])}"}}
"""


@pytest.fixture(scope="module")
def rules_file(origin: Origin, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tools-only") / "rules.yaml"
    path.write_text(_rules(origin.port))
    return path


@pytest.fixture(scope="module")
def tproxy(proxy_with: ProxyFactory, rules_file: Path) -> Iterator[Proxy]:
    with proxy_with(rules_file.read_text(), name="tools-only", secrets={"mcp_token": CANARY},
                    canaries=(CANARY,)) as p:
        yield p


def test_a_tools_only_rule_is_no_proxied_requests(tproxy: Proxy, origin: Origin) -> None:
    origin.reset()
    r = client(tproxy, "bot-1").post(f"https://api.test:{origin.port}/mcp", json={}, timeout=20)
    assert r.status_code == 403 and r.json()["reason"] == "not_allowed"
    assert CANARY not in r.text
    assert origin.untouched()  # not a connection, not a byte
    # The policy's other rule still serves it: the refusal is the rule's, not the policy's.
    assert client(tproxy, "bot-1").get(f"https://limited.test:{origin.port}/x",
                                       timeout=20).status_code == 200


def test_the_same_rule_without_it_injects_for_a_proxied_request(
        tproxy: Proxy, origin: Origin) -> None:
    """The hole the flag closes, open: the test above would fail on a rule without it."""
    origin.reset()
    r = client(tproxy, "rep-1").post(f"https://api.test:{origin.port}/mcp", json={}, timeout=20)
    assert r.status_code == 200
    (seen,) = [s for s in origin.requests if s.path == "/mcp"]
    assert seen.headers["authorization"] == f"Bearer {CANARY}"


def _explain(*args: str) -> dict[str, object]:
    done = subprocess.run([*SEALGATE, "rules", *args, "--json"], cwd=ROOT, capture_output=True,
                          timeout=60, check=False)
    said: dict[str, object] = json.loads(done.stdout)
    return said


def test_explain_says_which_path_the_rule_serves(rules_file: Path, origin: Origin) -> None:
    proxied = _explain("explain", str(rules_file), "POST", f"https://api.test:{origin.port}/mcp",
                       "--sandbox", "bot-1")
    assert proxied["decision"] == "deny"
    assert "tools_only" in json.dumps(proxied)
    called = _explain("explain-tool", str(rules_file), "docs/search", "--sandbox", "bot-1")
    assert called["decision"] == "allow"


def test_a_gateway_credential_on_a_proxied_rule_is_warned_of(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(_rules(443).replace("        tools_only: true\n", ""))
    done = subprocess.run([*SEALGATE, "rules", "check", str(rules)], cwd=ROOT,
                          capture_output=True, timeout=60, check=False)
    said = done.stdout.decode() + done.stderr.decode()
    assert "proxied_credential" in said and "'docs'" in said
    rules.write_text(_rules(443))
    done = subprocess.run([*SEALGATE, "rules", "check", str(rules)], cwd=ROOT,
                          capture_output=True, timeout=60, check=False)
    assert "proxied_credential" not in done.stdout.decode() + done.stderr.decode()


@needs_mcp_venv()
def test_http_request_is_no_tool_call_to_a_tools_only_rule(
        origin: Origin, rules_file: Path, dns: StubDNS, test_ca: OriginCA, tmp_path: Path
) -> None:
    """The generic tool asks as the proxy does: the gateway's rule does not serve it, so an
    agent cannot POST to the MCP server past the gateway's tool list with its bearer, while a
    rule for the proxy's requests still serves it (the control)."""
    dns.set("api.test", "A 127.0.0.1")
    dns.set("limited.test", "A 127.0.0.1")
    origin.reset()
    server = McpServer(tmp_path, rules_file.read_text(), resolver=dns.address,
                       upstream_ca=test_ca.path, secrets={"mcp_token": CANARY})
    try:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": {"name": "delete_repo", "arguments": {}}})
        got, printed = server.client([
            {"call": "http_request", "arguments": {
                "method": "POST", "url": f"https://api.test:{origin.port}/mcp",
                "headers": {"Content-Type": "application/json"}, "body": body}},
            {"call": "http_request", "arguments": {
                "method": "GET", "url": f"https://limited.test:{origin.port}/control"}}],
            authorization=basic("bot-1", KEYS["bot-1"]))
    finally:
        server.stop()
    refused, control = got["steps"]
    assert refused["result"]["is_error"] and "not_allowed" in refused["result"]["text"], refused
    assert control["result"]["is_error"] is False, control
    assert [s.path for s in origin.requests] == ["/control"]  # nothing of the refused call
    assert CANARY not in printed + server.stderr() + server.audit_text()
    called = _explain("explain-tool", str(rules_file), "http_request", "--sandbox", "bot-1",
                      "--arguments", json.dumps({"method": "POST",
                                                 "url": f"https://api.test:{origin.port}/mcp"}))
    assert called["decision"] == "deny", called
