"""References, redacting values, the file and env stores, open_store and the broker."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sealgate.proxy.credentials.secrets import (
    EnvStore,
    FileStore,
    Secret,
    SecretBroker,
    SecretConfigError,
    SecretNotFound,
    SecretRef,
    SecretUnavailable,
    VaultConfig,
    VaultStore,
    open_store,
    parse_ref,
)

CANARY = "CANARY-file-5b1e22"


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def write_private(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


# -- references ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("vault:kv/data/ci/github#token", SecretRef("vault", "kv/data/ci/github", "token")),
        ("vault:secret/app#api_key", SecretRef("vault", "secret/app", "api_key")),
        ("file:stripe_key", SecretRef("file", "stripe_key")),
        ("env:GITHUB_TOKEN", SecretRef("env", "GITHUB_TOKEN")),
    ],
)
def test_parse_ref_round_trips(text: str, expected: SecretRef) -> None:
    assert parse_ref(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(
    "text",
    [
        "kv/data/x#f",  # no store
        "s3:bucket/key",
        "vault:kv/data/ci/github",  # no field
        "vault:kv/data/ci/github#",
        "vault:kv#token",  # no path below the mount
        "vault:kv/data#token",  # KV v2 mount without a secret
        "vault:kv/../sys/raw#x",
        "vault:/kv/data/x#f",
        "vault:kv//x#f",
        "file:stripe#field",
        "file:../etc/passwd",
        "env:1BAD",
        "env:",
    ],
)
def test_parse_ref_rejects(text: str) -> None:
    with pytest.raises(SecretConfigError) as err:
        parse_ref(text)
    assert err.value.reason == "secret_config"


def test_vault_ref_from_yaml_form() -> None:
    assert str(SecretRef.vault("kv", "ci/github", "token")) == "vault:kv/data/ci/github#token"
    assert str(SecretRef.vault("secret", "app", "k", kv_version=1)) == "vault:secret/app#k"
    with pytest.raises(SecretConfigError):
        SecretRef.vault("kv", "x", "f", kv_version=3)


_segment = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,8}", fullmatch=True)


@settings(max_examples=50, deadline=None)
@given(st.lists(_segment, min_size=2, max_size=5), _segment)
def test_vault_refs_round_trip(segments: list[str], field: str) -> None:
    text = "vault:" + "/".join(segments) + "#" + field
    try:
        ref = parse_ref(text)
    except SecretConfigError:
        assert segments[-1] == "data"  # only a v2 path naming no secret is refused
        return
    assert str(ref) == text


# -- Secret -------------------------------------------------------------------------------


def test_secret_never_shows_its_value() -> None:
    secret = Secret(CANARY)
    assert CANARY not in repr(secret)
    assert CANARY not in str(secret)
    assert CANARY not in f"{secret}"
    assert repr(secret) == f"Secret(<redacted, {len(CANARY)} chars>)"
    assert secret.reveal() == CANARY
    assert secret == Secret(CANARY)
    assert secret != Secret("other")
    with pytest.raises(TypeError):
        pickle.dumps(secret)
    with pytest.raises(TypeError):
        hash(secret)


# -- file store ---------------------------------------------------------------------------


def test_file_store_reads_yaml_and_json(tmp_path: Path) -> None:
    yaml_file = write_private(tmp_path / "s.yaml", f"stripe_key: {CANARY}\nother: x\n")
    json_file = write_private(tmp_path / "s.json", json.dumps({"stripe_key": CANARY}))
    for path in (yaml_file, json_file):
        secret, ttl = run(FileStore(path).fetch(parse_ref("file:stripe_key")))
        assert secret.reveal() == CANARY
        assert 0 < ttl <= 5


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o610])
def test_file_store_refuses_group_or_world_access(tmp_path: Path, mode: int) -> None:
    path = write_private(tmp_path / "s.yaml", f"k: {CANARY}\n", mode)
    with pytest.raises(SecretConfigError, match=f"mode {mode:o}") as err:
        run(FileStore(path).fetch(parse_ref("file:k")))
    assert "chmod 600" in str(err.value)
    assert CANARY not in str(err.value)


def test_file_store_reloads_on_change_and_rechecks_mode(tmp_path: Path) -> None:
    path = write_private(tmp_path / "s.yaml", "k: first\n")
    store = FileStore(path)
    ref = parse_ref("file:k")

    async def body() -> None:
        assert (await store.fetch(ref))[0].reveal() == "first"
        # Same size, new content: the mtime/inode change alone must trigger a reload.
        replacement = write_private(tmp_path / "new.yaml", "k: secnd\n")
        replacement.replace(path)
        assert (await store.fetch(ref))[0].reveal() == "secnd"
        path.chmod(0o644)
        with pytest.raises(SecretConfigError):
            await store.fetch(ref)
        path.chmod(0o600)
        assert (await store.fetch(ref))[0].reveal() == "secnd"

    run(body())


def test_file_store_errors_name_the_problem_not_the_values(tmp_path: Path) -> None:
    store_ref = parse_ref("file:missing")
    path = write_private(tmp_path / "s.yaml", f"present: {CANARY}\n")
    with pytest.raises(SecretNotFound, match="'missing'") as err:
        run(FileStore(path).fetch(store_ref))
    assert CANARY not in str(err.value)

    bad_yaml = write_private(tmp_path / "bad.yaml", f"a: ok\nb: [{CANARY}\n")
    with pytest.raises(SecretConfigError, match="not valid YAML") as err2:
        run(FileStore(bad_yaml).fetch(store_ref))
    assert CANARY not in str(err2.value)

    nested = write_private(tmp_path / "n.yaml", f"good: x\nbad:\n  inner: {CANARY}\n")
    with pytest.raises(SecretConfigError, match="entries bad are not") as err3:
        run(FileStore(nested).fetch(store_ref))
    assert CANARY not in str(err3.value)

    listing = write_private(tmp_path / "l.yaml", f"- {CANARY}\n")
    with pytest.raises(SecretConfigError, match="mapping"):
        run(FileStore(listing).fetch(store_ref))

    with pytest.raises(SecretUnavailable, match="cannot be read"):
        run(FileStore(tmp_path / "absent.yaml").fetch(store_ref))


def test_empty_file_holds_no_secrets(tmp_path: Path) -> None:
    path = write_private(tmp_path / "empty.yaml", "")
    with pytest.raises(SecretNotFound):
        run(FileStore(path).fetch(parse_ref("file:k")))


# -- env store ----------------------------------------------------------------------------


def test_env_store_reads_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEALGATE_TEST_TOKEN", CANARY)
    secret, ttl = run(EnvStore().fetch(parse_ref("env:SEALGATE_TEST_TOKEN")))
    assert secret.reveal() == CANARY
    assert ttl == float("inf")
    with pytest.raises(SecretNotFound, match="SEALGATE_TEST_ABSENT"):
        run(EnvStore().fetch(parse_ref("env:SEALGATE_TEST_ABSENT")))


def test_env_store_prefix_confines_names() -> None:
    environ = {"SG_GITHUB": "gh", "VAULT_TOKEN": CANARY}
    store = EnvStore(prefix="SG_", environ=environ)
    assert run(store.fetch(parse_ref("env:GITHUB")))[0].reveal() == "gh"
    with pytest.raises(SecretNotFound, match="SG_VAULT_TOKEN"):
        run(store.fetch(parse_ref("env:VAULT_TOKEN")))
    with pytest.raises(SecretConfigError):
        EnvStore(prefix="BAD-")


# -- open_store and the broker ------------------------------------------------------------


def test_open_store_by_url(tmp_path: Path) -> None:
    path = write_private(tmp_path / "s.yaml", "k: v\n")
    file_store = open_store(f"file:{path}")
    assert isinstance(file_store, FileStore) and file_store.path == path
    env_store = open_store("env:SG_")
    assert isinstance(env_store, EnvStore) and env_store.prefix == "SG_"
    token_file = tmp_path / "token"
    vault_store = open_store(
        f"vault:https://vault.example:8200?token_file={token_file}&timeout=2",
        namespace="team-a",
        workers=2,
    )
    assert isinstance(vault_store, VaultStore)
    assert vault_store.config == VaultConfig(
        url="https://vault.example:8200",
        token_file=token_file,
        namespace="team-a",
        timeout=2.0,
        workers=2,
    )
    run(vault_store.close())


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        ("s3:bucket", {}, "unknown secret store"),
        ("nocolon", {}, "no scheme"),
        ("file:", {}, "needs a path"),
        ("env:", {"prefix": "X"}, "takes no options"),
        ("vault:ftp://vault:8200?token_file=/t", {}, "http"),
        ("vault:https://vault:8200", {}, "needs token_file"),
        ("vault:https://vault:8200?auth=approle", {}, "needs role_id"),
        ("vault:https://vault:8200?auth=kubernetes", {}, "needs role"),
        ("vault:https://vault:8200?auth=ldap", {}, "not one of"),
        ("vault:https://vault:8200?token_file=/t&token=hvs.x", {}, "unknown vault option"),
        ("vault:https://vault:8200?token_file=/t", {"secret_id": "x"}, "unknown vault option"),
        ("vault:https://vault:8200?token_file=/t&timeout=soon", {}, "timeout has an invalid"),
        ("vault:https://vault:8200?token_file=/t&workers=99", {}, "workers"),
        ("vault:http://vault:8200?token_file=/t&ca_file=/ca.pem", {}, "not https"),
    ],
)
def test_open_store_rejects(url: str, options: dict[str, str], match: str) -> None:
    with pytest.raises(SecretConfigError, match=match):
        open_store(url, **options)


def test_broker_routes_by_scheme(tmp_path: Path) -> None:
    path = write_private(tmp_path / "s.yaml", "stripe_key: sk_file\n")
    broker = SecretBroker([FileStore(path), EnvStore(environ={"GH": "gh_env"})])

    async def body() -> None:
        assert (await broker.get("file:stripe_key")).reveal() == "sk_file"
        assert (await broker.get(parse_ref("env:GH"))).reveal() == "gh_env"
        with pytest.raises(SecretConfigError, match="needs a vault store"):
            await broker.get("vault:kv/data/x#y")
        await broker.close()

    run(body())
    assert broker.check("file:stripe_key") == SecretRef("file", "stripe_key")
    with pytest.raises(SecretConfigError, match="more than one file store"):
        SecretBroker([FileStore(path), FileStore(path)])


def test_broker_sees_file_edits_within_the_file_ttl(tmp_path: Path) -> None:
    path = write_private(tmp_path / "s.yaml", "k: old\n")
    clock = [0.0]
    broker = SecretBroker([FileStore(path)], clock=lambda: clock[0])

    async def body() -> None:
        assert (await broker.get("file:k")).reveal() == "old"
        write_private(tmp_path / "n.yaml", "k: newer\n").replace(path)
        clock[0] += 2
        assert (await broker.get("file:k")).reveal() == "newer"
        await broker.close()

    run(body())


def test_file_store_sees_a_rewrite_its_stat_cannot_tell_apart(tmp_path: Path) -> None:
    """Same inode, same size, the mtime set back: only the file's age says to read it again."""
    path = write_private(tmp_path / "s.yaml", "k: first\n")
    store = FileStore(path)
    ref = parse_ref("file:k")
    before = path.stat()
    assert run(store.fetch(ref))[0].reveal() == "first"
    with path.open("r+") as fh:  # in place: the inode stays
        fh.write("k: secnd\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert run(store.fetch(ref))[0].reveal() == "secnd"
