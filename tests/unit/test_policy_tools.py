"""A policy's `tools:` (proxy/policy/toolgrammar.py, tools.py): what loads, what is refused with
file, line and field, and what a template makes of arguments (an argument never moves a call
to another path or host than its template's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sealgate.proxy.policy.model import PathError, normalize_path
from sealgate.proxy.policy.rulesfile import RulesError, load_rules
from sealgate.proxy.policy.tools import Tool, ToolArgumentError, select

HEAD = """
version: 1
policies:
  ci:
    allow:
      - host: api.test
        inject:
          - secret: file:gh
            as: bearer
            name: github
"""

GOOD = HEAD + """
    tools:
      - name: get_issue
        description: One issue of a repository.
        method: GET
        url: https://api.test/repos/{owner}/{repo}/issues/{number}
        query: {state: "{state}", per_page: "20"}
        arguments:
          type: object
          properties:
            owner: {type: string}
            repo: {type: string}
            number: {type: integer}
            state: {type: string, enum: [open, closed]}
          required: [owner, repo, number]
          additionalProperties: false
        credential: github
        max_response_bytes: 4096
        returns: [title, user.login]
        timeout: 5
      - name: create_issue
        description: Open an issue.
        method: POST
        url: https://api.test:8443/repos/x/issues
        arguments:
          type: object
          properties: {title: {type: string}, labels: {type: array}}
          required: [title]
        body: {title: "{title}", labels: "{labels}", kind: bug}
"""


def _load(tmp_path: Path, text: str) -> Tool:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return load_rules(path).policies["ci"].tools[0]


def test_a_tool_loads_with_every_field(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(GOOD)
    policy = load_rules(path).policies["ci"]
    get, create = policy.tools
    assert (get.name, get.method, get.scheme, get.host.name, get.port) == (
        "get_issue", "GET", "https", "api.test", 443)
    assert get.path == "/repos/{owner}/{repo}/issues/{number}"
    assert get.query == (("state", "{state}"), ("per_page", "20"))
    assert get.credential == "github" and get.max_response_bytes == 4096
    assert get.returns == ("title", "user.login") and get.timeout == 5.0
    assert get.schema["required"] == ["owner", "repo", "number"]
    assert get.source.endswith("rules.yaml:13")
    assert create.port == 8443 and create.credential is None and create.returns is None
    assert policy.rules[0].inject[0].name == "github"


def test_a_template_encodes_each_argument_whole(tmp_path: Path) -> None:
    tool = _load(tmp_path, GOOD)
    call = tool.request({"owner": "a b", "repo": "r", "number": 7})
    assert call.target == "/repos/a%20b/r/issues/7?per_page=20"  # state not given: left out
    assert (call.host.name, call.port, call.body) == ("api.test", 443, None)
    call = tool.request({"owner": "o", "repo": "r", "number": 7, "state": "open&x=1"})
    assert call.target.endswith("?state=open%26x%3D1&per_page=20")
    # A value that would leave its segment is encoded, and the path is then refused as the
    # proxy refuses it: an argument cannot reach another path than the template's.
    for owner in ("../admin", "..", "a/b", ".", "%2e%2e"):
        path = tool.request({"owner": owner, "repo": "r", "number": 1}).path
        with pytest.raises(PathError):
            normalize_path(path)
    with pytest.raises(ToolArgumentError, match="'owner'"):
        tool.request({"owner": {"x": 1}, "repo": "r", "number": 1})


def test_a_body_template_takes_json_values(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(GOOD)
    create = load_rules(path).policies["ci"].tools[1]
    call = create.request({"title": "T", "labels": ["a", "b"]})
    assert json.loads(call.body or b"") == {"title": "T", "labels": ["a", "b"], "kind": "bug"}
    call = create.request({"title": 'quote " and }'})
    assert json.loads(call.body or b"") == {"title": 'quote " and }', "kind": "bug"}


def test_returns_picks_fields_of_objects_and_of_each_item() -> None:
    answer = {"title": "t", "body": "secret-ish", "user": {"login": "u", "id": 1}}
    assert select(answer, ("title", "user.login")) == {"title": "t", "user": {"login": "u"}}
    assert select([answer, {"title": "s"}], ("title",)) == [{"title": "t"}, {"title": "s"}]
    assert select("text", ("a",)) == "text"


@pytest.mark.parametrize(("tool", "field", "said"), [
    ("url: https://{host}/x", "tools[0].url", "host and port are fixed"),
    ("url: https://api.test/x?a=1", "tools[0].url", "no query"),
    ("url: ftp://api.test/x", "tools[0].url", "https://"),
    ("url: https://api.test/a/../b", "tools[0].url", "never be called"),
    ("url: https://api.test/{a}\n        arguments: {type: object, properties: {a: {}}}",
     "tools[0].arguments", "must be required"),
    ("url: https://api.test/{a}", "tools[0].arguments", "not declared"),
    ("url: https://api.test/x\n        credential: stripe", "tools[0].credential",
     "named: github"),
    ("url: https://api.test/x\n        body: {a: 1}", "tools[0].body", "no body"),
    ("url: https://api.test/x\n        arguments: {type: object, properties: 5}",
     "tools[0].arguments", "not a JSON Schema"),
    ("url: https://api.test/x\n        arguments: {type: array}", "tools[0].arguments",
     "type: object"),
    ("url: https://api.test/x\n        returns: ['a..b']", "tools[0].returns[0]",
     "not a field path"),
    ("url: https://api.test/x\n        max_response_bytes: 0", "tools[0].max_response_bytes",
     "out of range"),
    ("url: https://api.test/x\n        nope: 1", "tools[0].nope", "unknown key"),
])
def test_a_bad_tool_is_refused_with_its_field(tmp_path: Path, tool: str, field: str,
                                              said: str) -> None:
    text = HEAD + f"""
    tools:
      - name: t
        description: d
        method: {"POST" if "body:" in tool and "nope" in tool else "GET"}
        {tool}
"""
    with pytest.raises(RulesError) as caught:
        _load(tmp_path, text)
    assert f"policies.ci.{field}" in str(caught.value) and said in str(caught.value)


def test_a_body_string_is_one_param_or_plain_text(tmp_path: Path) -> None:
    text = HEAD + """
    tools:
      - name: t
        description: d
        method: POST
        url: https://api.test/x
        arguments: {type: object, properties: {a: {type: string}}}
        body: {text: "about {a}"}
"""
    with pytest.raises(RulesError, match=r"one \{param\} whole"):
        _load(tmp_path, text)


def test_two_tools_of_a_name_and_two_credentials_of_a_name_are_refused(tmp_path: Path) -> None:
    tool = "\n      - {name: t, description: d, method: GET, url: 'https://api.test/'}"
    with pytest.raises(RulesError, match="also declared at"):
        _load(tmp_path, HEAD + "    tools:" + tool * 2 + "\n")
    other = HEAD + """      - host: b.test
        inject:
          - secret: file:other
            as: bearer
            name: github
"""
    with pytest.raises(RulesError, match="names two credentials"):
        _load(tmp_path, other)
