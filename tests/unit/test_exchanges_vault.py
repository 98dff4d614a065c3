"""A rotated refresh token persisted to Vault KV v2: `credentials.exchanges` against the OAuth2
fake (HTTPS on loopback, dialed through a real guard and resolver) with its secret in the Vault
fake; the rotated token is written back (other fields kept), and after a restart (a new
Exchanges, nothing cached) the one in Vault is what is used."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.credentials.processors import OAuth2Processor
from sealgate.proxy.credentials.exchanges import Exchanges
from sealgate.proxy.credentials.secrets import SecretBroker, VaultConfig, VaultStore, parse_ref
from sealgate.proxy.net.guard import Guard
from sealgate.proxy.net.resolver import Resolver
from sealgate.proxy.policy.rulesfile import load_rules
from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.oauthfake import OAuthFake
from tests.sdk.kit import FakeAPI
from tests.vaultfake import VaultFake

AUTH = "auth.example.com"
REFRESH, CLIENT_SECRET = "CANARY-vault-refresh-0123456789", "CANARY-vault-client-secret-01"
REF = parse_ref("vault:kv/data/ci/oauth#grant")


@pytest.fixture
def vault() -> Iterator[VaultFake]:
    with VaultFake() as fake:
        fake.add_kv_mount("kv", version=2)
        fake.put("kv/ci/oauth", {"grant": json.dumps({"refresh_token": REFRESH,
                                                      "client_id": "ci",
                                                      "client_secret": CLIENT_SECRET}),
                                 "owner": "kept"})
        yield fake


def test_rotated_refresh_token_goes_back_to_vault(tmp_path: Path, vault: VaultFake,
                                                  test_ca: OriginCA, dns: StubDNS) -> None:
    oauth = OAuthFake(client_id="ci", client_secret=CLIENT_SECRET, refresh_token=REFRESH)
    api = FakeAPI(test_ca, [AUTH], oauth)
    dns.set(AUTH, "A 127.0.0.1")
    rules = tmp_path / "rules.yaml"
    rules.write_text("""version: 1
policies:
  p:
    allow:
      - host: api.example.com
    allow_networks: [127.0.0.1/32]
""")
    policy = load_rules(rules).policies["p"]
    processor = OAuth2Processor(f"https://{AUTH}:{api.port}/token")
    token_file = tmp_path / "token"
    token_file.write_text(vault.add_token(paths=["kv/data/ci/*"], write_paths=["kv/data/ci/*"]))
    token_file.chmod(0o600)
    host, port = dns.address

    async def restart() -> tuple[str, str]:
        """A fresh proxy's first request: the token it injects, and the stored grant."""
        secrets = SecretBroker([VaultStore(VaultConfig.from_url(
            f"vault:{vault.url}", token_file=str(token_file)))])
        exchanges = Exchanges(secrets, cafile=str(test_ca.path))
        guard = Guard(Resolver.from_spec(f"{host}:{port}"))
        try:
            stored = (await secrets.get(REF)).reveal()
            cred = await exchanges.credential(processor, stored, guard, policy, ref=REF,
                                              label=f"broker:{REF}")
            return cred.secret, stored
        finally:
            await exchanges.close()
            await secrets.close()

    try:
        first, stored = asyncio.run(restart())
        assert json.loads(stored)["refresh_token"] == REFRESH
        assert first in oauth.access
        (path, written), = vault.writes
        assert path == "kv/data/ci/oauth" and written["owner"] == "kept"
        rotated = json.loads(written["grant"])
        assert rotated["refresh_token"].startswith("rt-rotated-")
        assert rotated["client_secret"] == CLIENT_SECRET
        assert REFRESH not in oauth.live_refresh  # the old one is dead: only Vault's works
        second, stored = asyncio.run(restart())
        assert json.loads(stored)["refresh_token"] == rotated["refresh_token"]
        assert second in oauth.access and second != first
        assert oauth.grants[-1]["refresh_token"] == rotated["refresh_token"]
    finally:
        api.stop()
