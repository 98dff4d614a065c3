"""The token-exchange processors as data and their secrets (issuer/grants.py): fields checked
as rules load them, secrets read naming fields only, the JWTs verified with PyJWT (not our
code) and the public key, answers read as each service writes them, sealed only with their own
secrets, explained without a value."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
import pytest

from sealgate.credentials import Claims, Destination, grants
from sealgate.credentials import processors as pr
from sealgate.credentials.errors import TokenMalformed
from sealgate.credentials.keys import Keyring, generate
from sealgate.credentials.token import unseal
from sealgate.proxy.policy.explain import injects
from sealgate.proxy.policy.rulesfile import RulesError, load_rules
from tests.oauthfake import rsa_key
from tests.unit.test_issuer_cli import run_here

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


@pytest.mark.parametrize(("processor", "secret", "wrong"), [
    (pr.OAuth2Processor("https://auth.example/token"), json.dumps({"refresh_token": "r"}),
     json.dumps({"client_id": "CANARY-id"})),
    (pr.GitHubAppProcessor("1", api="https://api.example"), APP,
     json.dumps({"app_id": 1, "private_key": "CANARY-key"})),
    (pr.GcpServiceAccountProcessor(scopes="x"), ACCOUNT,
     json.dumps({"type": "user", "private_key": "CANARY-key"})),
])
def test_sealed_in_a_token_with_its_secret_checked(
    tmp_path: Path, processor: pr.Processor, secret: str, wrong: str
) -> None:
    """Sealed as brokered (the proxy dials the endpoint only where the sandbox's policy
    allows a POST to it: tests/integration/test_oauth2.py); a secret that is not the
    processor's is refused at minting, naming no value."""
    public = generate(tmp_path / "keys")
    now = int(time.time())

    def claims(text: str) -> Claims:
        return Claims(kid=public.kid, secret=text, processor=processor,
                      hosts=(Destination("api.example.com", 443),), exp=now + 60, iat=now)

    assert claims(secret).processor == processor
    with pytest.raises(TokenMalformed) as refused:
        claims(wrong)
    assert "CANARY" not in str(refused.value)


@pytest.mark.parametrize(("args", "secret", "expected", "scheme"), [
    (["--inject", "oauth2", "--token-url", "https://auth.example.com/token", "--grant",
      "client_credentials", "--scopes", "read,write"],
     json.dumps({"client_id": "c", "client_secret": "CANARY-mint-secret"}),
     pr.OAuth2Processor("https://auth.example.com/token", grant="client_credentials",
                        scopes="read,write"), "Bearer"),
    (["--inject", "github-app", "--installation-id", "77", "--repositories", "widgets",
      "--permissions", "contents:read"], APP,
     pr.GitHubAppProcessor("77", repositories="widgets", permissions="contents:read"), "token"),
    (["--inject", "gcp-service-account", "--audience", "https://svc.a.run.app"], ACCOUNT,
     pr.GcpServiceAccountProcessor(audience="https://svc.a.run.app"), "Bearer"),
    (["--inject", "oauth2", "--token-url", "https://auth.example.com/token", "--scheme",
      "token"], json.dumps({"refresh_token": "r"}),
     pr.OAuth2Processor("https://auth.example.com/token", scheme="token"), "token"),
    (["--inject", "github-app", "--installation-id", "77", "--scheme", "Bearer"], APP,
     pr.GitHubAppProcessor("77", scheme="Bearer"), "Bearer"),
])
def test_mint_seals_an_exchange_processor(
    tmp_path: Path, args: list[str], secret: str, expected: pr.Processor, scheme: str | None
) -> None:
    """Without --scheme the processor's default scheme is sealed, with it the one given."""
    public = generate(tmp_path / "keys")
    done = run_here("mint", "--key", tmp_path / "keys" / f"{public.kid}.pub", "--host",
                    "api.example.com", *args, "--secret-env", "SECRET", env={"SECRET": secret})
    assert done.returncode == 0, done.stderr
    claims = unseal(done.stdout.strip(), Keyring.load(tmp_path / "keys"))
    assert claims.processor == expected and claims.secret == secret
    assert getattr(claims.processor, "scheme", None) == scheme


def test_mint_refuses_an_exchange_processor_without_its_fields(tmp_path: Path) -> None:
    public = generate(tmp_path / "keys")
    key = tmp_path / "keys" / f"{public.kid}.pub"
    missing = run_here("mint", "--key", key, "--host", "api.example.com", "--inject", "oauth2",
                       "--secret-env", "SECRET", env={"SECRET": '{"refresh_token": "r"}'})
    assert missing.returncode != 0 and "--token-url" in missing.stderr
    stray = run_here("mint", "--key", key, "--host", "api.example.com", "--inject", "bearer",
                     "--installation-id", "1", "--secret-env", "SECRET", env={"SECRET": "x"})
    assert stray.returncode != 0 and "does not take --installation-id" in stray.stderr
    wrong = run_here("mint", "--key", key, "--host", "api.example.com", "--inject", "github-app",
                     "--installation-id", "1", "--secret-env", "SECRET",
                     env={"SECRET": '{"private_key": "CANARY-pem"}'})
    assert wrong.returncode != 0 and "app_id" in wrong.stderr and "CANARY" not in wrong.stderr
