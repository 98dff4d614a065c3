"""An image's root for a sandbox (`sandbox.host.rootfs`): real idmapped mounts and overlays in
directories of the test's own (root: mount_setattr and overlayfs need it), and `lay_over`
against an image that puts links where bubblewrap mounts."""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.sandbox.host import rootfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")
UID = 3_912_345
_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture
def point(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs standing in for a sandbox's scratch; everything on it unmounted after."""
    where = tmp_path / "scratch"
    where.mkdir()
    assert _libc.mount(b"test-scratch", os.fsencode(where), b"tmpfs", 0, b"size=16m") == 0
    try:
        yield where
    finally:
        _libc.umount2(os.fsencode(where), 2)  # MNT_DETACH: the overlay and layers with it


def _layer(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_the_layers_are_the_sandboxs_and_stay_roots_on_disk(tmp_path: Path,
                                                          point: Path) -> None:
    lower = _layer(tmp_path / "lower", {"usr/bin/tool": b"v1\n", "etc/conf": b"base\n"})
    top = _layer(tmp_path / "top", {"etc/conf": b"top\n"})
    root = rootfs.mount(point, (UID, UID), [top, lower])
    assert (root / "etc/conf").read_bytes() == b"top\n"  # the upper layer first
    assert (root / "usr/bin/tool").stat().st_uid == UID  # idmapped: its uid's
    assert (lower / "usr/bin/tool").stat().st_uid == 0  # on disk: root's still
    # What is written lands in the upper on the tmpfs, never in a layer.
    (root / "usr/bin/tool").write_bytes(b"changed\n")
    (root / "etc/new").write_bytes(b"new\n")
    assert (lower / "usr/bin/tool").read_bytes() == b"v1\n"
    assert not (lower / "etc/new").exists() and not (top / "etc/new").exists()
    assert (point / "upper/etc/new").read_bytes() == b"new\n"
    mounts = {fields[4]: fields[5] for fields in
              (line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines())}
    for depth in ("0", "1"):
        assert "idmapped" in mounts[str(point / "lower" / depth)].split(",")


def test_root_owned_layers_for_a_tier_whose_host_side_writes(tmp_path: Path,
                                                            point: Path) -> None:
    lower = _layer(tmp_path / "lower", {"etc/conf": b"base\n"})
    root = rootfs.mount(point, (0, 0), [lower])
    assert (root / "etc/conf").stat().st_uid == 0
    assert not (point / "lower").exists()  # nothing idmapped


def test_a_store_path_overlayfs_cannot_take(tmp_path: Path, point: Path) -> None:
    odd = _layer(tmp_path / "a,b", {"x": b""})
    with pytest.raises(rootfs.RootError, match="overlayfs"):
        rootfs.mount(point, (0, 0), [odd])


def test_lay_over_replaces_what_an_image_put_there_without_following(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "etc").mkdir(parents=True)
    (root / "etc/ssl").symlink_to(outside)  # a parent that is a link out
    (root / "etc/resolv.conf").symlink_to(outside / "resolv")  # a file that is a link out
    (root / "tmp").symlink_to("/etc")  # a mount point that is a link
    (root / "etc/hosts").mkdir()  # a directory where a file is to be
    (root / "etc/hosts/kept").write_text("the image's")
    rootfs.lay_over(root, (UID, UID), {"/tmp": 0o1777, "/workspace": 0o755},
                    ["/etc/resolv.conf", "/etc/ssl/certs/ca-certificates.crt", "/etc/hosts"])
    assert list(outside.iterdir()) == []  # nothing made through a link
    for path, mode in (("tmp", 0o1777), ("workspace", 0o755), ("etc/ssl", 0o755)):
        info = os.lstat(root / path)
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == mode, path
        assert info.st_uid == UID
    for path in ("etc/resolv.conf", "etc/ssl/certs/ca-certificates.crt", "etc/hosts"):
        assert stat.S_ISREG(os.lstat(root / path).st_mode), path
    assert (root / "etc/.hosts.image/kept").read_text() == "the image's"  # set aside


def test_lay_over_refuses_a_path_with_dots(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    with pytest.raises(rootfs.RootError, match="not a path"):
        rootfs.lay_over(tmp_path / "root", (UID, UID), {"/app/../../x": 0o755}, [])


def test_the_host_pythons_interpreter_is_under_usr() -> None:
    interpreter, python = rootfs.loader()
    assert interpreter.startswith("/usr/") and python.startswith("/usr/")
    assert os.access(interpreter, os.X_OK) and os.access(python, os.X_OK)
