"""The image store (sandbox/images/store.py) and its CLI: imports from layouts and archives,
layer sharing, platform resolution, ls/rm/gc, verification of every blob and diff_id, nothing
left behind by a refused import, snapshots (add_layer, derive) and pull through skopeo (a fake
one: no network).

Needs root (layers hold whiteout devices and trusted.* xattrs): skipped otherwise."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sealgate.cli import main
from sealgate.sandbox.images import Image, ImageError, Store, disk
from sealgate.sandbox.images import store as store_module
from sealgate.sandbox.images.unpack import OPAQUE_XATTR
from tests import ocikit
from tests.ocikit import directory, file, symlink

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, trusted xattrs)")

BASE = [directory("etc"), file("etc/os-release", b"ID=test\n"), directory("bin"),
        file("bin/sh", b"\x7fELF", 0o755), symlink("bin/ash", "sh"), file("var/log/old", b"o")]
TOP = [file("etc/motd", b"hi"), file("var/log/.wh.old"), directory("tmp", 0o1777),
       file("tmp/.wh..wh..opq")]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "store", max_layer_bytes=64 << 20, max_layer_entries=1000)


def contents(store: Store) -> set[str]:
    """What the store holds beyond its empty skeleton."""
    skeleton = {"blobs", "blobs/sha256", "layers", "layers/sha256", "tmp", "index.lock",
                "store.lock", "index.json"}
    found = {str(p.relative_to(store.root)) for p in store.root.rglob("*")}
    return found - skeleton


def test_a_multi_layer_image(tmp_path: Path, store: Store) -> None:
    base, top = ocikit.layer(BASE), ocikit.layer(TOP, compression="")
    built = ocikit.write(tmp_path / "img", [base, top], env=["A=1"], cmd=["/bin/sh", "-c"])
    said: list[str] = []
    image = store.import_path(tmp_path / "img", "test:1", said.append)
    assert image.name == "test:1" and image.digest == built.digest
    assert image.layers == (base.diff_id, top.diff_id)
    assert (image.env, image.cmd, image.workdir, image.user) == (("A=1",), ("/bin/sh", "-c"),
                                                                 "/work", "1000")
    assert image.size == 8 + 4 + 1 + 2 and image.owner is None and image.parent is None
    assert abs(image.created - time.time()) < 60
    dirs = store.layer_dirs(image)
    assert dirs == [store.root / "layers/sha256" / d.removeprefix("sha256:")
                    for d in (top.diff_id, base.diff_id)]  # top first
    upper, lower = dirs
    assert (lower / "bin/sh").read_bytes() == b"\x7fELF"
    assert os.readlink(lower / "bin/ash") == "sh"
    assert stat.S_ISCHR(os.lstat(upper / "var/log/old").st_mode)
    assert os.getxattr(upper / "tmp", OPAQUE_XATTR) == b"y"
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    assert {(store.root / "blobs/sha256" / d.removeprefix("sha256:")).exists()
            for d in (built.digest, built.config)} == {True}
    assert any("layer 1/2" in line and "unpacked" in line for line in said)
    assert store.get("test:1") == image == store.get(built.digest)
    assert store.get(built.digest[7:19]) == image
    assert not list((store.root / "tmp").iterdir())


def test_layers_are_shared_and_gc_keeps_what_is_referenced(tmp_path: Path,
                                                           store: Store) -> None:
    base = ocikit.layer(BASE)
    one = store.import_path(ocikit.write(tmp_path / "one", [base]).root, "one")
    said: list[str] = []
    two_layer = ocikit.layer([file("two", b"2")])
    two = store.import_path(ocikit.write(tmp_path / "two", [base, two_layer]).root, "two",
                            said.append)
    assert any("layer 1/2" in line and "already present" in line for line in said)
    assert store.layer_dirs(one)[0] == store.layer_dirs(two)[1]
    assert len(os.listdir(store.root / "layers/sha256")) == 2
    assert [i.name for i in store.list()] == ["one", "two"]
    assert store.gc() == []
    store.remove("two")
    with pytest.raises(ImageError, match=r"^no image two$"):
        store.get("two")
    gone = store.gc()
    assert f"layers/sha256/{two_layer.diff_id[7:]}" in gone
    assert f"layers/sha256/{base.diff_id[7:]}" not in gone
    assert len([g for g in gone if g.startswith("blobs/")]) == 2  # manifest, config
    assert store.layer_dirs(one)[0].is_dir()
    store.remove("one")
    store.gc()
    assert contents(store) == set()
    assert json.loads((store.root / "index.json").read_text())["layers"] == {}


def test_an_images_disk_is_its_merged_layers(tmp_path: Path, store: Store) -> None:
    """The microVM's erofs disk of an image (`disk.build`): the layers merged (a whiteout and
    an opaque directory resolved), every file root's, no extended attribute; built once, and
    gone at the first gc after its image."""
    with_tmp = [*BASE, directory("tmp"), file("tmp/old-tmp", b"t")]
    image = store.import_path(ocikit.write(tmp_path / "img", [ocikit.layer(with_tmp),
                                                              ocikit.layer(TOP)]).root, "img")
    key = ",".join(image.layers)
    built = disk.build(store.root / "disks", key, store.layer_dirs(image))
    assert built == store.root / "disks" / disk.name(key)
    assert stat.S_IMODE(built.stat().st_mode) == 0o644
    assert disk.build(store.root / "disks", key, []).stat().st_mtime == built.stat().st_mtime
    seen = tmp_path / "seen"
    seen.mkdir()
    mounted = subprocess.run(["mount", "-t", "erofs", "-o", "ro,loop", str(built), str(seen)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount an erofs image here: {mounted.stderr.strip()}")
    try:
        assert (seen / "etc/motd").read_bytes() == b"hi"
        assert (seen / "etc/os-release").read_bytes() == b"ID=test\n"
        assert os.readlink(seen / "bin/ash") == "sh"
        assert not (seen / "var/log/old").exists()  # its whiteout resolved
        assert os.listdir(seen / "tmp") == []  # opaque: the lower's file hidden
        assert stat.S_IMODE(os.stat(seen / "tmp").st_mode) == 0o1777
        for path in seen.rglob("*"):
            assert path.lstat().st_uid == 0 and path.lstat().st_gid == 0, path
            assert os.listxattr(path, follow_symlinks=False) == [], path
    finally:
        subprocess.run(["umount", str(seen)], check=True)
    assert store.gc() == []
    store.remove("img")
    assert f"disks/{built.name}" in store.gc()
    assert not built.exists()


def test_concurrent_imports_share_a_layer_and_all_land(tmp_path: Path, store: Store) -> None:
    base = ocikit.layer(BASE)
    layouts = [ocikit.write(tmp_path / f"i{n}", [base, ocikit.layer([file("n", b"%d" % n)])])
               for n in range(4)]
    with ThreadPoolExecutor(4) as pool:  # each its own lock descriptors, as processes have
        images = list(pool.map(lambda n: Store(store.root).import_path(layouts[n].root,
                                                                       f"i{n}"), range(4)))
    assert sorted(i.name for i in store.list()) == ["i0", "i1", "i2", "i3"]
    assert len(os.listdir(store.root / "layers/sha256")) == 5
    assert all(store.layer_dirs(i)[1] == store.layer_dirs(images[0])[1] for i in images)
    assert not list((store.root / "tmp").iterdir())


def test_reimporting_a_name_replaces_it(tmp_path: Path, store: Store) -> None:
    store.import_path(ocikit.write(tmp_path / "a", [ocikit.layer(BASE)]).root, "x")
    second = store.import_path(ocikit.write(tmp_path / "b", [ocikit.layer(TOP)]).root, "x")
    assert store.list() == [second]


def test_an_oci_archive(tmp_path: Path, store: Store) -> None:
    built = ocikit.write(tmp_path / "img", [ocikit.layer(BASE)])
    tar = ocikit.archive(built.root, tmp_path / "img.tar")
    image = store.import_path(tar)
    assert image.name == built.digest  # no name given: the digest
    assert (store.layer_dirs(image)[0] / "etc/os-release").read_bytes() == b"ID=test\n"
    assert not list((store.root / "tmp").iterdir())


@pytest.mark.parametrize(("extra", "reason"), [
    ([file("../evil", b"x")], "'..' component"),
    ([file("etc/passwd", b"x")], "not part of an OCI image layout"),
    ([symlink("blobs/sha256/" + "a" * 64, "/etc/shadow")], "not a regular file"),
    ([file("index.json", b"{}")], "appears twice"),
])
def test_an_archive_holds_only_a_layout(tmp_path: Path, store: Store,
                                        extra: list[ocikit.Member], reason: str) -> None:
    built = ocikit.write(tmp_path / "img", [ocikit.layer(BASE)])
    tar = ocikit.archive(built.root, tmp_path / "img.tar", extra)
    with pytest.raises(ImageError, match=reason):
        store.import_path(tar)
    assert contents(store) == set()
    assert not (tmp_path / "evil").exists()


@pytest.mark.parametrize("nested", [True, False])
def test_an_index_resolves_to_this_hosts_platform(tmp_path: Path, store: Store,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  nested: bool) -> None:
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    built = ocikit.write_platforms(tmp_path / "img", {
        "linux/arm64/v8": [ocikit.layer([file("arch", b"arm64")])],
        "linux/amd64": [ocikit.layer([file("arch", b"amd64")])]}, nested=nested)
    image = store.import_path(tmp_path / "img", "multi")
    assert image.digest == built["linux/amd64"].digest
    assert image.env == ("PLATFORM=linux/amd64",)
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert store.import_path(tmp_path / "img", "multi").env == ("PLATFORM=linux/arm64/v8",)


def test_no_manifest_for_this_platform(tmp_path: Path, store: Store,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    ocikit.write_platforms(tmp_path / "img", {
        "linux/arm64/v8": [ocikit.layer(BASE)], "linux/s390x": [ocikit.layer(BASE)],
        "windows/amd64": [ocikit.layer(BASE)]})
    with pytest.raises(ImageError, match=r"no manifest for this host's platform \(linux/amd64\)"
                                         r"; it offers linux/arm64/v8, linux/s390x, "
                                         r"windows/amd64$"):
        store.import_path(tmp_path / "img")
    assert contents(store) == set()


@pytest.mark.parametrize(("kw", "reason"), [
    ({"corrupt": {1: "flip"}}, "content does not match its digest"),
    ({"corrupt": {1: "append"}}, "longer than its descriptor's size"),
    ({"digests": {1: ocikit.sha(b"other")}}, "names blob sha256:.*which the layout does not"),
    ({"sizes": {1: 10}}, "longer than its descriptor's size"),
    ({"sizes": {1: 1 << 20}}, r"bytes, its descriptor says 1048576"),
    ({"diff_ids": "wrong"}, "the config's diff_id says"),
    ({"skip": {1}}, "names blob sha256:.*which the layout does not hold"),
    ({"skip": {-1}}, "names blob sha256:.*which the layout does not hold"),
])
def test_every_blob_is_verified_and_nothing_is_left(tmp_path: Path, store: Store,
                                                    kw: dict[str, object], reason: str) -> None:
    base, top = ocikit.layer(BASE), ocikit.layer(TOP)
    if kw.get("diff_ids") == "wrong":
        kw["diff_ids"] = [base.diff_id, ocikit.sha(b"not it")]
    ocikit.write(tmp_path / "img", [base, top], **kw)
    with pytest.raises(ImageError, match=reason) as caught:
        store.import_path(tmp_path / "img", "bad")
    assert "\n" not in str(caught.value)
    assert contents(store) == set()  # not even the first layer, which was fine
    assert store.list() == []


def test_a_zstd_layer(tmp_path: Path, store: Store) -> None:
    ocikit.write(tmp_path / "img", [ocikit.layer(BASE, compression="zstd")])
    image = store.import_path(tmp_path / "img", "zst")
    assert len(image.layers) == 1 and store.layer_dirs(image)[0].is_dir()


def test_a_zstd_bomb_is_stopped_early(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", max_layer_bytes=10 << 20)
    raw = ocikit.tar_bytes([ocikit.file("zeros", bytes(64 << 20))])
    ocikit.write(tmp_path / "img", [ocikit.layer(raw, compression="zstd")])
    assert len(ocikit.layer(raw, "zstd").blob) < 1 << 20
    with pytest.raises(ImageError, match=r"uncompressed \(max_layer_bytes\); refused"):
        store.import_path(tmp_path / "img")
    assert contents(store) == set()


def test_a_gzip_bomb_is_stopped_early(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", max_layer_bytes=10 << 20)
    bomb = ocikit.gzip_bomb(200 << 20)
    assert len(bomb.blob) < 400_000
    ocikit.write(tmp_path / "img", [bomb], diff_ids=[ocikit.sha(b"unknown")])
    started = time.monotonic()
    with pytest.raises(ImageError, match="over 10485760 bytes uncompressed"):
        store.import_path(tmp_path / "img")
    assert time.monotonic() - started < 2.0
    assert contents(store) == set()


def test_a_layer_with_a_hostile_member_leaves_nothing(tmp_path: Path, store: Store) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    hostile = ocikit.layer([symlink("x", str(outside)), file("x/pwned", b"1")])
    ocikit.write(tmp_path / "img", [ocikit.layer(BASE), hostile])
    with pytest.raises(ImageError, match="member 'x/pwned': its path goes through the symlink"):
        store.import_path(tmp_path / "img")
    assert list(outside.iterdir()) == []
    assert contents(store) == set()


def test_a_layout_without_oci_layout_is_refused(tmp_path: Path, store: Store) -> None:
    ocikit.write(tmp_path / "img", [ocikit.layer(BASE)])
    (tmp_path / "img/oci-layout").unlink()
    with pytest.raises(ImageError, match="not an OCI image layout"):
        store.import_path(tmp_path / "img")
    with pytest.raises(ImageError, match="no such file or directory"):
        store.import_path(tmp_path / "nothing")


def fake_upper(root: Path) -> Path:
    """An overlayfs upper directory as a sandbox (uid 3000005) leaves it."""
    upper = root / "upper"
    (upper / "home/user").mkdir(parents=True)
    (upper / "home/user/notes").write_text("mine")
    (upper / "home/user/su").write_bytes(b"x")
    os.symlink("/etc/shadow", upper / "home/user/link")
    os.mknod(upper / "home/gone", stat.S_IFCHR, os.makedev(0, 0))
    os.mkfifo(upper / "home/fifo")
    (upper / "opaque").mkdir()
    os.setxattr(upper / "opaque", OPAQUE_XATTR, b"y")
    (upper / "opaque/new").write_text("n")
    os.mknod(upper / "home/null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    for path in [upper, *upper.rglob("*")]:
        os.lchown(path, 3000005, 3000005)
    os.chmod(upper / "home/user/su", 0o6755)  # after chown, which clears the bits
    return upper


def test_add_layer_normalises_a_snapshot(tmp_path: Path, store: Store) -> None:
    base = store.import_path(ocikit.write(tmp_path / "img", [ocikit.layer(BASE)]).root, "base")
    layer = store.add_layer(fake_upper(tmp_path))
    top = store.root / "layers/sha256" / layer.removeprefix("sha256:")
    for path in [top, *top.rglob("*")]:
        st = os.lstat(path)
        assert (st.st_uid, st.st_gid) == (0, 0), path
        assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), path
    assert stat.S_IMODE(os.stat(top / "home/user/su").st_mode) == 0o755
    assert os.readlink(top / "home/user/link") == "/etc/shadow"
    gone = os.lstat(top / "home/gone")
    assert stat.S_ISCHR(gone.st_mode) and gone.st_rdev == 0
    assert not os.path.lexists(top / "home/fifo")
    assert not os.path.lexists(top / "home/null")
    assert os.getxattr(top / "opaque", OPAQUE_XATTR) == b"y"
    assert (top / "home/user/notes").read_text() == "mine"
    assert store.add_layer(fake_upper(tmp_path / "again")) == layer  # same content, same id
    derived = store.derive(base, layer, "snap-1", "policy-a")
    assert derived.layers == (*base.layers, layer) and derived.parent == "base"
    assert derived.owner == "policy-a" and derived.env == base.env
    assert derived.size == base.size + 4 + 1 + 1
    assert store.layer_dirs(derived)[0] == top
    with pytest.raises(ImageError, match="an image named 'snap-1' exists already"):
        store.derive(base, layer, "snap-1", None)
    assert store.gc() == []
    store.remove("snap-1")
    assert f"layers/sha256/{layer[7:]}" in store.gc()


def test_a_snapshot_cannot_make_a_small_disk_a_large_one(tmp_path: Path, store: Store) -> None:
    """A sparse file costs a sandbox's scratch disk nothing and hard links one copy, but the
    copy writes every byte of each name (found by review: 3 GiB written from a 64 MiB disk).
    Past the limit the snapshot is refused, clearly, and nothing is left in the store."""
    sparse = tmp_path / "sparse"
    sparse.mkdir()
    with open(sparse / "hole", "wb") as f:
        f.truncate(1 << 40)  # 1 TiB of nothing
    with pytest.raises(ImageError, match="more than 1048576 bytes copied"):
        store.add_layer(sparse, max_bytes=1 << 20)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "f").write_bytes(b"x" * (300 << 10))
    for i in range(4):
        os.link(linked / "f", linked / f"f{i}")  # 1.5 MiB as copies, 300 KiB on disk
    with pytest.raises(ImageError, match="more than 1048576 bytes copied"):
        store.add_layer(linked, max_bytes=1 << 20)
    assert store.add_layer(linked, max_bytes=2 << 20).startswith("sha256:")  # the control
    many = tmp_path / "many"
    many.mkdir()
    for i in range(20):
        (many / f"e{i}").write_bytes(b"")
    small = Store(tmp_path / "small-store", max_layer_entries=10)
    with pytest.raises(ImageError, match="more than 10 entries"):
        small.add_layer(many)
    assert not list(small.root.rglob("e1"))  # nothing of it kept


def test_add_layer_is_fast(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")  # the default cap: 100 MiB is over the fixture's
    upper = tmp_path / "upper"
    upper.mkdir()
    chunk = os.urandom(1 << 20)
    for i in range(10):
        (upper / f"f{i}").write_bytes(chunk * 10)
    started = time.monotonic()
    store.add_layer(upper)
    assert time.monotonic() - started < 3.0  # ~0.2 s on an idle machine: 100 MiB


def fake_skopeo(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "skopeo"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


def test_pull_runs_skopeo_then_imports(tmp_path: Path, store: Store,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    built = ocikit.write(tmp_path / "src", [ocikit.layer(BASE)])
    log = tmp_path / "argv"
    # skopeo copy --quiet docker://REF oci:DIR:latest -> a copy of the prepared layout
    script = fake_skopeo(tmp_path, f'echo "$@" > {log}\ndest="${{4#oci:}}"\n'
                                   f'cp -r {built.root} "${{dest%:latest}}"\n')
    monkeypatch.setattr(store_module.shutil, "which", lambda _: str(script))
    image = store.pull("busybox", print)
    assert image.name == "busybox:latest" and image.digest == built.digest
    assert log.read_text().startswith("copy --quiet docker://busybox:latest oci:")
    assert not list((store.root / "tmp").iterdir())


def test_pull_failures_are_said_clearly(tmp_path: Path, store: Store,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module.shutil, "which", lambda _: None)
    monkeypatch.setattr(store_module, "SKOPEO", str(tmp_path / "none"))
    with pytest.raises(ImageError, match="cannot pull x: skopeo is not installed"):
        store.pull("x")
    script = fake_skopeo(tmp_path, 'echo "time=x level=fatal msg=manifest unknown" >&2\n'
                                   "exit 1\n")
    monkeypatch.setattr(store_module.shutil, "which", lambda _: str(script))
    with pytest.raises(ImageError, match=r"cannot pull nope:1: skopeo failed: .*manifest unkn"):
        store.pull("nope:1")
    with pytest.raises(ImageError, match="not an image reference"):
        store.pull("--src-creds=x")
    assert contents(store) == set()


def test_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    built = ocikit.write(tmp_path / "img", [ocikit.layer(BASE), ocikit.layer(TOP)])
    at = ["--store", str(tmp_path / "store")]
    assert main(["image", "import", str(built.root), "--name", "demo:1", *at]) == 0
    out, err = capsys.readouterr()
    assert out == f"demo:1 {built.digest}\n"
    assert "layer 2/2 sha256:" in err and "unpacked" in err
    assert main(["image", *at, "ls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "DIGEST", "SIZE", "LAYERS", "AGE", "OWNER"]
    assert lines[1].split() == ["demo:1", built.digest[:19] + "…", "15", "B", "2", "0s", "-"]
    assert main(["image", "ls", "--json", *at]) == 0
    assert [Image.of(i).name for i in json.loads(capsys.readouterr().out)] == ["demo:1"]
    assert main(["image", "rm", "nothing", *at]) == 1
    assert capsys.readouterr().err == "sealgate image: no image nothing\n"
    assert main(["image", "rm", "demo:1", *at]) == 0
    capsys.readouterr()
    assert main(["image", "gc", "--json", *at]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 4  # two layers, manifest, config
    assert main(["image", "import", str(tmp_path / "missing"), *at]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sealgate image: ") and err.count("\n") == 1
