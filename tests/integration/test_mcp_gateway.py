"""`sealgate mcp gateway` (issue 29) in front of real upstream MCP servers built with the official
SDK's server side (MCPServer, Streamable HTTP, stateless; one answering JSON, one answering SSE
streams), over HTTPS on loopback, and the official client in front of it: only the listed
tools are seen and called, arguments are constrained, the upstream's credential is injected
and never reaches the agent (nor its echo: scrubbed in JSON and in streams), the agent's own
credentials never reach the upstream, a header that disagrees with the body is refused, and
an answer over its cap is a refusal. What the upstream received is read from its own log.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import KEYS
from tests.dnsstub import StubDNS
from tests.harness import OriginCA, key_digest
from tests.mcpkit import McpServer, Upstream, basic, needs_mcp_venv, rpc, rpc_headers
from tests.oauthfake import OAuthFake
from tests.sdk.kit import FakeAPI

pytestmark = needs_mcp_venv()

CANARY = "upstream-canary-8b3f2e1d"
CLIENT_ID, CLIENT_SECRET = "sealgate-gateway", "CANARY-gateway-client-secret-3c2b1a"
REFRESH = "CANARY-gateway-refresh-token-9e8d7c"
BOT = basic("bot-1", KEYS["bot-1"])
REP = basic("rep-1", KEYS["rep-1"])
LISTED = {"echo", "whoami", "search", "big", "ask"}
KINDS = {"docs": "application/json", "stream": "text/event-stream"}

def rules(json_port: int, sse_port: int, auth_port: int) -> str:
    def server(name: str, port: int) -> str:
        return f"""
      - name: {name}
        url: https://mcp.test:{port}/mcp
        credential: upstream
        tools:
          - name: echo
          - name: whoami
          - name: search
            arguments:
              repo: {{equals: octo/docs}}
              query: {{pattern: "[a-z ]{{1,20}}"}}
          - name: big
          - name: ask
        max_response_bytes: 65536
        timeout: 20"""
    account = f"""
      - name: account
        url: https://mcp2.test:{json_port}/mcp
        credential: account
        tools: [{{name: whoami}}]"""
    hasty = f"""
      - name: hasty
        url: https://mcp.test:{json_port}/mcp
        credential: upstream
        tools: [{{name: slow}}, {{name: echo}}]
        timeout: 1"""
    return f"""
version: 1
policies:
  ci:
    allow:
      - host: mcp.test
        ports: [{json_port}, {sse_port}]
        methods: [POST]
        paths: ["/mcp"]
        inject:
          - {{secret: "file:upstream", as: bearer, name: upstream}}
      - host: mcp2.test
        ports: [{json_port}]
        methods: [POST]
        paths: ["/mcp"]
        inject:
          - secret: file:oauth
            as: {{type: oauth2, token_url: "https://auth.test:{auth_port}/token"}}
            name: account
    allow_networks: [127.0.0.1/32]
    mcp_servers:{server("docs", json_port)}{server("stream", sse_port)}{hasty}{account}
  other:
    allow:
      - host: mcp.test
    allow_networks: [127.0.0.1/32]
  tight:
    allow:
      - host: mcp.test
        ports: [{json_port}]
        inject:
          - {{secret: "file:upstream", as: bearer, name: upstream}}
    allow_networks: [127.0.0.1/32]
    budgets: {{requests_per_second: 0.01, burst: 1}}
    mcp_servers:
      - {{name: docs, url: "https://mcp.test:{json_port}/mcp", credential: upstream,
         tools: [{{name: echo}}]}}
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
  rep-1: {{policy: other, key_sha256: "{key_digest(KEYS['rep-1'])}"}}
  closed-1: {{policy: tight, key_sha256: "{key_digest(KEYS['closed-1'])}"}}
default_policy: null
"""


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA
              ) -> Iterator[dict[str, Upstream]]:
    workdir = tmp_path_factory.mktemp("mcp-upstream")
    cert = test_ca.issue("mcp.test", "mcp2.test")
    started: dict[str, Upstream] = {}
    try:
        started["docs"] = Upstream(workdir, cert, "json")
        started["stream"] = Upstream(workdir, cert, "sse")
        yield started
    finally:
        for upstream in started.values():
            upstream.stop()


@pytest.fixture(scope="module")
def oauth() -> OAuthFake:
    return OAuthFake(client_id=CLIENT_ID, client_secret=CLIENT_SECRET, refresh_token=REFRESH)


@pytest.fixture(scope="module")
def auth(test_ca: OriginCA, dns: StubDNS, oauth: OAuthFake) -> Iterator[FakeAPI]:
    """The oauth2 token endpoint of the `account` server's credential."""
    dns.set("auth.test", "A 127.0.0.1")
    fake = FakeAPI(test_ca, ["auth.test"], oauth)
    yield fake
    fake.stop()


def _secrets() -> dict[str, str]:
    grant = {"refresh_token": REFRESH, "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET}
    # The store's value is the grant as JSON, written as a YAML double-quoted string.
    return {"upstream": CANARY, "oauth": json.dumps(json.dumps(grant))}


def _start(tmp_path_factory: pytest.TempPathFactory, upstreams: dict[str, Upstream],
           auth: FakeAPI, dns: StubDNS, test_ca: OriginCA, command: str) -> McpServer:
    for name in ("mcp.test", "mcp2.test"):
        dns.set(name, "A 127.0.0.1")
    return McpServer(tmp_path_factory.mktemp(f"mcp-{command}"),
                     rules(upstreams["docs"].port, upstreams["stream"].port, auth.port),
                     resolver=dns.address, upstream_ca=test_ca.path, secrets=_secrets(),
                     command=command)


def _stop(started: McpServer, oauth: OAuthFake) -> None:
    started.stop()
    logged = started.audit_text() + started.stderr()
    for canary in (CANARY, REFRESH, CLIENT_SECRET, *oauth.issued):
        assert canary not in logged
    assert "Traceback" not in started.stderr(), started.stderr()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstreams: dict[str, Upstream],
            auth: FakeAPI, oauth: OAuthFake, dns: StubDNS, test_ca: OriginCA
            ) -> Iterator[McpServer]:
    started = _start(tmp_path_factory, upstreams, auth, dns, test_ca, "gateway")
    yield started
    _stop(started, oauth)


def _run(gateway: McpServer, server: str, steps: list[dict[str, Any]],
         authorization: str = BOT, logged: list[Any] | None = None) -> list[dict[str, Any]]:
    answer, printed = gateway.client(steps, authorization, url=f"{gateway.url}/{server}")
    assert CANARY not in printed and KEYS["bot-1"] not in printed
    assert answer["discovered"].get("versions"), answer
    if logged is not None:
        logged.extend(answer["logged"])
    return list(answer["steps"])


def _last_reasons(gateway: McpServer, expected: list[str | None]) -> list[str | None]:
    """The reasons of the last audit lines, waited for (bounded): a line is written in the
    event loop turn after its answer went out."""
    for _ in range(100):
        found = [line["reason"] for line in _lines(gateway)[-len(expected):]]
        if found == expected:
            break
        time.sleep(0.02)
    return found


def _lines(gateway: McpServer) -> list[dict[str, Any]]:
    return [line for line in map(json.loads, gateway.audit_text().splitlines())
            if line.get("event") == "mcp_gateway"]


@pytest.mark.parametrize("server", ["docs", "stream"])
def test_only_the_listed_tools_are_listed(gateway: McpServer, server: str) -> None:
    [step] = _run(gateway, server, [{"list": True}])
    assert {tool["name"] for tool in step["tools"]} == LISTED  # delete_repo, slow filtered out
    listed = [line for line in _lines(gateway) if line["method"] == "tools/list"][-1]
    assert (listed["server"], listed["filtered"], listed["decision"]) == (server, 2, "allow")
    assert listed["content_type"] == KINDS[server]  # each server answered as it was made to


@pytest.mark.parametrize("server", ["docs", "stream"])
def test_the_upstream_gets_its_credential_and_the_agent_never_sees_it(
        gateway: McpServer, upstreams: dict[str, Upstream], server: str) -> None:
    logged: list[Any] = []
    steps = _run(gateway, server, [{"call": "whoami"}, {"call": "echo",
                                                        "arguments": {"text": "hello"}}],
                 logged=logged)
    whoami, echo = steps[0]["result"], steps[1]["result"]
    assert echo == {"text": "hello", "structured": {"result": "hello"}, "is_error": False}
    # The upstream echoed the bearer it got; the agent reads it masked.
    assert whoami["text"].startswith("you called with Bearer [REDACTED]"), whoami
    assert CANARY not in json.dumps(whoami)
    seen = upstreams[server].requests()
    assert seen and all(r["headers"].get("authorization") == f"Bearer {CANARY}" for r in seen)
    # Nothing of the agent's own request but the body and routing headers went upstream.
    assert all(KEYS["bot-1"] not in json.dumps(r) and "Basic" not in json.dumps(r)
               for r in seen)
    line = [line for line in _lines(gateway) if line["tool"] == "whoami"][-1]
    assert line["injected"] == ["broker:file:upstream"] and line["scrubbed"] >= 1
    assert line["content_type"] == KINDS[server]
    if server == "stream":  # each stream's log notification leaked it: the agent got it masked
        assert len(logged) >= 3 and all(str(data).startswith("called with Bearer [REDACTED]")
                                        for data in logged), logged
        line = [line for line in _lines(gateway) if line["tool"] == "echo"][-1]
        assert line["scrubbed"] >= 1
    assert (line["sandbox"], line["host"], line["path"]) == ("bot-1", "mcp.test", "/mcp")


@pytest.mark.parametrize("server", ["docs", "stream"])
def test_an_unlisted_tool_is_refused_and_never_sent(gateway: McpServer,
                                                    upstreams: dict[str, Upstream],
                                                    server: str) -> None:
    [step] = _run(gateway, server, [{"call": "delete_repo", "arguments": {"repo": "x"}}])
    assert step["error"]["code"] == -32602 and "delete_repo" in step["error"]["message"]
    assert "delete_repo" not in upstreams[server].called()
    line = _lines(gateway)[-1]
    assert (line["tool"], line["decision"], line["reason"]) == ("delete_repo", "deny",
                                                                "not_allowed")


@pytest.mark.parametrize("server", ["docs", "stream"])
def test_arguments_are_constrained(gateway: McpServer, upstreams: dict[str, Upstream],
                                   server: str) -> None:
    steps = _run(gateway, server, [
        {"call": "search", "arguments": {"repo": "octo/secret", "query": "how"}},
        {"call": "search", "arguments": {"repo": "octo/docs", "query": "HOW; drop"}},
        {"call": "search", "arguments": {"query": "how"}},
        {"call": "search", "arguments": {"repo": "octo/docs", "query": "how to"}}])
    refused = [step["result"] for step in steps[:3]]
    assert all(r["is_error"] and "tool_arguments_invalid" in r["text"] for r in refused)
    assert "'repo'" in refused[0]["text"] and "octo/secret" not in refused[0]["text"]
    assert "'query'" in refused[1]["text"] and "must be given" in refused[2]["text"]
    assert steps[3]["result"]["text"] == "searched octo/docs for how to"
    searched = [name for name in upstreams[server].called() if name == "search"]
    assert len(searched) == 1  # only the allowed one went upstream
    denied = [line for line in _lines(gateway) if line["tool"] == "search"][-4:-1]
    assert all(line["reason"] == "tool_arguments_invalid" for line in denied)
    assert "octo/secret" in denied[0]["arguments"]  # the audit keeps what was asked


@pytest.mark.parametrize("server", ["docs", "stream"])
def test_an_answer_over_its_cap_is_a_refusal(gateway: McpServer, server: str) -> None:
    [step] = _run(gateway, server, [{"call": "big"}])
    assert step["result"]["is_error"] and "response_too_large" in step["result"]["text"]
    line = [line for line in _lines(gateway) if line["tool"] == "big"][-1]
    assert (line["content_type"], line["reason"]) == (KINDS[server], "response_too_large")


def test_an_oauth2_credential_is_exchanged_for_the_upstream_and_never_seen(
        gateway: McpServer, upstreams: dict[str, Upstream], auth: FakeAPI,
        oauth: OAuthFake) -> None:
    whoami, again = _run(gateway, "account", [{"call": "whoami"}, {"call": "whoami"}])
    for step in (whoami, again):
        assert step["result"]["text"].startswith("you called with Bearer [REDACTED]"), step
    # The access token the endpoint issued is what the upstream got; the agent read it masked.
    got = [r["headers"]["authorization"] for r in upstreams["docs"].requests()
           if r["headers"].get("host", "").startswith("mcp2.test")]
    assert got and all(a.removeprefix("Bearer ") in oauth.issued for a in got)
    assert len([r for r in auth.requests if r.path == "/token"]) == 1  # held, not re-fetched
    for canary in (REFRESH, CLIENT_SECRET, *oauth.issued):
        assert canary not in json.dumps([whoami, again])
    line = [line for line in _lines(gateway) if line["server"] == "account"][-1]
    assert line["decision"] == "allow" and line["scrubbed"] >= 1


def test_a_spent_budget_is_refused_late_and_nothing_sent(gateway: McpServer,
                                                          upstreams: dict[str, Upstream]
                                                          ) -> None:
    # The budget counts every message sent upstream: discover spends the one token.
    steps = _run(gateway, "docs", [{"call": "echo", "arguments": {"text": "spent"}}],
                 authorization=basic("closed-1", KEYS["closed-1"]))
    result = steps[0]["result"]
    assert result["is_error"] and "budget_exceeded" in result["text"]
    assert steps[0]["seconds"] >= 0.9  # held a second, as the proxy holds it
    assert not any("spent" in r["body"] for r in upstreams["docs"].requests())
    line = _lines(gateway)[-1]
    assert (line["sandbox"], line["reason"]) == ("closed-1", "budget_exceeded")


def test_a_slow_upstream_is_a_timeout_and_the_next_call_goes_through(gateway: McpServer
                                                                     ) -> None:
    slow, echo = _run(gateway, "hasty", [{"call": "slow"},
                                         {"call": "echo", "arguments": {"text": "next"}}])
    assert slow["result"]["is_error"] and "upstream_timeout" in slow["result"]["text"]
    assert slow["seconds"] < 4
    assert echo["result"]["text"] == "next"  # not on the abandoned connection
    line = [line for line in _lines(gateway) if line["tool"] == "slow"][-1]
    assert (line["decision"], line["reason"]) == ("error", "upstream_timeout")


def test_a_routing_header_that_disagrees_with_the_body_is_refused(
        gateway: McpServer, upstreams: dict[str, Upstream]) -> None:
    before = len(upstreams["docs"].requests())
    body = json.dumps(rpc("tools/call", {"name": "delete_repo", "arguments": {}})).encode()
    status, answer, _ = gateway.post(body, {"Authorization": BOT, **rpc_headers(
        "tools/call", "echo")}, url=f"{gateway.url}/docs")
    assert status == 400 and answer is not None and answer["error"]["code"] == -32020
    assert len(upstreams["docs"].requests()) == before  # nothing went upstream


def test_input_requests_are_relayed_neither_way(gateway: McpServer,
                                                upstreams: dict[str, Upstream]) -> None:
    """2026-07-28's multi-round-trip requests (an upstream's InputRequiredResult, the agent's
    retry with inputResponses and requestState) are not relayed: an upstream ties the state
    to its caller, here the gateway's shared credential, and what it asks goes to a user the
    rules never named. Found by review (helper-48): both passed through."""
    headers = {"Authorization": BOT, **rpc_headers("tools/call", "echo")}
    before = len(upstreams["docs"].requests())
    for extra in ({"requestState": "upstream-state-5d1c"},
                  {"inputResponses": {"q": {"action": "accept", "content": {"repo": "x"}}}}):
        body = json.dumps(rpc("tools/call", {"name": "echo", "arguments": {"text": "hi"},
                                             **extra})).encode()
        status, answer, _ = gateway.post(body, headers, url=f"{gateway.url}/docs")
        assert status == 200 and answer is not None and answer["result"]["isError"], answer
        assert "protocol_not_allowed" in answer["result"]["content"][0]["text"]
    assert len(upstreams["docs"].requests()) == before  # nothing went upstream
    body = json.dumps(rpc("tools/call", {"name": "ask", "arguments": {}})).encode()
    status, answer, _ = gateway.post(body, {"Authorization": BOT, **rpc_headers(
        "tools/call", "ask")}, url=f"{gateway.url}/docs")
    assert len(upstreams["docs"].requests()) == before + 1  # asked, and it asked back
    assert status == 200 and answer is not None and answer["result"]["isError"], answer
    assert "protocol_not_allowed" in answer["result"]["content"][0]["text"]
    assert "upstream-state-5d1c" not in json.dumps(answer)
    assert "Which repository" not in json.dumps(answer)
    assert _last_reasons(gateway, ["protocol_not_allowed"] * 3) == ["protocol_not_allowed"] * 3


def test_an_upstreams_malformed_answers_are_clear_refusals(gateway: McpServer) -> None:
    """Found by review: a tool named by an object in tools/list, and a lone surrogate in a
    result, each came back as internal_error. The one is filtered out as unlisted, the other
    is an answer that is not JSON text."""
    status, answer, _ = gateway.post(json.dumps(rpc("tools/list", {}, id=77)).encode(), {
        "Authorization": BOT, **rpc_headers("tools/list")}, url=f"{gateway.url}/docs")
    assert status == 200 and answer is not None, answer
    assert [t["name"] for t in answer["result"]["tools"]] == ["echo"]
    status, answer, _ = gateway.post(json.dumps(rpc("tools/call", {
        "name": "echo", "arguments": {"text": "x"}}, id=77)).encode(), {
        "Authorization": BOT, **rpc_headers("tools/call", "echo")}, url=f"{gateway.url}/docs")
    assert status == 200 and answer is not None and answer["result"]["isError"], answer
    assert "response_not_json" in answer["result"]["content"][0]["text"]
    assert _last_reasons(gateway, [None, "response_not_json"]) == [None, "response_not_json"]


@pytest.mark.parametrize("server", ["docs", "stream"])
def test_no_raw_line_separator_reaches_the_agent(gateway: McpServer, server: str) -> None:
    """U+2028, U+2029 and U+0085 (NEL) are raw JSON, and line ends to a client that splits an
    event stream as Python's splitlines() does: a string of the upstream's could spell an event
    of its own. They go escaped; the text the agent reads is the same."""
    import requests

    text = "a\u2028data: {\"forged\": 1}\u2029b\u0085id: 7\u0085c"
    body = json.dumps(rpc("tools/call", {"name": "echo", "arguments": {"text": text}}))
    answer = requests.post(f"{gateway.url}/{server}", data=body.encode(), timeout=10, headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "Authorization": BOT, **rpc_headers("tools/call", "echo")})
    assert answer.status_code == 200
    assert b"\xe2\x80\xa8" not in answer.content and b"\xe2\x80\xa9" not in answer.content
    assert b"\xc2\x85" not in answer.content
    raw = answer.content.decode()
    if server == "stream":
        raw = [line[5:] for line in raw.splitlines() if line.startswith("data:")][-1]
    assert json.loads(raw)["result"]["content"][0]["text"] == text


def test_another_policys_sandbox_has_no_such_server(gateway: McpServer,
                                                   upstreams: dict[str, Upstream]) -> None:
    before = len(upstreams["docs"].requests())
    body = json.dumps(rpc("tools/list")).encode()
    status, answer, _ = gateway.post(body, {"Authorization": REP, **rpc_headers("tools/list")},
                                     url=f"{gateway.url}/docs")
    assert status == 404 and answer is not None and "no MCP server named" in answer["error"][
        "message"]
    status, _, headers = gateway.post(body, rpc_headers("tools/list"), url=f"{gateway.url}/docs")
    assert status == 401 and headers["www-authenticate"].startswith("Basic")
    assert len(upstreams["docs"].requests()) == before


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, upstreams: dict[str, Upstream],
           auth: FakeAPI, oauth: OAuthFake, dns: StubDNS, test_ca: OriginCA
           ) -> Iterator[McpServer]:
    started = _start(tmp_path_factory, upstreams, auth, dns, test_ca, "serve")
    yield started
    _stop(started, oauth)


def test_serve_holds_the_gateway_on_its_own_port(served: McpServer,
                                                 upstreams: dict[str, Upstream]) -> None:
    # `sealgate mcp serve` (the port a sandbox's firewall lets through, --mcp-port) answers
    # /mcp/<server> as the gateway does, and /mcp as before.
    assert "/mcp/<server>: 5 upstream server(s)" in served.stderr()
    listed, whoami = _run(served, "stream", [{"list": True}, {"call": "whoami"}])
    assert {tool["name"] for tool in listed["tools"]} == LISTED
    assert whoami["result"]["text"].startswith("you called with Bearer [REDACTED]")
    assert upstreams["stream"].requests()[-1]["headers"]["authorization"] == f"Bearer {CANARY}"
    answer, _ = served.client([{"list": True}], BOT)
    assert answer["steps"] == [{"tools": [], "seconds": answer["steps"][0]["seconds"]}]

