"""A policy's `mcp_servers:` (proxy/policy/gatewaygrammar.py, gateways.py): what loads, what is
refused with its field, and what the argument constraints admit."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    ok = {"repo": "octo/docs", "kind": "guide", "query": "how to", "other": [1]}
    assert search.refusal(ok) is None
    assert search.refusal({**ok, "kind": 1}) is None
    for wrong, said in [({"repo": "octo/other"}, "'repo'"), ({"kind": "1"}, "'kind'"),
                        ({"kind": True}, "'kind'"), ({"query": "HOW"}, "'query'"),
                        ({"query": "a" * 11}, "'query'"), ({"query": 7}, "'query'")]:
        refusal = search.refusal({**ok, **wrong})
        assert refusal is not None and said in refusal, wrong
        assert "octo/other" not in refusal  # the value is never quoted back
    assert "must be given" in (search.refusal({"kind": "guide", "query": "a"}) or "")
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
])
def test_a_wrong_server_is_refused_naming_its_field(tmp_path: Path, change: tuple[str, str],
                                                    said: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(GOOD.replace(*change))
    with pytest.raises(RulesError, match="mcp_servers") as caught:
        load_rules(path)
    assert said in str(caught.value)
