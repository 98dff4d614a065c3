"""A policy's `mcp_servers:` (proxy/policy/gatewaygrammar.py, gateways.py): what loads, what is
refused with its field, what the argument constraints admit, and what `rules diff` (diff.py)
says of a change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sealgate.proxy.policy.diff import diff
from sealgate.proxy.policy.gateways import McpServer
from sealgate.proxy.policy.rulesfile import RulesError, load_rules

HEAD = """
version: 1
policies:
  ci:
    allow:
      - host: mcp.test
        inject:
          - {secret: "file:up", as: bearer, name: upstream}
"""

GOOD = HEAD + """
    mcp_servers:
      - name: docs
        url: https://mcp.test:8443/mcp
        credential: upstream
        tools:
          - name: search
            arguments:
              repo: {equals: octo/docs}
              kind: {one_of: [guide, 1]}
              query: {pattern: "[a-z ]{1,10}"}
              limit: {schema: {type: integer, minimum: 1, maximum: 50}}
          - name: plain
        max_response_bytes: 4096
        timeout: 5
"""


def _load(tmp_path: Path, text: str) -> McpServer:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    [server] = load_rules(path).policies["ci"].mcp_servers
    return server


def test_a_server_loads_with_its_tools_and_constraints(tmp_path: Path) -> None:
    server = _load(tmp_path, GOOD)
    assert (server.name, server.scheme, server.host.name, server.port, server.path) == (
        "docs", "https", "mcp.test", 8443, "/mcp")
    assert (server.credential, server.max_response_bytes, server.timeout) == ("upstream",
                                                                             4096, 5.0)
    assert [t.name for t in server.tools] == ["search", "plain"]
    assert server.tool("delete") is None
    search = server.tool("search")
    assert search is not None
    ok = {"repo": "octo/docs", "kind": "guide", "query": "how to", "limit": 5, "other": [1]}
    assert search.refusal(ok) is None
    assert search.refusal({**ok, "kind": 1}) is None
    for wrong, said in [({"repo": "octo/other"}, "'repo'"), ({"kind": "1"}, "'kind'"),
                        ({"kind": True}, "'kind'"), ({"query": "HOW"}, "'query'"),
                        ({"query": "a" * 11}, "'query'"), ({"query": 7}, "'query'"),
                        ({"limit": 51}, "'limit'"), ({"limit": "5"}, "'limit'")]:
        refusal = search.refusal({**ok, **wrong})
        assert refusal is not None and said in refusal, wrong
        assert "octo/other" not in refusal  # the value is never quoted back
    assert "must be given" in (search.refusal({"kind": "guide", "query": "a", "limit": 1})
                               or "")
    assert search.refusal([1]) == "the arguments are not an object"
    plain = server.tool("plain")
    assert plain is not None and plain.refusal({"anything": 1}) is None


@pytest.mark.parametrize(("change", "said"), [
    (("credential: upstream", "credential: nope"), "no inject entry of this policy is named"),
    (("name: docs", "name: -docs"), "server name"),
    (("url: https://mcp.test:8443/mcp", "url: https://mcp.test/{x}"), "no {param}"),
    (("url: https://mcp.test:8443/mcp", "url: ftp://mcp.test/"), "https://"),
    (("repo: {equals: octo/docs}", "repo: {equals: a, pattern: b}"), "one of equals"),
    (("repo: {equals: octo/docs}", "repo: {like: a}"), "like"),
    (("kind: {one_of: [guide, 1]}", "kind: {one_of: []}"), "one or more"),
    (("query: {pattern: \"[a-z ]{1,10}\"}", "query: {pattern: \"[a-\"}"),
     "not a regular expression"),
    (("- name: plain", "- name: search"), "listed twice"),
    (("timeout: 5", "timeout: 0"), "timeout"),
    (("{schema: {type: integer, minimum: 1, maximum: 50}}", "{schema: {type: 7}}"),
     "not a JSON Schema"),
    (("{schema: {type: integer, minimum: 1, maximum: 50}}", "{schema: [1]}"), "JSON Schema"),
])
def test_a_wrong_server_is_refused_naming_its_field(tmp_path: Path, change: tuple[str, str],
                                                    said: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(GOOD.replace(*change))
    with pytest.raises(RulesError, match="mcp_servers") as caught:
        load_rules(path)
    assert said in str(caught.value)


def test_rules_diff_says_what_a_server_change_widens(tmp_path: Path) -> None:
    before = tmp_path / "before.yaml"
    before.write_text(GOOD)
    after = tmp_path / "after.yaml"

    def changes(text: str) -> list[tuple[str, str, bool | None]]:
        after.write_text(text)
        return [(c.sign, c.what, c.widens) for c in diff(load_rules(before), load_rules(after))
                if "mcp server" in c.what]

    assert changes(GOOD) == []
    assert changes(GOOD.replace("- name: plain", "- name: plain\n          - name: drop")) == [
        ("~", "mcp server docs: tools +drop", True)]
    assert changes(GOOD.replace("{pattern: \"[a-z ]{1,10}\"}", "{pattern: \".*\"}")) == [
        ("~", "mcp server docs: tools", None)]
    assert changes(GOOD.replace("timeout: 5", "timeout: 9")) == [
        ("~", "mcp server docs: timeout", None)]
    assert changes(HEAD) == [("-", "mcp server docs", False)]
    before.write_text(HEAD)
    assert changes(GOOD) == [("+", "mcp server docs: mcp.test/mcp (search,plain)", True)]


def test_a_name_declared_twice_is_refused_at_the_second(tmp_path: Path) -> None:
    """One loader (toolgrammar.named_list) for the servers' and the tools' lists."""
    twice = GOOD + """      - name: docs
        url: https://mcp.test:8443/other
        credential: upstream
        tools: [{name: x}]
"""
    path = tmp_path / "rules.yaml"
    path.write_text(twice)
    with pytest.raises(RulesError, match=r"server 'docs' is also declared at \[0\]"):
        load_rules(path)
    tools = HEAD + """
    tools:
      - {name: ping, description: Ping., method: GET, url: "https://mcp.test/ping"}
      - {name: ping, description: Again., method: GET, url: "https://mcp.test/pong"}
"""
    path.write_text(tools)
    with pytest.raises(RulesError, match=r"tool 'ping' is also declared at \[0\]"):
        load_rules(path)


def test_explain_tool_decides_a_gateway_call_as_the_gateway_does(tmp_path: Path) -> None:
    """`rules explain-tool RULES SERVER/TOOL`: the gateway's order (mcp/gatewayflow.py): the
    server of the policy, the listed tool, the constraints, then decide for the POST to the
    server's URL and the server's credential against the allowing rule."""
    from sealgate.proxy.policy.explain import ExplainError
    from sealgate.proxy.policy.explaintool import explain_tool

    path = tmp_path / "rules.yaml"
    path.write_text(GOOD.replace("      - host: mcp.test\n", "      - host: mcp.test\n"
                                 "        ports: [8443]\n        methods: [POST]\n"))
    rules = load_rules(path)
    ok = {"repo": "octo/docs", "kind": "guide", "query": "how to", "limit": 5}
    allowed = explain_tool(rules, "docs/search", ok, policy="ci")
    assert (allowed.decision, allowed.method, allowed.url) == (
        "allow", "POST", "https://mcp.test:8443/mcp")
    assert allowed.rule is not None and allowed.rule.source.endswith("rules.yaml:6")
    for name, arguments, reason, said in [
            ("docs/delete", {}, "not_allowed", "lists no tool 'delete' (listed: search, plain)"),
            ("docs/search", {**ok, "repo": "octo/x"}, "tool_arguments_invalid", "'repo'"),
            ("docs/search", {"kind": "guide"}, "tool_arguments_invalid", "must be given")]:
        denied = explain_tool(rules, name, arguments, policy="ci")
        assert (denied.decision, denied.reason) == ("deny", reason), name
        assert denied.detail is not None and said in denied.detail
        assert "octo/x" not in denied.detail
    # The allowing rule must inject the server's credential.
    path.write_text(path.read_text().replace("        inject:\n          - {secret: \"file:up\", "
                                             "as: bearer, name: upstream}\n", ""))
    with pytest.raises(RulesError):  # the loader refuses a credential no entry provides
        load_rules(path)
    with pytest.raises(ExplainError, match=r"no MCP server 'wiki' \(its servers: docs\)"):
        explain_tool(rules, "wiki/search", ok, policy="ci")
    # POST only is allowed; a rule allowing GET alone does not allow the gateway's call.
    path.write_text(GOOD.replace("      - host: mcp.test\n", "      - host: mcp.test\n"
                                 "        methods: [GET]\n"))
    denied = explain_tool(load_rules(path), "docs/search", ok, policy="ci")
    assert (denied.decision, denied.reason) == ("deny", "not_allowed")


def test_rules_test_cases_may_be_tool_calls(tmp_path: Path) -> None:
    """`rules test`: a case's `tool:` (and `arguments:`) instead of its `request:`, decided by
    explain-tool; a case that gives both, or arguments to a request, says where."""
    from sealgate.proxy.policy.cases import load_cases, run_case

    path = tmp_path / "rules.yaml"
    path.write_text(GOOD.replace("      - host: mcp.test\n", "      - host: mcp.test\n"
                                 "        ports: [8443]\n        methods: [POST]\n"))
    rules = load_rules(path)
    cases = tmp_path / "cases.yaml"
    cases.write_text("""cases:
  - name: search the docs
    policy: ci
    tool: docs/search
    arguments: {repo: octo/docs, kind: guide, query: how to, limit: 5}
    expect: allow
  - name: another repository
    policy: ci
    tool: docs/search
    arguments: {repo: octo/other, kind: guide, query: how to, limit: 5}
    expect: deny
    reason: tool_arguments_invalid
  - name: wrongly expected
    policy: ci
    tool: docs/delete
    expect: allow
""")
    outcomes = [run_case(rules, case) for case in load_cases(cases)]
    assert [o.passed for o in outcomes] == [True, True, False], [o.failures for o in outcomes]
    assert "expected allow, got deny (not_allowed: docs lists no tool 'delete'" in (
        outcomes[2].failures[0])
    report = outcomes[1].to_json()
    assert (report["tool"], report["request"], report["reason"]) == (
        "docs/search", None, "tool_arguments_invalid")
    assert "octo/other" not in json.dumps(report)
    for text, said in [
            ("    request: POST https://mcp.test/mcp\n    tool: docs/search\n",
             "give a request or a tool, not both"),
            ("    request: POST https://mcp.test/mcp\n    arguments: {a: 1}\n",
             "arguments are a tool call's"),
            ("    tool: docs/search\n    arguments: [1]\n", "expected a mapping")]:
        cases.write_text(f"cases:\n  - name: bad\n{text}    expect: allow\n")
        with pytest.raises(RulesError, match=said):
            load_cases(cases)
