"""`sealgate sandbox run --image`: a one-shot sandbox whose root is an image of the store, on
each isolation tier this machine runs. The image's root, its Env, WorkingDir, Entrypoint and
Cmd; the run's writes gone with it and the store's layer untouched; the proxy's trust store and
name server laid over what the image has; a snapshot of another sandbox refused; nothing left.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.sandbox.images import Store
from tests.harness import Proxy
from tests.images import busybox_layout
from tests.integration import test_sandbox as base
from tests.integration.tiers import TIERS

pytestmark = pytest.mark.root

gateway, sproxy = base.gateway, base.sproxy  # this module's own sandbox gateway and proxy


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("run-images") / "store"
    done = base.sealgate("image", "--store", str(where), "import", str(busybox_layout()),
                    "--name", "busybox", timeout=120)
    assert done.returncode == 0, done.stderr
    yield where


def image_run(p: Proxy, store: Path, *command: str, tier: str = "bwrap", image: str = "busybox",
              stdin: str | None = None) -> tuple[int, str, str]:
    args = ["--images", str(store), "--image", image]
    done = base.run(p, *command, tier=tier, limits=tuple(args), stdin=stdin)
    return done.returncode, done.stdout, done.stderr


def layer_digest(store: Path) -> str:
    """Every file under the store's layers, by path and content: what a run must not change."""
    h = hashlib.sha256()
    for path in sorted((store / "layers").rglob("*")):
        h.update(str(path.relative_to(store)).encode())
        if path.is_file() and not path.is_symlink():
            h.update(path.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("tier", TIERS)
def test_the_run_s_root_is_the_image_and_its_writes_go_with_it(
    sproxy: Proxy, store: Path, tier: str
) -> None:
    before = layer_digest(store)
    probe = ("echo planted > /etc/planted && cat /etc/planted && pwd && echo $PATH && "
             "ls /bin/busybox && test ! -e /usr/bin/python3 && echo no-host-python && "
             "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt && "
             "grep nameserver /etc/resolv.conf")
    code, out, err = image_run(sproxy, store, "sh", "-c", probe, tier=tier)
    assert code == 0, err
    lines = out.splitlines()
    # The image's WorkingDir (/) and its PATH; busybox's root, not the host's /usr.
    assert lines[:5] == ["planted", "/", "/bin:/usr/bin", "/bin/busybox", "no-host-python"]
    assert int(lines[5]) >= 1  # the proxy's CA laid over the image's (which has none)
    assert lines[6].startswith("nameserver ")
    code, out, err = image_run(sproxy, store, "sh", "-c", "cat /etc/planted || echo gone",
                               tier=tier)
    assert (code, out) == (0, "gone\n"), err
    assert layer_digest(store) == before
    assert base.leftovers() == []
    assert not [m for m in Path("/proc/self/mounts").read_text().splitlines()
                if "sealgate-slots" in m or "sealgate-root" in m]


def test_without_a_command_the_image_s_cmd_runs(sproxy: Proxy, store: Path) -> None:
    code, out, err = image_run(sproxy, store, stdin="echo from the image shell; exit 3\n")
    assert (code, out) == (3, "from the image shell\n"), err


def test_a_snapshot_of_another_sandbox_is_refused(sproxy: Proxy, store: Path,
                                                 tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    (upper / "etc").mkdir(parents=True)
    (upper / "etc" / "theirs").write_text("another sandbox's file\n")
    images = Store(store)
    images.derive(images.get("busybox"), images.add_layer(upper), "theirs", owner="other-1")
    code, out, err = image_run(sproxy, store, "cat", "/etc/theirs", image="theirs")
    assert code == 2 and "belongs to another sandbox" in err, (out, err)
    assert "another sandbox's file" not in out
    assert base.leftovers() == []


def test_an_unknown_image_is_refused_before_anything_runs(sproxy: Proxy, store: Path) -> None:
    code, _, err = image_run(sproxy, store, "true", image="nope")
    assert code == 2 and "nope" in err, err
    assert base.leftovers() == []
    assert os.path.isdir(store / "layers")
