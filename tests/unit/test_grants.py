"""The token-exchange processors as data and their secrets (issuer/grants.py): fields checked
as rules load them, secrets read naming fields only, the JWTs verified with PyJWT (not our
code) and the public key, answers read as each service writes them, never sealed in a token,
explained without a value."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
import pytest

from sealgate.issuer import Claims, HostPattern, grants
from sealgate.issuer import processors as pr
from sealgate.issuer.errors import TokenMalformed
from sealgate.issuer.keys import generate
from sealgate.proxy.policy.explain import injects
from sealgate.proxy.policy.rulesfile import RulesError, load_rules
from tests.oauthfake import rsa_key

KEY, PEM = rsa_key()
APP = json.dumps({"app_id": 4242, "private_key": PEM})
ACCOUNT = json.dumps({"type": "service_account", "client_email": "ci@p.iam.gserviceaccount.com",
                      "private_key": PEM, "private_key_id": "abc123",
                      "token_uri": "https://oauth2.googleapis.com/token", "project_id": "p"})


def rules_with(tmp_path: Path, processor: str) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(f"""version: 1
policies:
  p:
    allow:
      - host: api.example.com
        inject:
          - secret: env:GRANT
            as: {processor}
""")
    return path


@pytest.mark.parametrize("processor", [
    '{type: oauth2, token_url: "https://auth.example.com/token"}',
    '{type: oauth2, token_url: "https://a.example/t", grant: client_credentials, '
    'scopes: [read, "repo:status"], audience: "https://api.example.com", client_auth: body}',
    '{type: github-app, installation_id: "123", repositories: [a, b], '
    'permissions: ["contents:read", "issues:write"]}',
    '{type: gcp-service-account, scopes: ["https://www.googleapis.com/auth/cloud-platform"]}',
    '{type: gcp-service-account, audience: "https://svc-abc.a.run.app"}',
])
def test_rules_take_them(tmp_path: Path, processor: str) -> None:
    (rule,) = load_rules(rules_with(tmp_path, processor)).policies["p"].rules
    (said,) = injects(rule)
    assert "obtained" in said and "<" in said and "from env:GRANT" in said


@pytest.mark.parametrize(("processor", "why"), [
    ('{type: oauth2, token_url: "http://auth.example.com/token"}', "https URL"),
    ('{type: oauth2, token_url: "https://u:p@auth.example.com/"}', "https URL"),
    ('{type: oauth2, token_url: "https://a.example/", grant: password}', "grant must be"),
    ('{type: oauth2, token_url: "https://a.example/", scopes: ["a b"]}', "scope tokens"),
    ('{type: oauth2}', "missing"),
    ('{type: github-app, installation_id: "12a"}', "digits"),
    ('{type: github-app, installation_id: "1", permissions: ["contents:all"]}', "name:level"),
    ('{type: github-app, installation_id: "1", api: "http://ghe.example"}', "https URL"),
    ('{type: gcp-service-account}', "one of them"),
    ('{type: gcp-service-account, scopes: [x], audience: "https://a.example"}', "one of them"),
])
def test_rules_check_their_fields(tmp_path: Path, processor: str, why: str) -> None:
    with pytest.raises(RulesError, match=why):
        load_rules(rules_with(tmp_path, processor))


def test_secrets_are_read_naming_fields_never_values() -> None:
    canary = "CANARY-secret-value-0123"
    for secret, kind in ((json.dumps({"refresh_token": canary, "x": canary}), "unknown"),
                         (json.dumps({"client_secret": canary}), "refresh_token"),
                         (canary, "JSON object")):
        with pytest.raises(grants.GrantError, match=kind) as err:
            grants.parse_oauth(secret, "refresh_token")
        assert canary not in str(err.value)
    with pytest.raises(grants.GrantError, match="client_id"):
        grants.parse_oauth(json.dumps({"client_secret": canary}), "client_credentials")
    with pytest.raises(grants.GrantError, match="RSA key"):
        grants.parse_app(json.dumps({"app_id": "1", "private_key": "-----BEGIN " + canary}))
    with pytest.raises(grants.GrantError, match="service_account"):
        grants.parse_service_account(json.dumps({"type": "user"}))


def test_app_jwt_verifies_with_the_public_key_and_allows_for_skew() -> None:
    now = time.time()
    token = grants.app_jwt(grants.parse_app(APP), now)
    claims = jwt.decode(token, KEY.public_key(), algorithms=["RS256"])
    assert claims["iss"] == "4242"
    assert claims["iat"] == int(now) - 60 and claims["exp"] - claims["iat"] <= 600


def test_service_account_assertion_verifies_for_scopes_or_an_audience() -> None:
    account = grants.parse_service_account(ACCOUNT)
    token = grants.service_account_assertion(account, scopes="a b", audience=None)
    assert jwt.get_unverified_header(token)["kid"] == "abc123"
    claims = jwt.decode(token, KEY.public_key(), algorithms=["RS256"],
                        audience="https://oauth2.googleapis.com/token",
                        issuer="ci@p.iam.gserviceaccount.com")
    assert claims["scope"] == "a b" and "target_audience" not in claims
    token = grants.service_account_assertion(account, scopes=None, audience="https://x.run")
    claims = jwt.decode(token, KEY.public_key(), algorithms=["RS256"],
                        audience="https://oauth2.googleapis.com/token")
    assert claims["target_audience"] == "https://x.run" and "scope" not in claims


def test_answers_as_each_service_writes_them() -> None:
    now = 1_700_000_000.0
    read = grants.read_answer(200, {"access_token": "at", "expires_in": 60,
                                    "refresh_token": "rt2"}, now, kind="oauth2")
    assert (read.token, read.expires, read.refresh_token) == ("at", now + 60, "rt2")
    github = grants.read_answer(201, {"token": "ghs_x", "expires_at": "2023-11-14T22:13:20Z"},
                                now, kind="github-app")
    assert github.expires == now
    id_token = jwt.encode({"exp": int(now) + 99}, "k" * 32, algorithm="HS256")
    assert grants.read_answer(200, {"id_token": id_token}, now, kind="g").expires == now + 99
    with pytest.raises(grants.GrantError, match="400 invalid_grant"):
        grants.read_answer(400, {"error": "invalid_grant", "error_description": "CANARY"},
                           now, kind="oauth2")
    with pytest.raises(grants.GrantError, match="an error"):
        grants.read_answer(401, {"error": "CANARY value with spaces"}, now, kind="oauth2")


@pytest.mark.parametrize(("processor", "secret"), [
    (pr.OAuth2Processor("https://evil.example/token"), json.dumps({"refresh_token": "r"})),
    (pr.GitHubAppProcessor("1", api="https://evil.example"), APP),
    (pr.GcpServiceAccountProcessor(scopes="x"), ACCOUNT),
])
def test_never_sealed_in_a_token(tmp_path: Path, processor: pr.Processor, secret: str) -> None:
    """Anyone with the proxy's public key can seal a token: one that named a token endpoint
    would make the proxy send what it likes where it likes."""
    public = generate(tmp_path / "keys")
    now = int(time.time())
    with pytest.raises(TokenMalformed, match="only from a secret store"):
        Claims(kid=public.kid, secret=secret, processor=processor,
               hosts=(HostPattern("api.example.com", 443),), exp=now + 60, iat=now)
