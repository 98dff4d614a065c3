"""The image's `User` as ids (sandbox/images/user.py), read from layers unpacked by the real
unpacker (overlay format: whiteouts and opaque directories as overlayfs has them), including
layers that try to make the lookup read the host's own files."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from sealgate.sandbox.images.unpack import unpack_blob
from sealgate.sandbox.images.user import MAX_FILE, ImageUser, UserError, resolve
from tests import ocikit
from tests.ocikit import Member, directory, file, symlink

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (whiteouts, xattrs)")

_PASSWD = (b"root:x:0:0:root:/root:/bin/sh\n# a comment\n"
           b"tester:x:1234:1235:Test:/home/tester:/bin/sh\nnohome:x:77:78::relative:/bin/sh\n"
           b"tester:x:0:0:a later entry of the same name:/root:/bin/sh\n")
_GROUP = b"root:x:0:\nstaff:x:50:\ntesters:x:1235:\n"


def _layers(tmp_path: Path, *layers: list[Member]) -> list[Path]:
    """The layers unpacked, bottom first as given; returned top first, as the store gives."""
    out = []
    for index, members in enumerate(layers):
        dest = tmp_path / f"layer{index}"
        dest.mkdir(parents=True)
        unpack_blob(io.BytesIO(ocikit.layer(members, "").blob), "", dest, max_bytes=1 << 26,
                    max_entries=1000, what="test")
        out.append(dest)
    return out[::-1]


def test_each_form_of_user(tmp_path: Path) -> None:
    layers = _layers(tmp_path, [directory("etc"), file("etc/passwd", _PASSWD),
                                file("etc/group", _GROUP)])
    assert resolve("", layers) is None
    assert resolve("tester", layers) == ImageUser(1234, 1235, "/home/tester")
    assert resolve("1234", layers) == ImageUser(1234, 1235, "/home/tester")
    assert resolve("tester:staff", layers) == ImageUser(1234, 50, "/home/tester")
    assert resolve("tester:7", layers) == ImageUser(1234, 7, "/home/tester")
    assert resolve("4321", layers) == ImageUser(4321, 0, "")  # not in passwd: group 0, as Docker
    assert resolve("4321:4322", layers) == ImageUser(4321, 4322, "")
    assert resolve("nohome", layers) == ImageUser(77, 78, "")  # a home that is no path


@pytest.mark.parametrize(("user", "said"), [
    ("ghost", "no such user"), ("tester:ghosts", "no such group"), ("tester:", "is not user"),
    (":1", "is not user"), ("99999999999", "is no id"), ("1:4294967295", "is no id"),
    ("\uff11\uff12", "no such user"),  # fullwidth digits are a name, and none is in passwd
])
def test_what_names_no_ids(tmp_path: Path, user: str, said: str) -> None:
    layers = _layers(tmp_path, [directory("etc"), file("etc/passwd", _PASSWD),
                                file("etc/group", _GROUP)])
    with pytest.raises(UserError, match=said):
        resolve(user, layers)


def test_the_top_layer_wins_and_whiteouts_hide(tmp_path: Path) -> None:
    lower = [directory("etc"), file("etc/passwd", _PASSWD)]
    replaced = _layers(tmp_path / "a", lower, [directory("etc"),
                                               file("etc/passwd", b"tester:x:9:9::/t:/bin/sh\n")])
    assert resolve("tester", replaced) == ImageUser(9, 9, "/t")
    removed = _layers(tmp_path / "b", lower, [directory("etc"), file("etc/.wh.passwd")])
    with pytest.raises(UserError, match="no such user"):
        resolve("tester", removed)
    opaque = _layers(tmp_path / "c", lower, [directory("etc"), file("etc/.wh..wh..opq"),
                                             file("etc/hostname", b"x\n")])
    with pytest.raises(UserError, match="no such user"):
        resolve("tester", opaque)
    untouched = _layers(tmp_path / "d", lower, [directory("usr")])
    assert resolve("tester", untouched) == ImageUser(1234, 1235, "/home/tester")


@pytest.mark.parametrize("members", [
    [symlink("etc", "/etc")],  # the host's /etc, through a link the store keeps as a link
    [directory("etc"), symlink("etc/passwd", "/etc/passwd")],
    [symlink("etc", "../../../../../../etc")],
], ids=["etc-absolute", "passwd-link", "etc-relative"])
def test_a_link_never_leads_to_the_hosts_files(tmp_path: Path, members: list[Member]) -> None:
    """The host has a root user in its /etc/passwd: found, the lookup read the host's file."""
    assert b"\nroot:" in b"\n" + Path("/etc/passwd").read_bytes()
    with pytest.raises(UserError, match="no such user"):
        resolve("root", _layers(tmp_path, members))


def test_an_oversized_passwd_is_refused(tmp_path: Path) -> None:
    big = _PASSWD + b"#" * MAX_FILE + b"\n"
    with pytest.raises(UserError, match="over"):
        resolve("tester", _layers(tmp_path, [directory("etc"), file("etc/passwd", big)]))
