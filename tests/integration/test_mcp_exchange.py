"""A tool whose credential is exchanged, not stored (issue 29): an oauth2 credential (a refresh
token and a client secret in the store) through `sealgate mcp serve`, against a real HTTPS fake
of both the token endpoint and the API. The MCP server obtains the access token from the
endpoint (dialed through the guard, as the proxy dials it), the API receives it, and the agent
sees none of the refresh token, the client secret or the access token; a token endpoint at an
address the guard refuses is never dialed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import KEYS
from tests.dnsstub import StubDNS
from tests.harness import OriginCA, key_digest
from tests.mcpkit import McpServer, basic, needs_mcp_venv
from tests.oauthfake import OAuthFake
from tests.sdk.kit import FakeAPI

pytestmark = needs_mcp_venv()

API, AUTH, INTERNAL = "api.example.com", "auth.example.com", "internal-auth.example.com"
CLIENT_ID, CLIENT_SECRET = "sealgate-mcp", "CANARY-mcp-client-secret-5a4b3c2d1e"
REFRESH = "CANARY-mcp-refresh-token-0f1e2d3c4b"
BOT = basic("bot-1", KEYS["bot-1"])


def rules(port: int) -> str:
    def oauth(url: str) -> str:
        return f'{{type: oauth2, token_url: "{url}"}}'

    return f"""
version: 1
policies:
  ci:
    allow:
      - host: {API}
        ports: [{port}]
        paths: ["/me/**"]
        inject:
          - secret: file:oauth
            as: {oauth(f"https://{AUTH}:{port}/token")}
            name: account
      - host: {API}
        ports: [{port}]
        paths: ["/inside/**"]
        inject:
          - secret: file:oauth
            as: {oauth(f"https://{INTERNAL}:{port}/token")}
            name: inside
    allow_networks: [127.0.0.1/32]
    tools:
      - {{name: me, description: Who the account is., method: GET, credential: account,
         url: "https://{API}:{port}/me/profile"}}
      - {{name: inside, description: A token endpoint the guard refuses., method: GET,
         credential: inside, url: "https://{API}:{port}/inside/profile"}}
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
default_policy: null
"""


@pytest.fixture(scope="module")
def oauth() -> OAuthFake:
    return OAuthFake(client_id=CLIENT_ID, client_secret=CLIENT_SECRET, refresh_token=REFRESH)


@pytest.fixture(scope="module")
def api(test_ca: OriginCA, dns: StubDNS, oauth: OAuthFake) -> Iterator[FakeAPI]:
    for name in (API, AUTH):
        dns.set(name, "A 127.0.0.1")
    dns.set(INTERNAL, "A 10.9.9.9")
    fake = FakeAPI(test_ca, [API, AUTH, INTERNAL], oauth)
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, api: FakeAPI, dns: StubDNS,
           test_ca: OriginCA, oauth: OAuthFake) -> Iterator[McpServer]:
    grant = {"refresh_token": REFRESH, "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET}
    # The store's value is the grant as JSON, written as a YAML double-quoted string.
    started = McpServer(Path(tmp_path_factory.mktemp("mcp-oauth")), rules(api.port),
                        resolver=dns.address, upstream_ca=test_ca.path,
                        secrets={"oauth": json.dumps(json.dumps(grant))})
    yield started
    started.stop()
    logged = started.audit_text() + started.stderr()
    for canary in (REFRESH, CLIENT_SECRET, *oauth.issued):
        assert canary not in logged


def test_the_exchanged_token_reaches_the_api_and_nothing_of_the_grant_the_agent(
        server: McpServer, api: FakeAPI, oauth: OAuthFake) -> None:
    api.reset()
    answer, printed = server.client([{"call": "me"}], BOT)
    result = answer["steps"][0]["result"]
    assert result["is_error"] is False, result
    token_calls = [r for r in api.requests if r.path == "/token"]
    profile = [r for r in api.requests if r.path == "/me/profile"]
    assert len(token_calls) == 1 and len(profile) == 1
    assert token_calls[0].sni == AUTH and oauth.grants[-1]["grant_type"] == "refresh_token"
    access = profile[0].headers["authorization"].removeprefix("Bearer ")
    assert access in oauth.issued
    # The API echoed the access token: the agent reads it masked, and no form of the grant.
    for canary in (REFRESH, CLIENT_SECRET, *oauth.issued):
        assert canary not in printed and canary not in json.dumps(result)
    line = server.calls()[-1]
    assert (line["tool"], line["decision"], line["status"]) == ("me", "allow", 200)
    # A second call reuses the held access token: no second exchange.
    server.client([{"call": "me"}], BOT)
    assert len([r for r in api.requests if r.path == "/token"]) == 1


def test_a_token_endpoint_the_guard_refuses_is_never_dialed(server: McpServer,
                                                            api: FakeAPI) -> None:
    api.reset()
    answer, printed = server.client([{"call": "inside"}], BOT)
    result = answer["steps"][0]["result"]
    assert result["is_error"] is True
    assert result["structured"]["error"]["reason"] == "secret_unavailable", result
    # Refused by the guard before any dial (the address is not even routable from here: the
    # words, not a timeout, say which).
    assert "is refused (private)" in result["text"]
    assert "10.9.9.9" not in printed and REFRESH not in printed
    assert api.untouched()
