"""Declared tools through `sealgate mcp serve`, called with the official MCP client, against a
real HTTPS fake API on loopback (issue 29): the credential reaches the API and nothing else (no
tool result, audit line, error or stderr holds it); arguments are checked; the guard refuses a
tool whose host resolves to a metadata or internal address; budgets hold; one audit line a call.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sealgate.proxy.policy.reshaping import SLICED
from tests.conftest import KEYS
from tests.dnsstub import StubDNS
from tests.harness import ROOT, SEALGATE, Origin, OriginCA, key_digest
from tests.mcpkit import McpServer, basic, needs_mcp_venv

pytestmark = needs_mcp_venv()

CANARY = "ghp-mcp-canary-5e4d3c2b1a"
OTHER = "other-canary-0f9e8d7c6b"
QUERY = "query-canary-3e7a1f"  # in a URL's query: never in an audit line
NOTE = "note-canary-7d2c9b"  # an http_request header's value: never in an audit line
BOT = basic("bot-1", KEYS["bot-1"])


def rules(port: int) -> str:
    tool = """
      - name: {name}
        description: {description}
        method: {method}
        url: {url}"""
    return f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{port}]
        paths: ["/repos/**", "/big/**"]
        inject:
          - secret: file:github
            as: bearer
            name: github
      - host: api.test
        ports: [{port}]
        paths: ["/other/**"]
        inject:
          - secret: file:other
            as: {{type: header, header: X-Key, format: "{{secret}}"}}
            name: other
      - host: api.test
        ports: [{port}]
        paths: ["/q/**"]
        inject:
          - secret: file:other
            as: {{type: query, param: api_key}}
            name: in_query
      - host: api.test
        ports: [{port}]
        paths: ["/plain/**"]
      - host: meta.test
        ports: [{port}]
      - host: evil.test
        ports: [{port}]
    allow_networks: [127.0.0.1/32]
    tools:{tool.format(name="get_repo", description="A repository's issue.", method="GET",
                       url=f"https://api.test:{port}/repos/{{owner}}/issues/{{number}}")}
        query: {{state: "{{state}}"}}
        arguments:
          type: object
          properties:
            owner: {{type: string, maxLength: 40}}
            number: {{type: integer, minimum: 1}}
            state: {{type: string, enum: [open, closed]}}
          required: [owner, number]
          additionalProperties: false
        credential: github
      - name: picked
        description: Only some fields of the answer.
        method: GET
        url: https://api.test:{port}/repos/x/issues/1
        returns: [path]
        credential: github
      - name: create
        description: A POST with a JSON body.
        method: POST
        url: https://api.test:{port}/repos/x/issues
        arguments: {{type: object, properties: {{title: {{type: string}}}}, required: [title]}}
        body: {{title: "{{title}}", labels: [bot]}}
        credential: github
      - name: wrong_credential
        description: Names a credential the allowing rule does not inject.
        method: GET
        url: https://api.test:{port}/other/x
        credential: github
      - name: other_header
        description: The other credential, a header processor.
        method: GET
        url: https://api.test:{port}/other/x
        credential: other
      - name: in_query
        description: A credential a query processor puts in the URL.
        method: GET
        url: https://api.test:{port}/q/x
        query: {{page: "2"}}
        credential: in_query
      - name: big
        description: An answer over its cap.
        method: GET
        url: https://api.test:{port}/big/x
        max_response_bytes: 64
      - name: metadata
        description: A host that resolves to the metadata address.
        method: GET
        url: https://meta.test:{port}/latest/meta-data/
      - name: internal
        description: A host that resolves to a private address.
        method: GET
        url: https://evil.test:{port}/x
    http_request: {{methods: [GET, POST], max_response_bytes: 65536}}
  tight:
    allow:
      - host: api.test
        ports: [{port}]
        inject:
          - {{secret: "file:github", as: bearer, name: github}}
    allow_networks: [127.0.0.1/32]
    budgets: {{requests_per_second: 0.01, burst: 1}}
    tools:
      - name: once
        description: One call, then the budget is spent.
        method: GET
        url: https://api.test:{port}/repos/x/issues/1
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
  rep-1: {{policy: tight, key_sha256: "{key_digest(KEYS['rep-1'])}"}}
default_policy: null
"""


@pytest.fixture(scope="module")
def api(test_ca: OriginCA, dns: StubDNS) -> Iterator[Origin]:
    # An API that echoes what it got: the credential comes back in its answer, as a debug
    # endpoint's or an error page's would.
    origin = Origin(tls=test_ca.issue("api.test", "meta.test", "evil.test"), echo=True)
    yield origin
    origin.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, api: Origin, dns: StubDNS,
           test_ca: OriginCA) -> Iterator[McpServer]:
    started = McpServer(tmp_path_factory.mktemp("mcp"), rules(api.port), resolver=dns.address,
                        upstream_ca=test_ca.path, secrets={"github": CANARY, "other": OTHER})
    yield started
    started.stop()
    everything = started.audit_text() + started.stderr()
    assert CANARY not in everything and OTHER not in everything
    assert "Traceback" not in started.stderr(), started.stderr()


def _one(server: McpServer, name: str, arguments: dict[str, Any] | None = None,
         authorization: str | None = BOT) -> tuple[dict[str, Any], str]:
    answer, printed = server.client([{"call": name, "arguments": arguments or {}}],
                                    authorization)
    assert CANARY not in printed and OTHER not in printed
    return answer["steps"][0], printed


def test_the_client_lists_its_policys_tools(server: McpServer) -> None:
    answer, _ = server.client([{"list": True}], BOT)
    assert answer["discovered"] == {"versions": ["2026-07-28"]}
    tools = {t["name"]: t for t in answer["steps"][0]["tools"]}
    assert set(tools) == {"get_repo", "picked", "create", "wrong_credential", "other_header",
                          "in_query", "big", "metadata", "internal", "http_request"}
    assert tools["http_request"]["inputSchema"]["properties"]["method"]["enum"] == ["GET",
                                                                                    "POST"]
    assert tools["http_request"]["annotations"]["readOnlyHint"] is False
    assert tools["get_repo"]["inputSchema"]["required"] == ["owner", "number"]
    assert tools["get_repo"]["annotations"]["readOnlyHint"] is True
    answer, _ = server.client([{"list": True}], basic("rep-1", KEYS["rep-1"]))
    assert [t["name"] for t in answer["steps"][0]["tools"]] == ["once"]


def test_the_credential_reaches_the_api_and_never_the_agent(server: McpServer,
                                                            api: Origin) -> None:
    api.reset()
    api.echo = True
    step, _ = _one(server, "get_repo", {"owner": "octo", "number": 7, "state": "open"})
    [seen] = api.requests
    assert seen.method == "GET" and seen.path == "/repos/octo/issues/7?state=open"
    assert seen.values("authorization") == [f"Bearer {CANARY}"]  # the bytes at the origin
    result = step["result"]
    assert result["is_error"] is False
    # The API echoed the credential; the agent reads it masked, in the text and the JSON alike.
    echoed = result["structured"]["headers"]["Authorization"]
    assert echoed.startswith("Bearer [REDACTED]") and CANARY not in json.dumps(result)
    line = server.calls()[-1]
    assert (line["tool"], line["sandbox"], line["decision"], line["reason"]) == (
        "get_repo", "bot-1", "allow", None)
    assert json.loads(line["arguments"]) == {"owner": "octo", "number": 7, "state": "open"}
    assert line["injected"] == ["broker:file:github"] and line["scrubbed"] >= 1
    assert (line["host"], line["path"], line["status"]) == ("api.test", "/repos/octo/issues/7",
                                                            200)


def test_any_processor_puts_the_credential_in_and_its_echo_is_scrubbed(server: McpServer,
                                                                       api: Origin) -> None:
    api.reset()
    step, _ = _one(server, "other_header")
    assert api.requests[-1].values("x-key") == [OTHER]
    assert "[REDACTED]" in step["result"]["structured"]["headers"]["X-Key"]
    api.reset()
    step, _ = _one(server, "in_query")
    assert api.requests[-1].path == f"/q/x?page=2&api_key={OTHER}"
    assert step["result"]["structured"]["path"].startswith("/q/x?page=2&api_key=[REDACTED]")
    assert server.calls()[-1]["path"] == "/q/x"  # the audit line has no query


def test_returns_picks_the_fields_and_a_body_is_built_from_arguments(server: McpServer,
                                                                     api: Origin) -> None:
    api.reset()
    step, _ = _one(server, "picked")
    assert step["result"]["structured"] == {"path": "/repos/x/issues/1"}
    api.reset()
    step, _ = _one(server, "create", {"title": 'a "quoted" title'})
    [seen] = api.requests
    assert json.loads(seen.body) == {"title": 'a "quoted" title', "labels": ["bot"]}
    assert seen.headers["content-type"] == "application/json"


@pytest.mark.parametrize(("arguments", "said"), [
    ({"owner": "octo", "number": "7"}, "number: '7' is not of type 'integer'"),
    ({"owner": "octo"}, "'number' is a required property"),
    ({"owner": "octo", "number": 1, "extra": 1}, "Additional properties"),
    ({"owner": "octo", "number": 1, "state": "all"}, "is not one of"),
])
def test_arguments_the_schema_refuses_come_back_as_errors_and_call_nothing(
        server: McpServer, api: Origin, arguments: dict[str, Any], said: str) -> None:
    api.reset()
    step, _ = _one(server, "get_repo", arguments)
    result = step["result"]
    assert result["is_error"] is True and said in result["text"]
    assert result["structured"]["error"]["reason"] == "tool_arguments_invalid"
    assert api.untouched()
    line = server.calls()[-1]
    assert (line["decision"], line["reason"]) == ("deny", "tool_arguments_invalid")


@pytest.mark.parametrize("owner", ["..", "a/b", "%2e%2e", "."])
def test_an_argument_cannot_move_the_call_to_another_path(server: McpServer, api: Origin,
                                                          owner: str) -> None:
    api.reset()
    step, _ = _one(server, "get_repo", {"owner": owner, "number": 1})
    assert step["result"]["structured"]["error"]["reason"] == "path_invalid"
    assert api.untouched()


def test_an_unknown_tool_is_a_protocol_error(server: McpServer) -> None:
    step, _ = _one(server, "no_such_tool")
    assert step["error"]["code"] == -32602 and "no_such_tool" in step["error"]["message"]


@pytest.mark.parametrize(("tool", "reason"), [("metadata", "metadata"),
                                              ("internal", "private")])
def test_the_guard_refuses_a_tool_whose_host_resolves_inside(
        server: McpServer, api: Origin, tool: str, reason: str) -> None:
    # The rules allow both hosts (decide says yes): the guard, after resolving, says no.
    api.reset()
    step, _ = _one(server, tool)
    error = step["result"]["structured"]["error"]
    assert error["reason"] == reason
    assert "169.254" not in step["result"]["text"] and "10.0.0.1" not in step["result"]["text"]
    assert api.untouched()
    line = server.calls()[-1]
    assert (line["tool"], line["decision"], line["reason"]) == (tool, "deny", reason)
    assert line.get("rule") is not None and "address" not in line


def test_a_tool_carries_only_the_credential_its_allowing_rule_injects(server: McpServer,
                                                                     api: Origin) -> None:
    api.reset()
    step, _ = _one(server, "wrong_credential")
    assert step["result"]["structured"]["error"]["reason"] == "tool_credential"
    assert api.untouched()


def test_an_answer_over_the_cap_is_refused_and_not_returned(server: McpServer,
                                                            api: Origin) -> None:
    api.reset()
    step, _ = _one(server, "big")
    assert step["result"]["structured"]["error"]["reason"] == "response_too_large"
    assert server.calls()[-1]["decision"] == "error"


def test_the_policys_budget_holds(server: McpServer, api: Origin) -> None:
    rep = basic("rep-1", KEYS["rep-1"])
    answer, _ = server.client([{"call": "once"}, {"call": "once"}], rep)
    first, second = (s["result"] for s in answer["steps"])
    assert first["is_error"] is False
    assert second["structured"]["error"]["reason"] == "budget_exceeded"
    # Refused a second late, as the proxy refuses: a retrying agent cannot spin the server.
    assert answer["steps"][1]["seconds"] >= 0.9, answer["steps"][1]


def test_who_calls_is_the_sandbox_proven_or_registered(server: McpServer) -> None:
    answer, _ = server.client([{"list": True}], basic("bot-1", "wrong-key"))
    assert "identity_invalid" in answer["discovered"]["error"]["message"]
    answer, _ = server.client([{"list": True}], None)  # loopback, registered for no one
    assert "Authorization: Basic" in answer["discovered"]["error"]["message"]
    # The source registry the sandbox runtime fills (`sealgate sources add`): by address.
    registry = server.state / "registry.json"
    # A header naming a registered address is no address: the peer's is who calls (uvicorn
    # trusted X-Forwarded-For from loopback by default).
    registry.write_text(json.dumps({"sources": {"10.200.0.9": "rep-1"}}))
    try:
        status, said = _raw_list(server, {"X-Forwarded-For": "10.200.0.9",
                                          "Forwarded": "for=10.200.0.9"})
        assert status == 401 and "Authorization: Basic" in said, (status, said)
    finally:
        registry.unlink()
    registry.write_text(json.dumps({"sources": {"127.0.0.1": "rep-1"}}))
    try:
        answer, _ = server.client([{"list": True}], None)
        assert [t["name"] for t in answer["steps"][0]["tools"]] == ["once"]
    finally:
        registry.unlink()


def _raw_list(server: McpServer, headers: dict[str, str]) -> tuple[int, str]:
    """A tools/list posted by hand with `headers`: its status and body."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/mcp", body, headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list", **headers})
        answer = conn.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    finally:
        conn.close()


def test_one_audit_line_per_call_and_no_secret_in_any(server: McpServer) -> None:
    before = len(server.calls())
    server.client([{"call": "picked"}, {"call": "metadata"}, {"call": "get_repo",
                                                              "arguments": {"owner": 5}}], BOT)
    lines = server.calls()[before:]
    assert [line["tool"] for line in lines] == ["picked", "metadata", "get_repo"]
    assert all(line["policy"] == "ci" and line["identified_by"] == "proxy-auth"
               for line in lines)
    assert CANARY not in server.audit_text()


def test_secret_looking_arguments_are_masked_in_the_audit_line(
        server: McpServer, tmp_path: Path) -> None:
    # Not a declared argument (refused by the schema), still never written as given.
    _one(server, "get_repo", {"owner": "o", "number": 1, "api_token": "tok-from-agent-123"})
    line = server.calls()[-1]
    assert "tok-from-agent-123" not in json.dumps(line)
    assert json.loads(line["arguments"])["api_token"] == "[MASKED]"


def test_over_stdio_the_named_sandbox_s_tools_carry_the_credential(server: McpServer,
                                                                   api: Origin) -> None:
    """`--stdio --sandbox bot-1`: the official client starts the server and speaks over its
    pipes; the same tools, the same injection at the API, the same masking and audit line, and
    nothing on the server's stdout but the protocol (the client would fail on anything else)."""
    api.reset()
    api.echo = True
    answer, printed = server.stdio(
        [{"list": True}, {"call": "get_repo", "arguments": {"owner": "octo", "number": 9}}],
        "--sandbox", "bot-1")
    assert answer["discovered"] == {"versions": ["2026-07-28"]}
    assert "get_repo" in {t["name"] for t in answer["steps"][0]["tools"]}
    result = answer["steps"][1]["result"]
    assert result["is_error"] is False and CANARY not in json.dumps(result)
    [seen] = api.requests
    assert seen.path == "/repos/octo/issues/9" and seen.values("authorization") == [
        f"Bearer {CANARY}"]
    assert CANARY not in printed and "sealgate mcp ready (stdio)" in printed
    line = server.calls()[-1]
    assert (line["tool"], line["sandbox"], line["identified_by"]) == ("get_repo", "bot-1",
                                                                      "stdio")
    # Another sandbox named: that policy's tools only.
    answer, _ = server.stdio([{"list": True}], "--sandbox", "rep-1")
    assert [t["name"] for t in answer["steps"][0]["tools"]] == ["once"]


def test_over_stdio_an_unknown_sandbox_is_refused_at_start(server: McpServer) -> None:
    done = subprocess.run([*SEALGATE, "mcp", "serve", "--stdio", "--sandbox", "nobody",
                           *server.options], cwd=ROOT, input="", capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and "no such sandbox" in done.stderr, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr


def test_http_request_carries_the_allowing_rule_s_credential(server: McpServer,
                                                             api: Origin) -> None:
    """The generic tool: the URL's host, port and path decided as the proxy would, the rule's
    credential added, the agent's own headers and body passed on, the echo masked."""
    api.reset()
    api.echo = True
    step, _ = _one(server, "http_request", {
        "method": "POST", "url": f"https://api.test:{api.port}/repos/a/b?x={QUERY}",
        "headers": {"X-Trace": NOTE, "Content-Type": "text/plain"}, "body": "hello"})
    [seen] = api.requests
    assert (seen.method, seen.path, seen.body) == ("POST", f"/repos/a/b?x={QUERY}", b"hello")
    assert seen.values("authorization") == [f"Bearer {CANARY}"]
    assert seen.values("x-trace") == [NOTE] and seen.values("content-type") == ["text/plain"]
    assert step["result"]["is_error"] is False and CANARY not in json.dumps(step)
    line = server.calls()[-1]
    assert (line["tool"], line["decision"], line["path"]) == ("http_request", "allow",
                                                              "/repos/a/b")
    assert line["injected"] == ["broker:file:github"]
    # The audit line never has the query, in its fields nor in the arguments it repeats.
    assert QUERY not in server.audit_text()
    assert json.loads(line["arguments"])["url"] == \
        f"https://api.test:{api.port}/repos/a/b?[MASKED]"
    # Nor the agent's header values, whatever their names (a token in an innocent one).
    assert NOTE not in server.audit_text()
    assert json.loads(line["arguments"])["headers"] == {"X-Trace": "[MASKED]",
                                                        "Content-Type": "[MASKED]"}


@pytest.mark.parametrize(("arguments", "reason"), [
    ({"url": "https://meta.test:{port}/latest/meta-data/"}, "metadata"),
    ({"url": "https://evil.test:{port}/x"}, "private"),
    ({"url": "https://api.test:{port}/not-a-listed-path"}, "not_allowed"),
    ({"url": "https://unlisted.test:{port}/x"}, "not_allowed"),
    ({"url": "https://api.test:{port}/repos/a", "headers": {"Authorization": "Bearer mine"}},
     "tool_arguments_invalid"),
    ({"url": "https://api.test:{port}/repos/a", "headers": {"Proxy-Tokenizer": "x"}},
     "tool_arguments_invalid"),
    ({"url": "https://user:pw@api.test:{port}/repos/a"}, "tool_arguments_invalid"),
    ({"url": "file:///etc/passwd"}, "tool_arguments_invalid"),
    ({"url": "https://api.test:{port}/repos/a", "method": "DELETE"}, "tool_arguments_invalid"),
    # Another method or path than the one decided, at an API that honours the override; as the
    # proxy takes them (policy/reshaping.py), and an override within the tool's methods.
    ({"url": "https://api.test:{port}/repos/a", "headers": {"X-HTTP-Method-Override": "DELETE"}},
     "tool_arguments_invalid"),
    ({"url": "https://api.test:{port}/repos/a", "headers": {"X-Method-Override": "GET /x"}},
     "bad_request"),
    ({"url": "https://api.test:{port}/repos/a", "headers": {"X-Original-URL": "/admin"}},
     "bad_request"),
    ({"url": "https://api.test:{port}/repos/a", "headers": {"X_HTTP_Method_Override": "DELETE"}},
     "tool_arguments_invalid"),
    ({"url": "https://api.test:{port}/repos/a", "headers": {"X_Rewrite_URL": "/admin"}},
     "bad_request"),
], ids=["metadata", "internal", "path", "host", "authorization", "proxy-header", "userinfo",
        "file", "method", "method-override", "not-a-method", "url-override",
        "underscored-override", "underscored-url-override"])
def test_http_request_refuses_what_the_rules_and_the_guard_refuse(
        server: McpServer, api: Origin, arguments: dict[str, Any], reason: str) -> None:
    api.reset()
    filled = {**arguments, "url": arguments["url"].format(port=api.port)}
    step, _ = _one(server, "http_request", filled)
    assert step["result"]["is_error"] is True
    assert step["result"]["structured"]["error"]["reason"] == reason, step
    assert api.untouched()
    assert "mine" not in json.dumps(server.calls()[-1])


def test_http_request_takes_reshaping_headers_as_the_proxy_does(server: McpServer,
                                                                 api: Origin) -> None:
    """With a credential injected, a range is not sent (the answer comes whole, to be scrubbed
    whole); an override naming a method the rule and the tool allow goes on as it came."""
    api.reset()
    api.echo = True
    step, _ = _one(server, "http_request", {
        "url": f"https://api.test:{api.port}/repos/a",
        "headers": {"Range": "bytes=0-7", "If-Range": "x", "Request-Range": "bytes=0-7",
                    "Request_Range": "bytes=0-7", "X-HTTP-Method-Override": "post"}})
    assert step["result"]["is_error"] is False, step
    [seen] = api.requests
    assert not {n.lower().replace("_", "-") for n, _ in seen.fields} & {
        "range", "if-range", "request-range"}, seen.fields
    assert seen.values("authorization") == [f"Bearer {CANARY}"]
    assert seen.values("x-http-method-override") == ["post"]
    assert CANARY not in json.dumps(step)


SLICE = ("Bearer " + CANARY)[:20]  # an echo's slice: the secret cut inside it


@pytest.fixture
def slicing(api: Origin) -> Iterator[Origin]:
    """The API answers what the test sets (not an echo of the request); echoing again after."""
    api.reset()
    api.echo = False
    yield api
    api.reset()
    api.echo = True


@pytest.mark.parametrize("answer", ["206 with Content-Range", "200 with Content-Range",
                                    "206 alone"])
def test_http_request_refuses_a_slice_answered_to_an_injected_call(
        server: McpServer, slicing: Origin, answer: str) -> None:
    """A range header nobody listed (an API's own X-Range) could still make the API slice an
    echo of the credential, and a slice cut inside the secret is not the secret the scrubber
    looks for. So an answer that is a slice (206, or a Content-Range) to a call a credential
    was injected into is refused as the proxy refuses one (response_sliced), and none of its
    bytes reach the agent or a log (defence in depth; found by review)."""
    slicing.response_status = 200 if answer.startswith("200") else 206
    if "Content-Range" in answer:
        slicing.response_headers["Content-Range"] = f"bytes 0-{len(SLICE) - 1}/90"
    slicing.response_body = SLICE.encode()
    path = "/repos/slice/" + answer.replace(" ", "-")
    step, printed = _one(server, "http_request", {
        "url": f"https://api.test:{slicing.port}{path}", "headers": {"X-Range": "bytes=0-19"}})
    [seen] = slicing.requests
    assert seen.values("authorization") == [f"Bearer {CANARY}"]
    result = step["result"]
    assert result["is_error"] is True, step
    assert result["structured"]["error"]["reason"] == "response_sliced", step
    assert result["structured"]["error"]["message"] == \
        f"sealgate refused the call (response_sliced): {SLICED}"
    line = server.calls()[-1]
    assert (line["tool"], line["path"], line["decision"], line["reason"], line["detail"]) == (
        "http_request", path, "error", "response_sliced", SLICED)
    assert line["injected"] == ["broker:file:github"]
    for everything in (json.dumps(step), printed, server.audit_text(), server.stderr()):
        assert SLICE not in everything and CANARY[:10] not in everything


def test_http_request_passes_a_slice_when_nothing_was_injected(server: McpServer,
                                                               slicing: Origin) -> None:
    """The control: no credential went with the call, so nothing can be echoed; a 206 is the
    API's, and its range header was sent."""
    slicing.response_status = 206
    slicing.response_headers["Content-Range"] = "bytes 20-27/90"
    slicing.response_body = b"20-to-27"
    step, _ = _one(server, "http_request", {
        "url": f"https://api.test:{slicing.port}/plain/slice", "headers": {"Range": "bytes=20-27"}})
    [seen] = slicing.requests
    assert seen.values("range") == ["bytes=20-27"] and not seen.values("authorization")
    assert (step["result"]["is_error"], step["result"]["text"]) == (False, "20-to-27"), step
    line = server.calls()[-1]
    assert (line["decision"], line["reason"], line["status"], line["injected"]) == (
        "allow", None, 206, None)


def test_http_request_never_dials_an_address_the_rules_do_not_allow(server: McpServer) -> None:
    """A listener on loopback at a port no rule names: refused by the decision, and no
    connection ever arrives there."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        step, _ = _one(server, "http_request", {"url": f"http://127.0.0.1:{port}/"})
        assert step["result"]["structured"]["error"]["reason"] == "not_allowed"
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_a_policy_without_http_request_offers_none(server: McpServer) -> None:
    answer, _ = server.client([{"call": "http_request", "arguments": {
        "url": "https://api.test/repos/a"}}], basic("rep-1", KEYS["rep-1"]))
    assert answer["steps"][0]["error"]["code"] == -32602  # no such tool: nothing was called
