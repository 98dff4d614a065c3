"""Rules from a Kubernetes ConfigMap volume, reloaded as the kubelet updates it: the real proxy's
watcher against a directory laid out and swapped the way the kubelet's atomic writer does it
(`..<timestamp>/` holding the files, `..data` a symlink to it, each key a symlink through
`..data`; an update writes a new timestamped directory, points a new `..data_tmp` link at it,
renames that over `..data`, and removes the old directory)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sealgate.proxy import SourceRefused, register_source, unregister_source
from tests.harness import Proxy, key_digest


def rules(*sandboxes: str) -> str:
    listed = "\n".join(f'  {s}: {{policy: ci, key_sha256: "{key_digest(s + "-key")}"}}'
                       for s in sandboxes)
    return f"version: 1\npolicies:\n  ci:\n    allow: []\nsandboxes:\n{listed}\n"


class ConfigMapVolume:
    def __init__(self, where: Path, files: dict[str, str]) -> None:
        self.where = where
        where.mkdir()
        self.generation = 0
        self._write(files)
        for name in files:
            (where / name).symlink_to(f"..data/{name}")

    def update(self, files: dict[str, str]) -> None:
        self._write(files)

    def _write(self, files: dict[str, str]) -> None:
        self.generation += 1
        stamp = f"..2026_12_02_12_00_00.{self.generation:09d}"
        (self.where / stamp).mkdir()
        for name, text in files.items():
            (self.where / stamp / name).write_text(text)
        old = os.readlink(self.where / "..data") if (self.where / "..data").is_symlink() else None
        (self.where / "..data_tmp").symlink_to(stamp)
        os.rename(self.where / "..data_tmp", self.where / "..data")  # the atomic swap
        if old is not None:
            for child in (self.where / old).iterdir():
                child.unlink()
            (self.where / old).rmdir()


def registrable(p: Proxy, sandbox: str) -> bool:
    control = p.state / "control.sock"
    try:
        register_source(control, "10.200.5.5", sandbox)
    except SourceRefused:
        return False
    unregister_source(control, "10.200.5.5")
    return True


def until(what: str, check: object, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("mode", ["directory", "file"])
def test_a_configmap_update_reloads_the_rules_and_a_broken_one_keeps_them(
        tmp_path: Path, mode: str) -> None:
    volume = ConfigMapVolume(tmp_path / "rules", {"rules.yaml": rules("sb-one")})
    p = Proxy(tmp_path, volume.where if mode == "directory" else volume.where / "rules.yaml")
    try:
        assert registrable(p, "sb-one") and not registrable(p, "sb-two")
        volume.update({"rules.yaml": rules("sb-one", "sb-two")})
        until("the swap reloaded the rules", lambda: registrable(p, "sb-two"))
        p.wait_audit(lambda e: e["event"] == "rules_reloaded")
        volume.update({"rules.yaml": "version: 1\npolicies: [broken\n"})
        p.wait_audit(lambda e: e["event"] == "rules_reload_failed")
        assert registrable(p, "sb-two")  # the rules in force stay
        volume.update({"rules.yaml": rules("sb-three")})
        until("the fixed update reloaded", lambda: registrable(p, "sb-three"))
        assert not registrable(p, "sb-two")
        assert "Traceback" not in p.stderr()
    finally:
        p.stop()
