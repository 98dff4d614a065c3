"""The unpacker (sandbox/images/unpack.py) on ordinary and hostile layers: overlayfs format,
and every refusal, with nothing written outside the destination.

Needs root (whiteouts are device nodes, opaque directories a trusted.* xattr): skipped
otherwise."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from sealgate.sandbox.images import ImageError
from sealgate.sandbox.images.unpack import OPAQUE_XATTR, Unpacked, unpack_blob
from tests import ocikit
from tests.ocikit import Member, directory, file, hardlink, symlink

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, trusted xattrs)")


def unpack(tmp_path: Path, content: list[Member] | bytes, *, compression: str = "",
           max_bytes: int = 1 << 30, max_entries: int = 10_000) -> tuple[Path, Unpacked]:
    dest = tmp_path / "dest"
    dest.mkdir()
    layer = ocikit.layer(content, compression)
    done = unpack_blob(io.BytesIO(layer.blob), compression, dest, max_bytes=max_bytes,
                       max_entries=max_entries, what="layer test")
    assert done.diff_id == layer.diff_id
    return dest, done


def refused(tmp_path: Path, content: list[Member] | bytes, match: str, **kw: object) -> None:
    with pytest.raises(ImageError, match=match) as caught:
        unpack(tmp_path, content, **kw)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("layer test: ")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A real directory outside the destination that a hostile layer aims at."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "target").write_text("original")
    return path


def tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): (p.read_text() if p.is_file() else "")
            for p in sorted(path.rglob("*"))}


def test_an_ordinary_layer_in_overlay_format(tmp_path: Path) -> None:
    dest, done = unpack(tmp_path, [
        directory("./etc", 0o755), file("./etc/motd", b"hello", 0o644),
        file("usr/bin/tool", b"#!/bin/sh\n", 0o755),  # parents made implicitly
        symlink("bin", "usr/bin"), symlink("etc/abs", "/etc/passwd"),
        symlink("etc/rel", "../../../etc/shadow"),
        hardlink("usr/bin/tool2", "usr/bin/tool"),
        file("var/.wh.cache"), directory("opt/data", 0o750), file("opt/data/.wh..wh..opq"),
        file("opt/data/keep", b"k"), file("x/.wh..wh.plnk"),
        directory("tmp", 0o1777),
    ], compression="gzip")
    assert (dest / "etc/motd").read_bytes() == b"hello"
    assert os.readlink(dest / "bin") == "usr/bin"
    assert os.readlink(dest / "etc/abs") == "/etc/passwd"
    assert os.readlink(dest / "etc/rel") == "../../../etc/shadow"
    tool, tool2 = os.stat(dest / "usr/bin/tool"), os.stat(dest / "usr/bin/tool2")
    assert tool.st_ino == tool2.st_ino and stat.S_IMODE(tool.st_mode) == 0o755
    wh = os.lstat(dest / "var/cache")
    assert stat.S_ISCHR(wh.st_mode) and wh.st_rdev == os.makedev(0, 0)
    assert not (dest / "var/.wh.cache").exists()
    assert os.getxattr(dest / "opt/data", OPAQUE_XATTR) == b"y"
    assert not (dest / "opt/data/.wh..wh..opq").exists()
    assert (dest / "opt/data/keep").read_bytes() == b"k"
    assert not os.path.lexists(dest / "x/.wh..wh.plnk")  # aufs' bookkeeping skipped
    assert stat.S_IMODE(os.stat(dest / "opt/data").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(dest / "tmp").st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(dest / "usr").st_mode) == 0o755  # made implicitly
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o755
    for path in [dest, *dest.rglob("*")]:
        st = os.lstat(path)
        assert (st.st_uid, st.st_gid) == (0, 0), path  # the tar said 1000:1000
    assert os.stat(dest / "etc/motd").st_mtime == ocikit.MTIME
    assert os.stat(dest / "opt/data").st_mtime == ocikit.MTIME
    assert done.size == 5 + 10 + 1 and done.entries == 13


@pytest.mark.parametrize("name", ["../x", "a/../../x", "/etc/x", "./../x"])
def test_names_leaving_the_layer_are_refused(tmp_path: Path, name: str) -> None:
    refused(tmp_path, [file(name, b"x")], "absolute name|'..' component")
    assert not (tmp_path / "x").exists()


def test_a_name_too_deep_to_walk_is_refused(tmp_path: Path) -> None:
    """Each component is a walk from the layer's root, and the clean-up of a refused layer
    must reach its bottom: the workspace's rule (MAX_LEVELS), one for both unpackers."""
    refused(tmp_path, [file("a/" * 300 + "f", b"x")], "301 levels deep")


def test_a_write_through_a_symlink_is_refused(tmp_path: Path, outside: Path) -> None:
    refused(tmp_path, [symlink("evil", str(outside)), file("evil/pwned", b"x")],
            r"member 'evil/pwned': its path goes through the symlink 'evil'")
    assert tree(outside) == {"target": "original"}


@pytest.mark.parametrize("second", [
    directory("evil/sub"), symlink("evil/link", "/"), file("evil/.wh.target"),
    file("evil/.wh..wh..opq"), hardlink("evil/target2", "evil/target")])
def test_nothing_reaches_through_a_symlink_dir(tmp_path: Path, outside: Path,
                                               second: Member) -> None:
    refused(tmp_path, [symlink("evil", "../outside"), second], "symlink 'evil'")
    assert tree(outside) == {"target": "original"}
    assert os.listxattr(outside) == []


def test_a_file_replacing_a_symlink_does_not_write_through_it(tmp_path: Path,
                                                              outside: Path) -> None:
    dest, _ = unpack(tmp_path, [symlink("passwd", str(outside / "target")),
                                file("passwd", b"mine")])
    assert (outside / "target").read_text() == "original"
    assert stat.S_ISREG(os.lstat(dest / "passwd").st_mode)
    assert (dest / "passwd").read_bytes() == b"mine"


@pytest.mark.parametrize(("target", "reason"), [
    ("/etc/passwd", "absolute name"), ("../../x", "'..' component"),
    ("missing", "does not exist|not a regular file"), ("dir", "not a regular file"),
    ("link", "not a regular file"), ("link/passwd", "symlink 'link'")])
def test_hard_links_only_to_this_layers_regular_files(tmp_path: Path, outside: Path,
                                                      target: str, reason: str) -> None:
    links = os.stat("/etc/passwd").st_nlink
    refused(tmp_path, [directory("dir"), symlink("link", "/etc"), hardlink("h", target)],
            reason)
    assert os.stat("/etc/passwd").st_nlink == links


@pytest.mark.parametrize(("member", "reason"), [
    (Member("dev/sda", tarfile.BLKTYPE, devmajor=8), "a device node"),
    (Member("dev/mem", tarfile.CHRTYPE, devmajor=1, devminor=1), "a device node"),
    (Member("dev/null0", tarfile.CHRTYPE), "a device node"),  # even 0/0: whiteouts are ours
    (Member("run/fifo", tarfile.FIFOTYPE), "a FIFO"),
    (Member("odd", b"Z"), "unknown member type"),
    (file(".wh.."), "a whiteout of '.'"), (file("a/.wh..."), "a whiteout of '..'"),
])
def test_refused_member_kinds(tmp_path: Path, member: Member, reason: str) -> None:
    refused(tmp_path, [file("ok", b"1"), member], reason)


def test_setuid_and_setgid_are_dropped_sticky_kept(tmp_path: Path) -> None:
    dest, _ = unpack(tmp_path, [file("su", b"x", 0o4755), file("sg", b"x", 0o2755),
                                directory("shared", 0o2775), directory("t", 0o1777)])
    assert stat.S_IMODE(os.stat(dest / "su").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(dest / "sg").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(dest / "shared").st_mode) == 0o775
    assert stat.S_IMODE(os.stat(dest / "t").st_mode) == 0o1777


def test_pax_xattrs_never_arrive(tmp_path: Path) -> None:
    capability = "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    dest, _ = unpack(tmp_path, [
        file("ping", b"x", 0o755, pax={"SCHILY.xattr.security.capability": capability}),
        directory("d", pax={"SCHILY.xattr.trusted.overlay.opaque": "y"}),
        file("u", b"x", pax={"SCHILY.xattr.user.note": "hi"})])
    assert os.listxattr(dest / "ping") == []
    assert os.listxattr(dest / "d") == []
    assert os.listxattr(dest / "u") == []


def test_duplicates_the_later_member_wins(tmp_path: Path) -> None:
    dest, _ = unpack(tmp_path, [
        file("f", b"first"), file("f", b"second"),
        directory("d", 0o700), directory("d", 0o755), file("d/in", b"kept"),
        directory("empty"), file("empty", b"now a file"),
        file("g", b"file"), directory("g", 0o711),
        symlink("s", "/"), directory("s"), file("s/x", b"inside"),
        file("w", b"gone"), file(".wh.w")])
    assert (dest / "f").read_bytes() == b"second"
    assert stat.S_IMODE(os.stat(dest / "d").st_mode) == 0o755
    assert (dest / "d/in").read_bytes() == b"kept"
    assert (dest / "empty").read_bytes() == b"now a file"
    assert stat.S_ISDIR(os.lstat(dest / "g").st_mode)
    assert stat.S_ISDIR(os.lstat(dest / "s").st_mode)
    assert (dest / "s/x").read_bytes() == b"inside"
    assert stat.S_ISCHR(os.lstat(dest / "w").st_mode)


def test_a_non_empty_directory_is_not_replaced(tmp_path: Path) -> None:
    refused(tmp_path, [directory("d"), file("d/x"), file("d", b"file")],
            "replace a non-empty directory")


def test_the_entry_cap(tmp_path: Path) -> None:
    refused(tmp_path, [file(f"f{i}") for i in range(11)], "more than 10 members",
            max_entries=10)


def test_the_byte_cap_counts_the_decompressed_stream(tmp_path: Path) -> None:
    refused(tmp_path, [file("big", bytes(2 << 20))], "over 1048576 bytes uncompressed",
            compression="gzip", max_bytes=1 << 20)


def test_an_oversized_extended_header_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, [file("x", pax={"comment": "a" * (2 << 20)})],
            "extended header")


def test_a_nul_in_a_name_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, [file("a", pax={"path": "a\x00b"})], "NUL")


def test_a_truncated_stream_is_refused(tmp_path: Path) -> None:
    raw = ocikit.tar_bytes([file("x", bytes(10000))])
    refused(tmp_path, raw[:2048], "not a valid tar stream")
    dest = tmp_path / "gz"
    dest.mkdir()
    with pytest.raises(ImageError, match="cannot be decompressed"):
        unpack_blob(io.BytesIO(b"not gzip at all"), "gzip", dest, max_bytes=1 << 20,
                    max_entries=10, what="layer test")
