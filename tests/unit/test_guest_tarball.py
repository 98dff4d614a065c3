"""The sandbox's own tar unpacker (sandbox/guest/tarball.py, what `PUT .../tar` runs inside a
sandbox) on the hostile inputs the image unpacker is tested with (test_image_unpack.py):
every refusal leaves the destination exactly as it was and writes nothing outside it.

The guest code runs here on the host, on a temporary directory's descriptor: the same
functions a sandbox's shim calls. tests/sandboxd/test_files.py runs them inside sandboxes."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from sealgate.sandbox.guest.tarball import Refused, unpack_into
from tests import ocikit
from tests.ocikit import Member, directory, file, hardlink, symlink


def unpack(dest: Path, content: list[Member] | bytes, *, max_bytes: int = 1 << 30,
           max_entries: int = 10_000) -> dict[str, int]:
    raw = content if isinstance(content, bytes) else ocikit.tar_bytes(content)
    fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return unpack_into(fd, io.BufferedReader(io.BytesIO(raw)), max_bytes, max_entries)
    finally:
        os.close(fd)


def tree(path: Path) -> dict[str, str]:
    """Every entry under `path` with what it is: a file's content, a link's target."""
    found = {}
    for p in sorted(path.rglob("*")):
        info = os.lstat(p)
        found[str(p.relative_to(path))] = (
            f"-> {os.readlink(p)}" if stat.S_ISLNK(info.st_mode) else
            p.read_text() if stat.S_ISREG(info.st_mode) else f"dir {oct(info.st_mode)}")
    return found


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    """A destination that already holds something, which no refusal may change."""
    path = tmp_path / "dest"
    path.mkdir()
    (path / "kept").write_text("before")
    (path / "sub").mkdir()
    (path / "sub" / "inner").write_text("before")
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "target").write_text("original")
    return path


def refused(dest: Path, outside: Path, content: list[Member] | bytes, match: str,
            **kw: int) -> None:
    before, there = tree(dest), tree(outside)
    with pytest.raises(Refused, match=match) as caught:
        unpack(dest, content, **kw)
    assert "\n" not in str(caught.value)
    assert tree(dest) == before  # all or nothing: not even the staging directory is left
    assert tree(outside) == there


def test_an_ordinary_archive_merges_in(dest: Path) -> None:
    done = unpack(dest, [directory("sub"), file("sub/new", b"n"), file("kept", b"after"),
                         directory("d", 0o750), file("d/x", b"xx", 0o600),
                         symlink("d/l", "../kept"), hardlink("d/h", "d/x")])
    assert done == {"size": 1 + 5 + 2, "entries": 7}
    assert tree(dest) == {"d": "dir 0o40750", "d/h": "xx", "d/l": "-> ../kept", "d/x": "xx",
                          "kept": "after", "sub": f"dir {oct(os.stat(dest / 'sub').st_mode)}",
                          "sub/inner": "before", "sub/new": "n"}
    assert os.stat(dest / "d/x").st_ino == os.stat(dest / "d/h").st_ino
    assert stat.S_IMODE(os.stat(dest / "d/x").st_mode) == 0o600


@pytest.mark.parametrize("name", ["../x", "a/../../x", "/etc/x", "./../x"])
def test_names_leaving_the_directory_are_refused(dest: Path, outside: Path, name: str) -> None:
    refused(dest, outside, [file("first", b"1"), file(name, b"x")],
            "absolute name|'..' component")


def test_a_write_through_a_symlink_is_refused(dest: Path, outside: Path) -> None:
    refused(dest, outside, [symlink("evil", str(outside)), file("evil/pwned", b"x")],
            r"member 'evil/pwned': its path goes through 'evil'")


@pytest.mark.parametrize("second", [
    directory("evil/sub"), symlink("evil/link", "/"), file("evil/target", b"over"),
    hardlink("evil/target2", "evil/target")])
def test_nothing_reaches_through_a_symlink_dir(dest: Path, outside: Path,
                                               second: Member) -> None:
    refused(dest, outside, [symlink("evil", str(outside)), second], "'evil'")


def test_a_file_over_a_symlink_replaces_the_link(dest: Path, outside: Path) -> None:
    (dest / "planted").symlink_to(outside / "target")
    unpack(dest, [file("planted", b"mine")])
    assert (outside / "target").read_text() == "original"
    assert (dest / "planted").read_bytes() == b"mine" and not (dest / "planted").is_symlink()


def test_a_directory_over_a_planted_link_never_writes_through_it(dest: Path,
                                                                 outside: Path) -> None:
    (dest / "planted").symlink_to(outside)
    unpack(dest, [directory("planted"), file("planted/target", b"mine")])
    assert (outside / "target").read_text() == "original"
    assert (dest / "planted" / "target").read_bytes() == b"mine"


@pytest.mark.parametrize(("target", "reason"), [
    ("/etc/passwd", "absolute name"), ("../../x", "'..' component"),
    ("missing", "not a regular file"), ("dir", "not a regular file"),
    ("link", "not a regular file"), ("link/passwd", "'link'"), ("kept", "not a regular file")])
def test_hard_links_only_to_this_archives_regular_files(dest: Path, outside: Path,
                                                        target: str, reason: str) -> None:
    links = os.stat("/etc/passwd").st_nlink
    refused(dest, outside, [directory("dir"), symlink("link", "/etc"), hardlink("h", target)],
            reason)
    assert os.stat("/etc/passwd").st_nlink == links


@pytest.mark.parametrize(("member", "reason"), [
    (Member("dev/sda", tarfile.BLKTYPE, devmajor=8), "a device node"),
    (Member("dev/null0", tarfile.CHRTYPE), "a device node"),
    (Member("run/fifo", tarfile.FIFOTYPE), "a FIFO"),
    (Member("odd", b"Z"), "unknown member type"),
])
def test_refused_member_kinds(dest: Path, outside: Path, member: Member, reason: str) -> None:
    refused(dest, outside, [file("ok", b"1"), member], reason)


def test_setuid_and_setgid_are_dropped(dest: Path) -> None:
    unpack(dest, [file("su", b"x", 0o4755), file("sg", b"x", 0o2755),
                  directory("shared", 0o2775)])
    assert stat.S_IMODE(os.stat(dest / "su").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(dest / "sg").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(dest / "shared").st_mode) == 0o775


def test_pax_xattrs_never_arrive(dest: Path) -> None:
    unpack(dest, [file("u", b"x", pax={"SCHILY.xattr.user.note": "hi"})])
    assert os.listxattr(dest / "u") == []


def test_a_non_empty_directory_is_not_replaced(dest: Path, outside: Path) -> None:
    refused(dest, outside, [directory("d"), file("d/x"), file("d", b"file")],
            "replace a non-empty directory")
    # Nor one that was there before the archive: found by the dry run, before any move.
    refused(dest, outside, [file("a", b"1"), file("sub", b"file")],
            "replace a non-empty directory")


def test_the_entry_cap(dest: Path, outside: Path) -> None:
    refused(dest, outside, [file(f"f{i}") for i in range(11)], "more than 10 members",
            max_entries=10)


def test_the_byte_cap_counts_the_decompressed_stream(dest: Path, outside: Path) -> None:
    bomb = gzip.compress(ocikit.tar_bytes([file("big", bytes(8 << 20))]))
    assert len(bomb) < 64 << 10
    refused(dest, outside, bomb, "over 1048576 bytes unpacked", max_bytes=1 << 20)


def test_an_oversized_extended_header_is_refused(dest: Path, outside: Path) -> None:
    refused(dest, outside, [file("x", pax={"comment": "a" * (2 << 20)})], "extended header")


def test_a_nul_in_a_name_is_refused(dest: Path, outside: Path) -> None:
    refused(dest, outside, [file("a", pax={"path": "a\x00b"})], "NUL")


def test_a_truncated_stream_is_refused(dest: Path, outside: Path) -> None:
    raw = ocikit.tar_bytes([file("x", bytes(10000))])
    with pytest.raises((Refused, tarfile.TarError, EOFError)):
        unpack(dest, raw[:2048])
    assert not (dest / "x").exists()
