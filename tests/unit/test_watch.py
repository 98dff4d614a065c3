"""The one file-change watcher (sealgate/watch.py) and the readers that use it."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from sealgate.proxy.credentials.secrets import VaultConfig, VaultStore, parse_ref
from sealgate.proxy.policy.rulesfile import load_rules
from sealgate.proxy.request.registry import SourceRegistry
from sealgate.watch import FileIdentity, Snapshot
from tests.vaultfake import VaultFake

READ = "kv/data/ci/github"
OLD_NS = time.time_ns() - 3600 * 10**9  # long settled


def age(*paths: Path) -> None:
    """As if last written an hour ago: an identity that can vouch for the content."""
    for path in paths:
        os.utime(path, ns=(OLD_NS, OLD_NS))


def rewrite_in_the_same_tick(path: Path, text: str) -> None:
    """New content of the same size in the same inode with the same mtime: what a second write
    within the timestamp granularity looks like to a stat."""
    before = path.stat()
    assert len(text.encode()) == before.st_size
    with path.open("r+") as fh:
        fh.write(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert FileIdentity.of(path.stat()) == FileIdentity.of(before)


def test_a_settled_file_is_unchanged_until_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("one")
    age(path)
    assert Snapshot.unread((path,)).changed()
    seen = Snapshot.take((path,))
    assert not seen.changed()
    path.write_text("three")
    assert seen.changed()


def test_a_file_rewritten_within_the_mtime_tick_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("first")
    seen = Snapshot.take((path,))  # read just after it was written: it cannot vouch for it
    rewrite_in_the_same_tick(path, "secnd")
    assert seen.changed()
    # Read again while the mtime is still recent: still no vouching.
    assert seen.retake().changed()
    age(path)
    assert not seen.retake().changed()


def test_settling_alone_does_not_vouch_for_a_recent_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read within the tick, rewritten within it, then left alone: a check made once the mtime
    # is old must still read again. (Trusting an identity for its age at check time rather than
    # at read time would keep the first content for good.)
    path = tmp_path / "f"
    path.write_text("first")
    seen = Snapshot.take((path,))
    rewrite_in_the_same_tick(path, "secnd")
    later = time.time_ns() + 60 * 10**9
    monkeypatch.setattr(time, "time_ns", lambda: later)
    assert seen.changed()
    assert not seen.retake().changed()


def test_taken_with_what_was_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("one")
    age(path)
    read = FileIdentity.of(path.stat())
    path.write_text("two!")  # replaced after our read, before the snapshot
    age(path)
    seen = Snapshot.take((path,), (read,))
    assert seen.identities == (read,) and seen.trusted
    assert seen.changed()


def test_a_rules_directory_and_its_files(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yaml").write_text("version: 1\n")
    age(rules, rules / "a.yaml")
    seen = Snapshot.take((rules, *load_rules(rules).sources))
    assert seen.paths == (rules, rules / "a.yaml")
    assert not seen.changed()
    # Adding a file changes the directory's mtime.
    (rules / "b.yaml").write_text("version: 1\n")
    assert seen.changed()
    (rules / "b.yaml").unlink()
    age(rules)
    seen = seen.retake()
    assert not seen.changed()
    # An edit in place does not touch the directory: the file's own identity says it.
    (rules / "a.yaml").write_text("version: 1 \n")
    assert seen.changed()


def test_a_rules_file_is_watched_once(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("version: 1\n")
    assert Snapshot.take((path, *load_rules(path).sources)).paths == (path,)


def test_a_missing_path_appearing_is_a_change(tmp_path: Path) -> None:
    path = tmp_path / "later"
    seen = Snapshot.take((path,))
    assert seen.identities == (None,)
    assert not seen.changed()
    path.write_text("x")
    assert seen.changed()


def test_source_registry_sees_a_rewrite_its_stat_cannot_tell_apart(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    path.write_text(json.dumps({"version": 1, "sources": {"10.0.0.2": "bot-a"}}))
    registry = SourceRegistry(path)
    assert registry.lookup("10.0.0.2") == "bot-a"
    rewrite_in_the_same_tick(path, json.dumps({"version": 1, "sources": {"10.0.0.2": "bot-b"}}))
    assert registry.lookup("10.0.0.2") == "bot-b"


def test_vault_token_file_rewritten_in_the_same_tick_is_used(tmp_path: Path) -> None:
    ref = parse_ref(f"vault:{READ}#token")
    with VaultFake() as fake:
        fake.add_kv_mount("kv", version=2)
        fake.put("kv/ci/github", {"token": "value"})
        first = fake.add_token(paths=["kv/data/ci/*"])
        path = tmp_path / "token"
        path.write_text(first + "\n")
        path.chmod(0o600)

        async def body() -> None:
            store = VaultStore(VaultConfig.from_url(f"vault:{fake.url}", token_file=str(path)))
            await store.fetch(ref)
            # Fresh, so the stat cannot vouch for it, but it holds the same token: no new login.
            await store.fetch(ref)
            assert fake.count("auth/token/lookup-self") == 1
            # The old token still works: only the file says to switch.
            second = fake.add_token(paths=["kv/data/ci/*"])
            rewrite_in_the_same_tick(path, second + "\n")
            assert (await store.fetch(ref))[0].reveal() == "value"
            assert [r.token for r in fake.requests if r.path == READ] == [first, first, second]
            await store.close()

        asyncio.run(asyncio.wait_for(body(), timeout=20))
