"""gcp-service-account: the proxy holds a service-account key file, signs the JWT-bearer
assertion (RS256; the fake Google verifies it with the key's public key, its iss, aud and
scope) and injects the access token it gets; for a rule with an audience, an ID token
(`target_audience`, the answer's `id_token`), as a Cloud Run service wants. The sandbox calls
Google's APIs with plain `requests` and no credential (google-auth is not a dependency here).
Or the key file comes sealed in a token, its token_uri dialed where the sandbox's policy allows a
POST to it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
import yaml

from sealgate.credentials.processors import GcpServiceAccountProcessor
from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.oauthfake import GoogleFake, rsa_key
from tests.sdk.kit import World, policy, rules_file, world
from tests.sdk.kit import rule as allowing

TOKEN_HOST, STORAGE, RUN = "oauth2.googleapis.com", "storage.googleapis.com", "svc-abc.a.run.app"
EMAIL = "ci-runner@project-1.iam.gserviceaccount.com"
SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
KEYS = {"job-1": "gcp-key-job-1", "job-2": "gcp-key-job-2", "job-3": "gcp-key-job-3"}
KEY, PEM = rsa_key()


def rules(port: int) -> str:
    def rule(host: str, fields: str) -> str:
        return (f"      - host: {host}\n        ports: [{port}]\n        inject:\n"
                f"          - secret: file:gcp_key\n"
                f"            as: {{type: gcp-service-account, {fields}}}\n")

    allow = (rule(STORAGE, f'scopes: ["{SCOPE}"]')
             + rule(RUN, f'audience: "https://{RUN}"'))
    sealed = policy("sealed", allowing(STORAGE, [port]),
                    allowing(TOKEN_HOST, [port], methods=["POST"]), tokens=True)
    narrow = policy("narrow", allowing(STORAGE, [port]), tokens=True)  # no token_uri
    return rules_file([f"  job:\n    allow:\n{allow}    allow_networks: [127.0.0.1/32]\n",
                       sealed, narrow],
                      {"job-1": ("job", KEYS["job-1"]), "job-2": ("sealed", KEYS["job-2"]),
                       "job-3": ("narrow", KEYS["job-3"])},
                      default=None)


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("gcp")
    holder: dict[str, GoogleFake] = {}

    def route(seen: object) -> object:
        return holder["fake"](seen)  # type: ignore[arg-type]

    with world(directory, test_ca, dns, [TOKEN_HOST, STORAGE, RUN], route,  # type: ignore[arg-type]
               rules, KEYS, "unused") as made:
        token_uri = f"https://{TOKEN_HOST}:{made.fake.port}/token"
        fake = holder["fake"] = GoogleFake(EMAIL, KEY.public_key(), token_uri)
        key_file = {"type": "service_account", "project_id": "project-1",
                    "private_key_id": "0123abcd", "private_key": PEM, "client_email": EMAIL,
                    "client_id": "1234567890", "token_uri": token_uri}
        (directory / "secrets.yaml").write_text(yaml.safe_dump({"gcp_key":
                                                                json.dumps(key_file)}))
        made.google = fake  # type: ignore[attr-defined]
        yield made
    logged = made.proxy.audit_text() + made.proxy.stderr()
    assert PEM.splitlines()[5] not in logged
    for token in fake.tokens:
        assert token not in logged


GET = """
def main(url):
    import requests
    r = requests.get(url, timeout=20)
    return [r.status_code, r.headers.get("x-sealgate-error"), r.text]
"""


def test_access_token_for_the_rule_scopes(w: World) -> None:
    fake: GoogleFake = w.google  # type: ignore[attr-defined]
    env = w.env("job-1")
    assert not [v for v in env.values() if "PRIVATE KEY" in v]
    for _ in range(2):
        status, _, body = w.run(GET, env, url=w.url("/storage/v1/b?project=p",
                                                    host=STORAGE)).ok()
        assert status == 200, body
    assert fake.calls == 1
    (claims,) = fake.claims
    assert claims["scope"] == SCOPE and claims["iss"] == EMAIL
    sent = w.fake.last().headers["authorization"]
    assert sent.startswith("Bearer ya29.") and sent.removeprefix("Bearer ") in fake.tokens


def test_id_token_for_an_audience(w: World) -> None:
    fake: GoogleFake = w.google  # type: ignore[attr-defined]
    status, _, body = w.run(GET, w.env("job-1"), url=w.url("/run", host=RUN)).ok()
    assert status == 200, body
    assert fake.claims[-1]["target_audience"] == f"https://{RUN}"
    sent = w.fake.last().headers["authorization"].removeprefix("Bearer ")
    assert jwt.decode(sent, fake.signer.public_key(), algorithms=["RS256"],
                      audience=f"https://{RUN}")["email"] == EMAIL


def _sealed_key(w: World) -> str:
    key_file = json.loads(yaml.safe_load((w.directory / "secrets.yaml").read_text())["gcp_key"])
    return w.mint(GcpServiceAccountProcessor(scopes=SCOPE), host=STORAGE,
                  secret=json.dumps(key_file))


def test_the_key_file_sealed_in_a_token(w: World) -> None:
    fake: GoogleFake = w.google  # type: ignore[attr-defined]
    before = fake.calls
    token = _sealed_key(w)
    env = w.env("job-2", key=f"{KEYS['job-2']},{token}")
    status, _, _ = w.run(GET, env, url=w.url("/storage/v1/b/bucket", host=STORAGE)).ok()
    assert status == 200
    assert fake.calls == before + 1 and fake.claims[-1]["scope"] == SCOPE
    (read,) = [r for r in w.fake.requests if r.path == "/storage/v1/b/bucket"]
    assert read.headers["authorization"].removeprefix("Bearer ") in fake.tokens


def test_a_sealed_key_file_is_not_exchanged_where_the_policy_does_not_allow_its_token_uri(
    w: World,
) -> None:
    fake: GoogleFake = w.google  # type: ignore[attr-defined]
    before = fake.calls
    w.fake.reset()
    env = w.env("job-3", key=f"{KEYS['job-3']},{_sealed_key(w)}")
    status, reason, body = w.run(GET, env, url=w.url("/storage/v1/b/x", host=STORAGE)).ok()
    assert (status, reason) == (403, "not_allowed"), body
    assert "a token's gcp-service-account endpoint" in body
    assert fake.calls == before and not w.fake.requests
