"""sealgate.clients through the real proxy to a real HTTPS origin: what arrives at the origin.

Explicit mode (CONNECT, the proxy's CA) and base-URL mode (plain HTTP to /_/<host>), the
sandbox's key, sealed tokens in the proxy credentials (connection-scoped), in Proxy-Tokenizer
and in the base URL's path, and a refusal as `refusal()` reads it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.clients import base_url, refusal, requests_session
from sealgate.credentials import Claims, Destination, seal
from sealgate.credentials.keys import PublicKeyEntry
from sealgate.credentials.processors import BearerProcessor
from tests.conftest import KEYS
from tests.harness import Origin, OriginCA, Proxy, ProxyFactory, key_digest

CANARY = "sk_live_CLIENTS_CANARY_51d0"


@pytest.fixture()
def origin(origin_https: Origin) -> Iterator[Origin]:
    origin_https.reset()
    yield origin_https


def test_explicit_mode_reaches_the_origin(proxy: Proxy, trust: Path, origin: Origin) -> None:
    session = requests_session(proxy.url(), sandbox="bot-1", key=KEYS["bot-1"], ca_bundle=trust)
    r = session.get(f"https://api.test:{origin.port}/explicit?a=1", timeout=10)
    assert r.status_code == 200, r.text
    seen = origin.requests[-1]
    assert (seen.method, seen.path) == ("GET", "/explicit?a=1")
    assert "proxy-authorization" not in seen.headers  # the key stays with the proxy
    assert KEYS["bot-1"] not in str(seen.fields)


def test_explicit_mode_refusal_is_readable(proxy: Proxy, trust: Path, origin: Origin) -> None:
    session = requests_session(proxy.url(), sandbox="bot-1", key=KEYS["bot-1"], ca_bundle=trust)
    r = session.get(f"https://limited.test:{origin.port}/not-ok", timeout=10)
    found = refusal(r)
    assert found is not None, (r.status_code, r.text)
    assert (found.status, found.reason, found.type) == (403, "not_allowed", "egress_denied")
    assert found.policy == "ci" and found.request_id
    assert origin.untouched()


def test_base_url_mode_reaches_the_origin(proxy: Proxy, origin: Origin) -> None:
    session = requests_session(proxy.url(), sandbox="bot-1", key=KEYS["bot-1"], base_url=True)
    r = session.post(f"https://api.test:{origin.port}/v1/things?x=%20", data=b"body",
                     timeout=10)
    assert r.status_code == 200, r.text
    assert r.url == f"https://api.test:{origin.port}/v1/things?x=%20"
    seen = origin.requests[-1]
    assert (seen.method, seen.path, seen.body) == ("POST", "/v1/things?x=%20", b"body")
    assert seen.headers["host"] == f"api.test:{origin.port}"
    assert "proxy-authorization" not in seen.headers


def test_base_url_mode_without_identity_is_refused(proxy: Proxy, origin: Origin) -> None:
    session = requests_session(proxy.url(), base_url=True)  # default_policy: null
    r = session.get(f"https://api.test:{origin.port}/", timeout=10)
    found = refusal(r)
    assert found is not None and found.status == 407, r.text
    assert origin.untouched()


# -- sealed tokens ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tproxy(proxy_with: ProxyFactory, token_keys: tuple[Path, PublicKeyEntry],
           origin_https: Origin) -> Iterator[Proxy]:
    rules = f"""
version: 1
policies:
  agent:
    tokens: true
    allow:
      - host: api.test
        ports: [{origin_https.port}]
      - host: limited.test
        ports: [{origin_https.port}]
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: agent, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
default_policy: agent
"""
    with proxy_with(rules, name="client-tokens", token_keys=token_keys[0],
                    canaries=(CANARY,)) as p:
        yield p


def mint(public: PublicKeyEntry, port: int, host: str = "api.test") -> str:
    now = int(time.time())
    claims = Claims(kid=public.kid, secret=CANARY, processor=BearerProcessor(),
                    hosts=(Destination(host, port),), exp=now + 300, iat=now)
    return seal(claims, public)


@pytest.fixture()
def ttrust(tproxy: Proxy, test_ca: OriginCA) -> Path:
    path = tproxy.workdir / "trust.pem"
    if not path.exists():
        path.write_text(tproxy.ca.read_text() + test_ca.path.read_text())
    return path


def test_base_url_mode_tokens_in_the_header(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    token = mint(token_keys[1], origin.port)
    session = requests_session(tproxy.url(), sandbox="bot-1", key=KEYS["bot-1"],
                               tokens=[token], base_url=True)
    r = session.get(f"https://api.test:{origin.port}/h", headers={"Authorization": "dummy"},
                    timeout=10)
    assert r.status_code == 200, r.text
    seen = origin.requests[-1]
    assert seen.headers["authorization"] == f"Bearer {CANARY}"
    assert "proxy-tokenizer" not in seen.headers


def test_base_url_mode_tokens_in_the_path(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    """What an SDK configured with `base_url(...)` sends: no headers of ours at all."""
    import requests

    token = mint(token_keys[1], origin.port)
    url = base_url(tproxy.url(), f"https://api.test:{origin.port}", tokens=[token])
    assert url.endswith(f"@api.test:{origin.port}")
    r = requests.get(url + "/v1/p?q=1", timeout=10, proxies={"http": "", "https": ""})
    assert r.status_code == 200, r.text
    seen = origin.requests[-1]
    assert (seen.path, seen.headers["authorization"]) == ("/v1/p?q=1", f"Bearer {CANARY}")


def test_explicit_mode_connection_scoped_tokens(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, ttrust: Path
) -> None:
    """Tokens in the proxy credentials (needs the proxy's connection-scoped tokens): each
    applies to the requests its scope covers, and only to those."""
    token = mint(token_keys[1], origin.port)  # scoped to api.test only
    session = requests_session(tproxy.url(), sandbox="bot-1", key=KEYS["bot-1"],
                               tokens=[token], ca_bundle=ttrust)
    for _ in range(2):  # two requests in one tunnel: both carry it
        r = session.get(f"https://api.test:{origin.port}/c", timeout=10)
        assert r.status_code == 200, r.text
        assert origin.requests[-1].headers["authorization"] == f"Bearer {CANARY}"
    r = session.get(f"https://limited.test:{origin.port}/other", timeout=10)
    assert r.status_code == 200, r.text
    assert "authorization" not in origin.requests[-1].headers  # out of the token's scope


def test_explicit_mode_tokens_without_identity(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, ttrust: Path
) -> None:
    """`http://_:<token>@proxy`: the identity is the default policy's, the token still goes in."""
    token = mint(token_keys[1], origin.port)
    session = requests_session(tproxy.url(), tokens=[token], ca_bundle=ttrust)
    r = session.get(f"https://api.test:{origin.port}/anon", timeout=10)
    assert r.status_code == 200, r.text
    assert origin.requests[-1].headers["authorization"] == f"Bearer {CANARY}"
