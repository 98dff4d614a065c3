"""Writing a secret back (a rotated refresh token): the file store rewrites its file whole and
private, Vault KV v2 sets one field with check-and-set (against tests/vaultfake.py), the env
store cannot be written, and the cache serves what was written."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

import pytest

from sealgate.proxy.credentials.secrets import (
    EnvStore,
    FileStore,
    SecretBroker,
    SecretConfigError,
    SecretDenied,
    VaultConfig,
    VaultStore,
    parse_ref,
)
from tests.vaultfake import VaultFake

ROTATED = "CANARY-rotated-refresh-0123"


def test_file_store_write_keeps_the_others_and_the_mode(tmp_path: Path) -> None:
    path = tmp_path / "secrets.yaml"
    path.write_text("# operator's comment\napi_key: k1\noauth: '{\"refresh_token\": \"old\"}'\n")
    path.chmod(0o600)
    store = FileStore(path)

    async def body() -> None:
        await store.write(parse_ref("file:oauth"), json.dumps({"refresh_token": ROTATED}))
        assert json.loads((await store.fetch(parse_ref("file:oauth")))[0].reveal()) == {
            "refresh_token": ROTATED}
        assert (await store.fetch(parse_ref("file:api_key")))[0].reveal() == "k1"

    asyncio.run(body())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secrets.yaml"]  # no temporary left
    assert FileStore(path)._parse(path.read_text())["api_key"] == "k1"


def test_file_store_json_stays_json(tmp_path: Path) -> None:
    path = tmp_path / "secrets.json"
    path.write_text('{"a": "1"}')
    path.chmod(0o600)
    asyncio.run(FileStore(path).write(parse_ref("file:b"), "2"))
    assert json.loads(path.read_text()) == {"a": "1", "b": "2"}


def test_env_store_cannot_be_written_and_the_cache_serves_a_write(tmp_path: Path) -> None:
    path = tmp_path / "secrets.yaml"
    path.write_text("oauth: old\n")
    path.chmod(0o600)
    broker = SecretBroker([EnvStore(), FileStore(path)])

    async def body() -> None:
        with pytest.raises(SecretConfigError, match="cannot be written"):
            await broker.write(parse_ref("env:HOME"), "x")
        assert (await broker.get("file:oauth")).reveal() == "old"
        await broker.write(parse_ref("file:oauth"), ROTATED)
        assert (await broker.get("file:oauth")).reveal() == ROTATED

    asyncio.run(body())


def test_vault_kv2_write_sets_one_field_with_check_and_set(tmp_path: Path) -> None:
    with VaultFake() as fake:
        fake.add_kv_mount("kv", version=2)
        fake.put("kv/ci/oauth", {"grant": "old", "other": "kept"})
        token = tmp_path / "token"
        writer = fake.add_token(paths=["kv/data/ci/*"], write_paths=["kv/data/ci/*"])
        reader = fake.add_token(paths=["kv/data/ci/*"])
        ref = parse_ref("vault:kv/data/ci/oauth#grant")

        async def body(secret: str) -> VaultStore:
            token.write_text(secret)
            token.chmod(0o600)
            store = VaultStore(VaultConfig.from_url(f"vault:{fake.url}", token_file=str(token)))
            try:
                await store.write(ref, ROTATED)
            finally:
                await store.close()
            return store

        asyncio.run(body(writer))
        assert fake.writes == [("kv/data/ci/oauth", {"grant": ROTATED, "other": "kept"})]
        with pytest.raises(SecretDenied):
            asyncio.run(body(reader))
        assert len(fake.writes) == 1
