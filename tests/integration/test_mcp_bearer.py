"""Bearer tokens at `sealgate mcp serve` (issue 29): a token `sealgate mcp token` minted for a
sandbox and this endpoint lists and calls that sandbox's tools, with the official MCP client; a
token expired, for another endpoint, badly signed, made with another key, malformed, or for a
sandbox the rules do not have is a 401 whose challenge names the resource metadata, with a
JSON-RPC error and nothing called; the metadata is served at both of RFC 9728's URLs; a bearer
beside Basic credentials is refused; and the token never reaches the API a tool calls nor an
upstream MCP server the gateway fronts, and is in no log line.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sealgate.mcp.bearer import KEY_FILE, TokenKey, load_key, mint
from tests.conftest import KEYS
from tests.dnsstub import StubDNS
from tests.harness import ROOT, SEALGATE, Origin, OriginCA, key_digest
from tests.mcpkit import McpServer, Upstream, basic, needs_mcp_venv, rpc, rpc_headers

pytestmark = needs_mcp_venv()

CANARY = "api-credential-canary-41d2"  # the upstream credential a tool carries
META = "/.well-known/oauth-protected-resource"


def rules(api_port: int, upstream_port: int) -> str:
    return f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{api_port}]
        inject: [{{secret: "file:k", as: bearer, name: k}}]
        tools_only: true
      - host: mcp.test
        ports: [{upstream_port}]
        methods: [POST]
        paths: ["/mcp"]
        inject: [{{secret: "file:k", as: bearer, name: upstream}}]
        tools_only: true
    allow_networks: [127.0.0.1/32]
    tools:
      - name: echo
        description: The API's echo of what it got.
        method: GET
        url: https://api.test:{api_port}/echo
        credential: k
    mcp_servers:
      - {{name: docs, url: "https://mcp.test:{upstream_port}/mcp", credential: upstream,
         tools: [{{name: echo}}, {{name: whoami}}]}}
  bare:
    allow: []
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
  rep-1: {{policy: bare, key_sha256: "{key_digest(KEYS['rep-1'])}"}}
default_policy: null
"""


@pytest.fixture(scope="module")
def api(test_ca: OriginCA) -> Iterator[Origin]:
    origin = Origin(tls=test_ca.issue("api.test"), echo=True)
    yield origin
    origin.stop()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
             ) -> Iterator[Upstream]:
    dns.set("mcp.test", "A 127.0.0.1")
    started = Upstream(tmp_path_factory.mktemp("bearer-upstream"), test_ca.issue("mcp.test"),
                       "json")
    yield started
    started.stop()


def _cli(state: Path, sandbox: str, audience: str, *more: str) -> str:
    """`sealgate mcp token`, as an operator runs it: the token it printed."""
    done = subprocess.run([*SEALGATE, "mcp", "token", "--sandbox", sandbox, "--audience",
                           audience, "--state", str(state), *more], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _start(workdir: Path, api: Origin, upstream: Upstream, dns: StubDNS, test_ca: OriginCA,
           extra: list[str] | None = None) -> McpServer:
    # The key first (the first `mcp token` makes it), so the server has it from its start.
    _cli(workdir / "state", "bot-1", "http://127.0.0.1:1/mcp")
    return McpServer(workdir, rules(api.port, upstream.port), resolver=dns.address,
                     upstream_ca=test_ca.path, secrets={"k": CANARY}, extra=extra)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, api: Origin, upstream: Upstream,
           dns: StubDNS, test_ca: OriginCA) -> Iterator[McpServer]:
    started = _start(tmp_path_factory.mktemp("mcp-bearer"), api, upstream, dns, test_ca)
    yield started
    started.stop()
    assert CANARY not in started.audit_text() + started.stderr()
    assert "Traceback" not in started.stderr(), started.stderr()


def _token(server: McpServer, sandbox: str = "bot-1", audience: str | None = None) -> str:
    return _cli(server.state, sandbox, audience or server.url)


def _key(server: McpServer) -> TokenKey:
    return load_key(server.state / KEY_FILE)


def _audit(server: McpServer) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.audit_text().splitlines()]


def _call(server: McpServer, authorization: str | None, url: str | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any] | None,
                                                          dict[str, str]]:
    sent = {**rpc_headers("tools/call", "echo"), **(headers or {})}
    if authorization is not None:
        sent["Authorization"] = authorization
    body = json.dumps(rpc("tools/call", {"name": "echo", "arguments": {}})).encode()
    return server.post(body, sent, url=url)


def _base(server: McpServer) -> str:
    return server.url.removesuffix("/mcp")


def test_a_token_lists_and_calls_its_sandboxs_tools(server: McpServer, api: Origin) -> None:
    api.reset()
    token = _token(server)
    answer, printed = server.client([{"list": True}, {"call": "echo"}], f"Bearer {token}")
    tools, called = answer["steps"]
    assert [t["name"] for t in tools["tools"]] == ["echo"]
    assert called["result"]["is_error"] is False
    [seen] = api.requests
    assert seen.values("authorization") == [f"Bearer {CANARY}"]  # the tool's, never the token
    line = [line for line in _audit(server) if line.get("event") == "tool_call"][-1]
    assert (line["sandbox"], line["identified_by"], line["policy"]) == ("bot-1", "bearer", "ci")
    assert CANARY not in printed
    # Another sandbox's token is that sandbox: its policy has no tools.
    answer, _ = server.client([{"list": True}], f"Bearer {_token(server, 'rep-1')}")
    assert answer["steps"][0]["tools"] == []


def test_the_token_reaches_no_upstream_and_no_log(server: McpServer, api: Origin,
                                                  upstream: Upstream) -> None:
    """The no-token-passthrough rule: the token is a canary, looked for at the API a tool calls,
    at the upstream MCP server the gateway fronts, and in every line the server wrote."""
    api.reset()
    token = _token(server)
    bearer = f"Bearer {token}"
    answer, _ = server.client([{"call": "echo"}], bearer)
    assert answer["steps"][0]["result"]["is_error"] is False
    answer, _ = server.client([{"call": "whoami"}, {"call": "echo", "arguments": {"text": "x"}}],
                              bearer, url=f"{server.url}/docs")
    whoami, echo = answer["steps"]
    assert echo["result"]["text"] == "x"
    assert whoami["result"]["text"].startswith("you called with Bearer [REDACTED]")
    seen_api = json.dumps([[s.path, s.fields, s.body.decode("latin-1")] for s in api.requests])
    seen_upstream = json.dumps(upstream.requests())
    assert len(api.requests) == 1 and len(upstream.requests()) >= 2
    mac = token.rpartition(".")[2]
    for seen in (seen_api, seen_upstream):
        assert token not in seen and mac not in seen
    assert all(r["headers"].get("authorization") == f"Bearer {CANARY}"
               for r in upstream.requests())
    logged = server.audit_text() + server.stderr()
    assert token not in logged and mac not in logged
    gateway = [line for line in _audit(server) if line.get("event") == "mcp_gateway"]
    assert {(line["sandbox"], line["identified_by"]) for line in gateway} == {("bot-1",
                                                                              "bearer")}


def _forged(server: McpServer, **changes: Any) -> str:
    """A token made with the server's own key (what only its holder can do), for the cases
    the CLI would not mint: issued long ago, or in the future."""
    claims = {"sandbox": "bot-1", "audience": server.url, "ttl": 600,
              "now": int(time.time()), **changes}
    return mint(_key(server), claims["sandbox"], claims["audience"], claims["ttl"],
                claims["now"])


def _flip(token: str) -> str:
    signed, _, mac = token.rpartition(".")
    return f"{signed}.{mac[:10]}{'A' if mac[10] != 'A' else 'B'}{mac[11:]}"


BAD = {
    "expired": (lambda s: _forged(s, now=int(time.time()) - 700), "expired"),
    "from the future": (lambda s: _forged(s, now=int(time.time()) + 600), "future"),
    "another endpoint": (lambda s: _token(s, audience="http://127.0.0.1:1/mcp"),
                         "another resource"),
    "a gateway server's url": (lambda s: _token(s, audience=f"{s.url}/docs"),
                               "another resource"),
    "bad signature": (lambda s: _flip(_token(s)), "signature"),
    "another key": (lambda s: mint(TokenKey(b"k" * 32), "bot-1", s.url, 600, int(time.time())),
                    "another key"),
    "not base64": (lambda s: _token(s).replace(".", ".!", 2), "not a sealgate MCP token"),
    "huge": (lambda s: _token(s) + "A" * 6000, "over 2048"),
    "a tab inside": (lambda s: _token(s).replace(".", ".\t", 1), "not a sealgate MCP token"),
    "latin-1 inside": (lambda s: _token(s) + "\xe9", "not a sealgate MCP token"),
    "a control character": (lambda s: _token(s).replace(".", ".\x01", 1),
                            "not a sealgate MCP token"),
    "DEL at the end": (lambda s: _token(s) + "\x7f", "not a sealgate MCP token"),
    "unknown sandbox": (lambda s: _token(s, "ghost-1"), "sandbox is not in the rules"),
    "empty": (lambda s: "", "not a sealgate MCP token"),
}


@pytest.mark.parametrize("endpoint", ["/mcp", "/mcp/docs"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_token_is_401_with_the_challenge_and_calls_nothing(
        server: McpServer, api: Origin, upstream: Upstream, case: str, endpoint: str) -> None:
    make, said = BAD[case]
    token = make(server)
    api.reset()
    lines, upstream_seen = len(_audit(server)), len(upstream.requests())
    status, answer, headers = _call(server, f"Bearer {token}", url=_base(server) + endpoint)
    assert status == 401, (status, answer)
    challenge = headers["www-authenticate"]
    assert challenge.startswith(f'Bearer resource_metadata="{_base(server)}{META}/mcp", '
                                'error="invalid_token", error_description="'), challenge
    assert said in challenge and challenge.endswith(', Basic realm="sealgate-mcp"')
    assert answer is not None and answer["error"]["code"] == -32600
    assert answer["error"]["message"].startswith("invalid_token: ") and said in json.dumps(answer)
    assert api.untouched() and len(upstream.requests()) == upstream_seen
    assert len(_audit(server)) == lines
    if token:
        assert token[5:] not in server.audit_text() + server.stderr()


def test_the_official_client_reads_the_refusal(server: McpServer, api: Origin) -> None:
    api.reset()
    answer, _ = server.client([{"list": True}], f"Bearer {_flip(_token(server))}")
    assert answer["discovered"]["error"]["code"] == -32600
    assert answer["discovered"]["error"]["message"].startswith("invalid_token: ")
    assert answer["steps"] == [] and api.untouched()


def _raw(server: McpServer, headers: list[tuple[str, str]]) -> int:
    """A tools/call with `headers` as given (a header twice, which requests cannot send): the
    status of the answer."""
    body = json.dumps(rpc("tools/call", {"name": "echo", "arguments": {}})).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.putrequest("POST", "/mcp", skip_accept_encoding=True)
        for name, value in [*rpc_headers("tools/call", "echo").items(),
                            ("Content-Type", "application/json"),
                            ("Content-Length", str(len(body))), *headers]:
            conn.putheader(name, value)
        conn.endheaders(body)
        return conn.getresponse().status
    finally:
        conn.close()


def test_no_credentials_get_both_challenges(server: McpServer) -> None:
    status, answer, headers = server.post(json.dumps(rpc("tools/list")).encode(),
                                          rpc_headers("tools/list"))
    assert status == 401 and answer is not None and answer["error"]["code"] == -32600
    assert headers["www-authenticate"] == (
        f'Basic realm="sealgate-mcp", Bearer resource_metadata="{_base(server)}{META}/mcp"')
    # Wrong Basic credentials: the same two.
    status, _, headers = _call(server, basic("bot-1", "not-its-key"))
    assert status == 401 and headers["www-authenticate"].startswith('Basic realm="sealgate-mcp"')
    assert f'Bearer resource_metadata="{_base(server)}{META}/mcp"' in headers["www-authenticate"]
    # A token in the query is no credential (the spec: the header only).
    status, _, _ = _call(server, None, url=f"{server.url}?access_token={_token(server)}")
    assert status == 401


@pytest.mark.parametrize("path", [f"{META}/mcp", META])
def test_the_resource_metadata_at_both_urls(server: McpServer, path: str) -> None:
    answer = requests.get(_base(server) + path, timeout=10)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    assert answer.json() == {"resource": server.url, "bearer_methods_supported": ["header"],
                             "resource_name": "sealgate MCP server"}
    assert requests.post(_base(server) + path, timeout=10).status_code == 405
    assert requests.get(f"{_base(server)}{META}/other", timeout=10).status_code == 404


def test_basic_and_bearer_together_are_refused(server: McpServer, api: Origin) -> None:
    api.reset()
    token, key = _token(server), basic("bot-1", KEYS["bot-1"])
    for joined in (f"Bearer {token}, {key}", f"{key}, Bearer {token}"):
        status, answer, headers = _call(server, joined)
        assert status == 400 and answer is not None and answer["error"]["code"] == -32600
        assert 'error="invalid_request"' in headers["www-authenticate"]
    assert _raw(server, [("Authorization", key), ("Authorization", f"Bearer {token}")]) == 400
    assert api.untouched()
    # Each alone still goes through.
    for alone in (key, f"Bearer {token}"):
        assert _call(server, alone)[0] == 200


def test_the_standalone_gateway_takes_tokens_and_serves_the_metadata(
        tmp_path: Path, api: Origin, upstream: Upstream, dns: StubDNS,
        test_ca: OriginCA) -> None:
    _cli(tmp_path / "state", "bot-1", "http://127.0.0.1:1/mcp")  # the key, before the start
    started = McpServer(tmp_path, rules(api.port, upstream.port), resolver=dns.address,
                        upstream_ca=test_ca.path, secrets={"k": CANARY}, command="gateway")
    try:
        assert requests.get(f"{_base(started)}{META}/mcp", timeout=10).json()["resource"] == \
            started.url
        token = _token(started)
        answer, _ = started.client([{"list": True}], f"Bearer {token}", url=f"{started.url}/docs")
        assert {t["name"] for t in answer["steps"][0]["tools"]} == {"echo", "whoami"}
        status, _, headers = _call(started, f"Bearer {_flip(token)}", url=f"{started.url}/docs")
        assert status == 401 and 'error="invalid_token"' in headers["www-authenticate"]
        assert token not in json.dumps(upstream.requests()) + started.audit_text()
    finally:
        started.stop()


def test_a_configured_resource_and_authorization_server(
        tmp_path: Path, api: Origin, upstream: Upstream, dns: StubDNS,
        test_ca: OriginCA) -> None:
    resource = "https://mcp.example.com/tools/mcp"
    started = _start(tmp_path, api, upstream, dns, test_ca, extra=[
        "--resource", "HTTPS://MCP.example.com:443/tools/mcp",
        "--authorization-server", "https://auth.example.com"])
    try:
        base = _base(started)
        assert requests.get(f"{base}{META}/mcp", timeout=10).status_code == 404
        for path in (f"{META}/tools/mcp", META):
            assert requests.get(base + path, timeout=10).json() == {
                "resource": resource, "bearer_methods_supported": ["header"],
                "resource_name": "sealgate MCP server",
                "authorization_servers": ["https://auth.example.com"]}
        status, _, headers = _call(started, f"Bearer {_token(started)}")  # its listen URL's
        assert status == 401 and "another resource" in headers["www-authenticate"]
        assert headers["www-authenticate"].startswith(
            f'Bearer resource_metadata="https://mcp.example.com{META}/tools/mcp"')
        assert _call(started, f"Bearer {_token(started, audience=resource)}")[0] == 200
    finally:
        started.stop()
