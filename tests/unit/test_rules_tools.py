"""`sealgate rules`: explain, test cases and diff, in process; the CLI's exit codes and output."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sealgate.proxy.policy.cases import load_cases, run_case
from sealgate.proxy.policy.diff import diff
from sealgate.proxy.policy.explain import ExplainError, explain
from sealgate.proxy.policy.explaintool import explain_tool
from sealgate.proxy.policy.model import RuleSet
from sealgate.proxy.policy.rulesfile import RulesError, load_rules

KEY = "0" * 63 + "1"
RULES = f"""
version: 1
policies:
  ci:
    mode: enforce
    allow:
      - host: api.example.com
        ports: [443]
        methods: [GET]
        paths: ["/v1/**"]
      - host: api.example.com
        ports: [443]
        methods: [POST]
        paths: ["/v1/comments"]
        inject: [{{secret: "file:api_key", as: bearer}}]
      - host: internal.example.com
        ports: [80]
        inject: [{{secret: "file:api_key", as: bearer}}]
      - host: 10.1.2.3
        ports: [80]
        plain_http: true
        inject: [{{secret: "file:api_key", as: bearer}}]
      - host: "*.cdn.example.com"
        ports: [443]
      - host: localhost
        ports: [80]
      - host: "*"
        ports: [8080]
      - host: 169.254.169.254
        ports: [80]
      - host: 10.9.9.9
        ports: [80]
    allow_networks: [10.1.2.0/24]
  watcher:
    mode: report
    allow:
      - host: api.example.com
        ports: [443]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{KEY}"}}
  new-1: {{policy: watcher, key_sha256: "{KEY}"}}
default_policy: null
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture()
def rules(tmp_path: Path) -> RuleSet:
    return load_rules(write(tmp_path, "rules.yaml", RULES))


@pytest.mark.parametrize(("method", "url", "decision", "reason", "host"), [
    ("GET", "https://api.example.com/v1/users", "allow", None, "api.example.com"),
    ("POST", "https://api.example.com/v1/comments", "allow", None, "api.example.com"),
    ("DELETE", "https://api.example.com/v1/users", "deny", "not_allowed", None),
    ("GET", "https://api.example.com/v2/users", "deny", "not_allowed", None),
    ("GET", "https://a.b.cdn.example.com/x.js", "allow", None, "*.cdn.example.com"),
    ("GET", "https://cdn.example.com/x.js", "deny", "not_allowed", None),  # not the apex
    # Passed through undecrypted: the proxy never sees this path, so it cannot refuse it.
    ("GET", "https://a.cdn.example.com/a//b", "allow", None, "*.cdn.example.com"),
    ("GET", "https://anything.example.org:8080/", "allow", None, "*"),
    ("GET", "http://localhost/", "deny", "localhost_name", "localhost"),
    # `*` never matches an IP literal: only a rule naming the address does.
    ("GET", "http://10.1.2.99:8080/", "deny", "not_allowed", None),
    ("GET", "http://169.254.169.254/latest", "deny", "metadata", "169.254.169.254"),
    ("GET", "http://10.9.9.9/", "deny", "private", "10.9.9.9"),
    ("GET", "http://internal.example.com/", "deny", "insecure_upstream", "internal.example.com"),
    ("GET", "http://10.1.2.3/", "allow", None, "10.1.2.3"),  # plain_http into allow_networks
    ("GET", "https://api.example.com/v1/../admin", "deny", "path_invalid", None),
    ("GET", "ftp://api.example.com/", "deny", "scheme_invalid", None),
    ("GET", "https://user:pw@api.example.com/v1/", "deny", "host_userinfo", None),
])
def test_explain_decides_as_the_proxy_would(
    rules: RuleSet, method: str, url: str, decision: str, reason: str | None, host: str | None
) -> None:
    got = explain(rules, method, url, sandbox="bot-1")
    assert (got.decision, got.reason) == (decision, reason), got.detail
    assert (got.rule.host if got.rule else None) == host


def test_explain_says_why_rules_for_the_host_did_not_match(rules: RuleSet) -> None:
    got = explain(rules, "PUT", "https://api.example.com/v1/comments", sandbox="bot-1")
    assert [m.why for m in got.misses] == [
        "method PUT is not in ['GET']", "method PUT is not in ['POST']",
        "port 443 is not in [8080]",  # the `*` rule
    ]
    assert explain(rules, "GET", "https://api.example.com:8443/v1/", sandbox="bot-1").misses[0] \
        .why == "port 8443 is not in [443]"


def test_explain_report_mode_and_identity(rules: RuleSet) -> None:
    got = explain(rules, "GET", "https://elsewhere.example.org/", sandbox="new-1")
    assert (got.decision, got.reason, got.mode) == ("report", "not_allowed", "report")
    got = explain(rules, "GET", "https://api.example.com/v1/")
    assert (got.decision, got.reason) == ("deny", "identity_required")
    assert explain(rules, "GET", "https://api.example.com/v1/x", policy="ci").decision == "allow"
    with pytest.raises(ExplainError, match="no sandbox 'ghost'"):
        explain(rules, "GET", "https://api.example.com/", sandbox="ghost")
    with pytest.raises(ExplainError, match="no policy 'ghost'"):
        explain(rules, "GET", "https://api.example.com/", policy="ghost")


def test_explain_tells_whether_tls_is_intercepted(rules: RuleSet) -> None:
    assert explain(rules, "GET", "https://x.cdn.example.com/", sandbox="bot-1").tunnel is True
    # Method and path rules need the requests inside: intercepted.
    assert explain(rules, "GET", "https://api.example.com/v1/", sandbox="bot-1").tunnel is False


def test_explain_json_names_credentials_by_reference_only(rules: RuleSet) -> None:
    out = explain(rules, "POST", "https://api.example.com/v1/comments", sandbox="bot-1").to_json()
    assert out["injects"] == ["bearer from file:api_key: Authorization: Bearer <secret>"]
    assert out["decision"] == "allow" and out["rule"].endswith("rules.yaml:11")


# -- test cases --------------------------------------------------------------------------------


CASES = """
cases:
  - name: reads the API
    sandbox: bot-1
    request: GET https://api.example.com/v1/users
    expect: allow
    rule: rules.yaml:7
  - name: metadata denied
    sandbox: bot-1
    request: GET http://169.254.169.254/
    expect: deny
    reason: metadata
  - name: wrong on purpose
    policy: ci
    request: DELETE https://api.example.com/v1/users
    expect: allow
  - name: unknown sandbox
    sandbox: ghost
    request: GET https://api.example.com/
    expect: deny
"""


def test_cases_pass_and_fail_with_reasons(tmp_path: Path, rules: RuleSet) -> None:
    outcomes = [run_case(rules, c) for c in load_cases(write(tmp_path, "cases.yaml", CASES))]
    assert [o.passed for o in outcomes] == [True, True, False, False]
    assert outcomes[2].failures == (
        "expected allow, got deny (not_allowed: DELETE api.example.com:443/v1/users is not "
        "allowed)",
    )
    assert outcomes[3].failures == ("no sandbox 'ghost' in the rules",)
    assert outcomes[0].case.where.endswith("cases.yaml:3")


@pytest.mark.parametrize(("text", "error"), [
    ("cases: []\n", "cases: no cases"),
    ("cases:\n  - {name: a, request: GET https://x.example/, expect: maybe}\n",
     "cases[0].expect: expected one of: allow, deny, report"),
    ("cases:\n  - {name: a, request: https://x.example/, expect: allow}\n",
     "cases[0].request: write the method, a space and the URL"),
    ("cases:\n  - {name: a, request: GET https://x.example/, expect: allow, expect: deny}\n",
     "cases[0].expect: duplicate key"),
    ("cases:\n  - {name: a, request: GET https://x.example/, expect: allow, color: red}\n",
     "cases[0].color: unknown key"),
    ("cases:\n  - {name: a, expect: allow}\n", "cases[0].request: required key is missing"),
    ("cases:\n  - {name: a, sandbox: b, policy: c, request: GET https://x/, expect: allow}\n",
     "cases[0]: give a sandbox or a policy, not both"),
    ("tests: []\n", "tests: unknown key"),
])
def test_malformed_case_files_say_where(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(RulesError, match=error.replace("[", r"\[").replace("]", r"\]")):
        load_cases(write(tmp_path, "cases.yaml", text))


# -- diff --------------------------------------------------------------------------------------


def test_diff_reports_meaning_and_direction(tmp_path: Path, rules: RuleSet) -> None:
    changed = RULES.replace("methods: [GET]\n        paths: [\"/v1/**\"]",
                            "methods: [GET, DELETE]\n        paths: [\"/v1/**\"]")
    changed = changed.replace("mode: report", "mode: enforce")
    changed = changed.replace("allow_networks: [10.1.2.0/24]", "allow_networks: [10.0.0.0/8]")
    changed = changed.replace(f'new-1: {{policy: watcher, key_sha256: "{KEY}"}}',
                              f'new-1: {{policy: ci, key_sha256: "{"0" * 63}2"}}')
    new = load_rules(write(tmp_path, "new.yaml", changed))
    shown = {(c.scope, c.sign, c.what, c.widens) for c in diff(rules, new)}
    assert shown == {
        ("policy ci", "+", "allow_networks 10.0.0.0/8", True),
        ("policy ci", "-", "allow_networks 10.1.2.0/24", False),
        ("policy ci", "+", "allow api.example.com; ports 443; methods DELETE,GET; paths /v1/**",
         True),
        # Another rule for the host injects: it may now decide requests this one decided.
        ("policy ci", "-", "allow api.example.com; ports 443; methods GET; paths /v1/**", None),
        ("policy watcher", "~", "mode report -> enforce", False),
        ("sandbox new-1", "~", "policy watcher -> ci", None),
        ("sandbox new-1", "~", "key changed", None),
    }
    assert diff(rules, rules) == []


def test_diff_reports_tools(tmp_path: Path) -> None:
    base = """
version: 1
policies:
  ci:
    allow:
      - host: api.example.com
        inject: [{secret: "file:k", as: bearer, name: gh}]
    tools:
      - {name: issue, description: One issue., method: GET, credential: gh,
         url: "https://api.example.com/issues/{n}",
         arguments: {type: object, properties: {n: {type: integer}}, required: [n]}}
      - {name: gone, description: Goes., method: GET, url: "https://api.example.com/x"}
    http_request: {methods: [GET]}
"""
    changed = base.replace("issues/{n}", "issues/{n}/comments").replace(
        """      - {name: gone, description: Goes., method: GET, url: "https://api.example.com/x"}
""", """      - {name: added, description: New., method: POST, url: "https://api.example.com/y"}
""").replace("methods: [GET]}", "methods: [GET, POST]}")
    old = load_rules(write(tmp_path, "old.yaml", base))
    new = load_rules(write(tmp_path, "new.yaml", changed))
    shown = {(c.scope, c.sign, c.what, c.widens) for c in diff(old, new)}
    assert shown == {
        ("policy ci", "+", "tool added: POST api.example.com/y", True),
        ("policy ci", "-", "tool gone", False),
        ("policy ci", "~", "tool issue: path", None),
        ("policy ci", "~", "tool http_request: methods GET -> GET,POST, max_response_bytes "
                           "1048576 -> 1048576", True),
    }
    off = load_rules(write(tmp_path, "off.yaml", base.replace(
        "    http_request: {methods: [GET]}\n", "")))
    assert {(c.sign, c.what, c.widens) for c in diff(off, old)} == {
        ("+", "tool http_request: GET to any host the rules allow", True)}
    assert diff(old, old) == []


def test_diff_notices_reordering(tmp_path: Path, rules: RuleSet) -> None:
    first, second = "      - host: localhost\n        ports: [80]\n", \
        '      - host: "*"\n        ports: [8080]\n'
    swapped = RULES.replace(first + second, second + first)
    changes = diff(rules, load_rules(write(tmp_path, "new.yaml", swapped)))
    assert [(c.sign, c.widens) for c in changes] == [("~", None)]
    assert "reordered" in changes[0].what


# -- the command -------------------------------------------------------------------------------


TOOL_RULES = """
version: 1
policies:
  ci:
    allow:
      - host: api.example.com
        paths: ["/issues/**"]
        inject: [{secret: "file:k", as: bearer, name: gh}]
      - host: other.example.com
        inject: [{secret: "file:o", as: bearer, name: other}]
    tools:
      - {name: issue, description: One issue., method: GET, credential: gh,
         url: "https://api.example.com/issues/{n}",
         arguments: {type: object, properties: {n: {type: integer}}, required: [n]}}
      - {name: mismatched, description: Names gh where other is injected., method: GET,
         credential: gh, url: "https://other.example.com/x"}
    http_request: {methods: [GET]}
  bare:
    allow: [{host: api.example.com}]
sandboxes:
  bot: {policy: ci, key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"}
"""


@pytest.mark.parametrize(("tool", "arguments", "verdict", "reason"), [
    ("issue", {"n": 7}, "allow", None),
    ("issue", {"n": "x"}, "deny", "tool_arguments_invalid"),
    ("mismatched", {}, "deny", "tool_credential"),
    ("http_request", {"url": "https://api.example.com/issues/1"}, "allow", None),
    ("http_request", {"url": "https://api.example.com/other"}, "deny", "not_allowed"),
    ("http_request", {"url": "https://api.example.com/issues/1",
                      "headers": {"Cookie": "c"}}, "deny", "tool_arguments_invalid"),
])
def test_explain_tool_decides_as_the_mcp_server_does(
        tmp_path: Path, tool: str, arguments: dict[str, object], verdict: str,
        reason: str | None) -> None:
    rules = load_rules(write(tmp_path, "tools.yaml", TOOL_RULES))
    result = explain_tool(rules, tool, arguments, sandbox="bot")
    assert (result.decision, result.reason and result.reason.value) == (verdict, reason)
    if verdict == "allow":
        assert result.rule is not None and result.url.startswith("https://api.example.com")


def test_explain_tool_names_what_is_not_there(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, "tools.yaml", TOOL_RULES))
    with pytest.raises(ExplainError, match=r"no tool 'nope'.*issue, mismatched, http_request"):
        explain_tool(rules, "nope", {}, sandbox="bot")
    with pytest.raises(ExplainError, match="its tools: none"):
        explain_tool(rules, "issue", {}, policy="bare")
