"""Brokered credentials through the real proxy: file and Vault stores, every injection form,
overwrite and placeholder behaviour, plain-HTTP refusal, Vault down within and past its grace."""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Iterator

import pytest
import requests

from tests.conftest import KEYS, client
from tests.harness import Origin, Proxy, ProxyFactory, key_digest
from tests.vaultfake import VaultFake

FILE_CANARY = "file-canary-9d8e7f6a5b"
VAULT_CANARY = "ghp_vault_canary_1a2b3c4d"
VAULT_TOKEN = "hvs.proxy-token-canary"


@pytest.fixture(scope="module")
def vault() -> Iterator[VaultFake]:
    with VaultFake() as server:
        server.add_kv_mount("kv", version=2)
        server.put("kv/ci/github", {"token": VAULT_CANARY})
        server.add_token(VAULT_TOKEN, paths=["kv/data/ci/*"])
        yield server


@pytest.fixture(scope="module")
def bproxy(
    tmp_path_factory: pytest.TempPathFactory, proxy_with: ProxyFactory, vault: VaultFake,
    origin_https: Origin, origin_http: Origin,
) -> Iterator[Proxy]:
    directory = tmp_path_factory.mktemp("broker")
    token_file = directory / "vault-token"
    token_file.write_text(VAULT_TOKEN)
    os.chmod(token_file, 0o600)
    s, h = origin_https.port, origin_http.port
    rules = f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{s}]
        paths: ["/gh/**"]
        inject:
          - secret: vault:kv/data/ci/github#token
            as: bearer
      - host: api.test
        ports: [{s}]
        paths: ["/stripe/**"]
        inject:
          - secret: file:stripe_key
            as: {{type: placeholder, header: X-Api-Key, placeholder: sg-placeholder-stripe}}
        strip: [X-Debug]
      - host: api.test
        ports: [{s}]
        paths: ["/basic/**"]
        inject:
          - secret: file:stripe_key
            as: {{type: basic, username: ci}}
      - host: api.test
        ports: [{s}]
        paths: ["/query/**"]
        inject:
          - secret: file:stripe_key
            as: {{type: query, param: key}}
      - host: api.test
        ports: [{h}]
        paths: ["/internal/**"]
        plain_http: true
        inject:
          - secret: file:stripe_key
            as: {{type: header, header: X-Internal, format: "k {{secret}}"}}
      - host: api.test
        ports: [{h}]
        paths: ["/insecure/**"]
        inject:
          - secret: file:stripe_key
            as: bearer
      - host: api.test
        ports: [{s}]
        paths: ["/signed/**"]
        inject:
          - secret: file:stripe_key
            as: {{type: hmac-sha256, header: X-Signature, format: "s={{signature}}", encoding: hex}}
      - host: api.test
        ports: [{s}]
        paths: ["/missing/**"]
        inject:
          - secret: vault:kv/data/ci/nothere#token
            as: bearer
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
default_policy: null
"""
    with proxy_with(
        rules, directory=directory, secrets={"stripe_key": FILE_CANARY},
        options=["--secret-store", f"vault:{vault.url}?auth=token&token_file={token_file}",
                 "--set", "sealgate_secret_ttl=1", "--set", "sealgate_secret_grace=2"],
        canaries=(FILE_CANARY, VAULT_CANARY, VAULT_TOKEN),
    ) as p:
        yield p


@pytest.fixture()
def origin(origin_https: Origin) -> Iterator[Origin]:
    origin_https.reset()
    yield origin_https
    origin_https.echo = False


def test_vault_bearer_overwrites_what_the_sandbox_sent(bproxy: Proxy, origin: Origin) -> None:
    r = client(bproxy).get(f"https://api.test:{origin.port}/gh/repos",
                           headers={"Authorization": "Bearer sandbox-guess"}, timeout=10)
    assert r.status_code == 200, r.text
    assert origin.requests[-1].headers["authorization"] == f"Bearer {VAULT_CANARY}"
    line = bproxy.wait_audit(lambda e: e.get("path") == "/gh/repos")
    assert line["overwrote"] == ["authorization"]
    assert line["injected"] == ["broker:vault:kv/data/ci/github#token"]


def test_placeholder_and_strip(bproxy: Proxy, origin: Origin) -> None:
    r = client(bproxy).get(
        f"https://api.test:{origin.port}/stripe/charges",
        headers={"X-Api-Key": "sg-placeholder-stripe", "X-Debug": "1"}, timeout=10,
    )
    assert r.status_code == 200, r.text
    seen = origin.requests[-1].headers
    assert seen["x-api-key"] == FILE_CANARY
    assert "x-debug" not in seen


def test_placeholder_absent_injects_nothing(bproxy: Proxy, origin: Origin) -> None:
    r = client(bproxy).get(f"https://api.test:{origin.port}/stripe/x",
                           headers={"X-Api-Key": "something-else"}, timeout=10)
    assert r.status_code == 400
    assert r.json()["reason"] == "request_inapplicable"
    assert origin.untouched()


def test_basic_and_query_forms(bproxy: Proxy, origin: Origin) -> None:
    import base64

    session = client(bproxy)
    assert session.get(f"https://api.test:{origin.port}/basic/x", timeout=10).status_code == 200
    expected = "Basic " + base64.b64encode(f"ci:{FILE_CANARY}".encode()).decode()
    assert origin.requests[-1].headers["authorization"] == expected
    assert session.get(f"https://api.test:{origin.port}/query/x?key=mine&a=1",
                       timeout=10).status_code == 200
    assert origin.requests[-1].path == f"/query/x?a=1&key={FILE_CANARY}"


def test_echo_is_scrubbed(bproxy: Proxy, origin: Origin) -> None:
    origin.echo = True
    r = client(bproxy).get(f"https://api.test:{origin.port}/gh/echo", timeout=10)
    assert r.status_code == 200
    assert VAULT_CANARY not in r.text
    assert "[REDACTED]" in r.text


def test_plain_http_only_where_the_rule_says(
    bproxy: Proxy, origin_http: Origin
) -> None:
    origin_http.reset()
    session = client(bproxy)
    ok = session.get(f"http://api.test:{origin_http.port}/internal/x", timeout=10)
    assert ok.status_code == 200
    assert origin_http.requests[-1].headers["x-internal"] == f"k {FILE_CANARY}"
    origin_http.reset()
    refused = session.get(f"http://api.test:{origin_http.port}/insecure/x", timeout=10)
    assert refused.status_code == 403
    assert refused.json()["reason"] == "insecure_upstream"
    assert origin_http.untouched()


def test_missing_secret_fails_closed(bproxy: Proxy, origin: Origin) -> None:
    r = client(bproxy).get(f"https://api.test:{origin.port}/missing/x", timeout=10)
    assert r.status_code == 503
    assert r.json()["reason"] == "secret_unavailable"
    assert origin.untouched()


def test_vault_down_within_then_past_grace(
    bproxy: Proxy, origin: Origin, vault: VaultFake
) -> None:
    session = client(bproxy)
    url = f"https://api.test:{origin.port}/gh/down"
    assert session.get(url, timeout=10).status_code == 200
    vault.down = True
    try:
        time.sleep(1.2)  # past the 1 s TTL, inside the 2 s grace: served from cache
        assert session.get(url, timeout=15).status_code == 200
        assert origin.requests[-1].headers["authorization"] == f"Bearer {VAULT_CANARY}"
        origin.reset()
        time.sleep(2.5)  # past the grace: closed
        r = session.get(url, timeout=20)
        assert r.status_code == 503
        assert r.json()["reason"] == "secret_unavailable"
        assert origin.untouched()
    finally:
        vault.down = False


@pytest.mark.parametrize("method", ["GET", "DELETE", "POST"])
def test_a_body_signature_without_a_body_signs_the_empty_body(
    bproxy: Proxy, origin: Origin, method: str
) -> None:
    """No Content-Length and no Transfer-Encoding is an empty body (RFC 9112 6.3): signed as
    such, not refused with 411."""
    request = requests.Request(method, f"https://api.test:{origin.port}/signed/{method}")
    prepared = client(bproxy).prepare_request(request)
    prepared.headers.pop("Content-Length", None)
    r = client(bproxy).send(prepared, timeout=10)
    assert r.status_code == 200, r.text
    seen = origin.requests[-1]
    assert "content-length" not in seen.headers or seen.headers["content-length"] == "0"
    empty = hmac.new(FILE_CANARY.encode(), b"", hashlib.sha256).hexdigest()
    assert seen.headers["x-signature"] == f"s={empty}"


def test_a_body_signature_over_a_chunked_body_is_refused(bproxy: Proxy, origin: Origin) -> None:
    """A chunked body's length is unknown until its end: it is neither buffered without bound
    nor signed early, but refused (docs/rules.md)."""
    r = client(bproxy).post(f"https://api.test:{origin.port}/signed/chunked",
                            data=iter([b"part one", b"part two"]), timeout=10)
    assert r.status_code == 411
    assert r.headers["x-sealgate-error"] == "length_required"
    assert not origin.requests
