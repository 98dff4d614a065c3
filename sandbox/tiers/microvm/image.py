"""The guest's kernel and initramfs, built from Debian packages and cached by their inputs.

The kernel is Debian's generic one (`linux-image-amd64`): the cloud flavour lacks 9p, which
shares the host's /usr into a host-root sandbox's guest read-only, so the guest needs no disk
image of its own (an image's sandbox gets the image as a disk, and its agent runs from the
initramfs: `runtime`). The package is fetched with `apt-get download`
and unpacked with `dpkg-deb` into the build directory, never installed on the host (that
would touch the host's boot). The initramfs is written here, as a newc cpio: a static busybox
(Debian's `busybox-static`, unpacked the same way), the handful of modules the guest needs
(virtio over MMIO, its network, console port, 9p, and a block device, erofs and overlayfs for
an image's disk), an `/init` that mounts the host's /usr where it is shared and starts the
guest agent, and the agent itself (`sandbox/guest/`'s `staging.VM_MODULES`). It comes in two:
`initrd.cpio` for a host-root sandbox, whose /usr and so the agent's Python are the host's over
9p, and `standalone.cpio` for a sandbox from an image, which holds the agent's Python itself
(`runtime`, ~13 MB that a host-root guest would unpack for nothing).

An image lives in `<dir>/<key>/`, the key a hash of the two packages' versions and of every
file of sealgate's that ends up in the guest, so a change to any of them builds a new one;
a build is written beside and renamed into place, so a reader never sees half of one.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ...errors import SandboxError
from ...guest import staging
from . import runtime

KERNEL_PACKAGE = "linux-image-amd64"  # the metapackage: it names the current ABI's package
BUSYBOX_PACKAGE = "busybox-static"
# The guest's modules, loaded in this order (each after what it depends on: `modinfo -F
# depends` of Debian's 6.1 package). virtio_blk, erofs and overlay serve a sandbox from an
# image (its layers as one read-only erofs disk, `sandbox.host.rootdisk`); erofs needs
# libcrc32c, which finds its algorithm (its softdep, crc32c) only if it is already loaded: the
# guest has no modprobe to load it on demand.
MODULES = ("virtio_ring", "virtio", "virtio_mmio", "failover", "net_failover", "virtio_net",
           "virtio_console", "virtio-rng", "netfs", "fscache", "9pnet", "9pnet_virtio", "9p",
           "virtio_blk", "crc32c_generic", "libcrc32c", "erofs", "overlay")
# The agent's modules: the package `guest` in the guest's /sealgate.
GUEST_FILES = (*(staging.HERE / name for name in staging.VM_MODULES), staging.VM_INIT)
DEFAULT_DIR = Path(__file__).resolve().parents[3] / "var" / "microvm"
DIR_ENV = "SEALGATE_MICROVM_DIR"
_APT_TIMEOUT = 300


@dataclass(frozen=True)
class Image:
    kernel: Path
    initrd: Path  # a host-root sandbox's: its /usr is the host's, shared
    standalone: Path  # an image's sandbox's: the agent's own Python besides (`runtime`)
    key: str

    def initramfs(self, shares_usr: bool) -> Path:
        return self.initrd if shares_usr else self.standalone


_INITRD, _STANDALONE = "initrd.cpio", "standalone.cpio"


def _at(place: Path) -> Image:
    return Image(place / "vmlinux", place / _INITRD, place / _STANDALONE, place.name)


def image_dir() -> Path:
    return Path(os.environ.get(DIR_ENV, str(DEFAULT_DIR)))


def find() -> Image | None:
    """The newest image already built, or None (asking apt nothing: cheap enough for a tier's
    availability check)."""
    base = image_dir()
    if not base.is_dir():
        return None
    built = [d for d in base.iterdir() if (d / "ready").is_file()]
    if not built:
        return None
    newest = max(built, key=lambda d: (d / "ready").stat().st_mtime)
    return _at(newest)


def build(base: Path | None = None) -> Image:
    """The image for the packages apt offers now, built if it is not cached. Raises
    SandboxError saying what failed."""
    base = base or image_dir()
    try:
        kernel_pkg = _kernel_package()
    except SandboxError:
        if os.geteuid() != 0:
            raise
        _apt(["apt-get", "update", "-qq"])  # a fresh machine's apt has no lists yet
        kernel_pkg = _kernel_package()
    versions = {name: _candidate(name) for name in (kernel_pkg, BUSYBOX_PACKAGE)}
    key = _key(versions)
    target = base / key
    if (target / "ready").is_file():
        os.utime(target / "ready")
        return _at(target)
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix=".build-") as tmp:
        work = Path(tmp)
        debs = _download(list(versions), work)
        out = work / "image"
        out.mkdir()
        tree = work / "kernel"
        _unpack(debs[kernel_pkg], tree)
        (out / "vmlinux").write_bytes(vmlinux(_one(tree.glob("boot/vmlinuz-*")).read_bytes()))
        bb = work / "busybox"
        _unpack(debs[BUSYBOX_PACKAGE], bb)
        modules = _modules(_one(tree.glob("lib/modules/*")))
        (out / _INITRD).write_bytes(initramfs(bb / "bin" / "busybox", modules, []))
        (out / _STANDALONE).write_bytes(initramfs(bb / "bin" / "busybox", modules,
                                                  runtime.files()))
        (out / "ready").write_text(f"{versions}\n")
        for path in (out, *out.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(target, ignore_errors=True)
        out.rename(target)
    for old in base.iterdir():  # images of earlier inputs: nothing uses them any more
        if old.name != key and not old.name.startswith(".build-"):
            shutil.rmtree(old, ignore_errors=True)
    return _at(target)


def vmlinux(bzimage: bytes) -> bytes:
    """The kernel's ELF image out of Debian's bzImage (an xz stream inside it), which QEMU boots
    through its PVH entry: the guest then never decompresses itself (seconds under emulation,
    tens of milliseconds with KVM)."""
    start = bzimage.find(b"\xfd7zXZ\x00")
    if start < 0:
        raise SandboxError("the guest kernel is not xz-compressed: cannot unpack its image")
    try:
        elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bzimage[start:])
    except lzma.LZMAError as exc:
        raise SandboxError(f"cannot unpack the guest kernel: {exc}") from None
    if not elf.startswith(b"\x7fELF"):
        raise SandboxError("the guest kernel's payload is not an ELF image")
    return elf


def _key(versions: dict[str, str]) -> str:
    digest = hashlib.sha256(repr(sorted(versions.items())).encode())
    for path in (*GUEST_FILES, Path(__file__)):
        digest.update(path.read_bytes())
    digest.update(runtime.key())
    return digest.hexdigest()[:16]


def _apt(argv: list[str], cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_APT_TIMEOUT,
                              cwd=cwd, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{argv[0]} failed: {exc}") from None
    if done.returncode != 0:
        raise SandboxError(f"{' '.join(argv)}: {done.stderr.strip()[-400:]}")
    return done.stdout


def _kernel_package() -> str:
    """The real kernel package the metapackage depends on (linux-image-6.1.0-N-amd64)."""
    shown = _apt(["apt-cache", "show", "--no-all-versions", KERNEL_PACKAGE])
    for line in shown.splitlines():
        if line.startswith("Depends:"):
            for dep in line.removeprefix("Depends:").split(","):
                name = dep.split()[0]
                if name.startswith("linux-image-"):
                    return name
    raise SandboxError(f"apt does not know {KERNEL_PACKAGE}'s kernel: run 'apt-get update'")


def _candidate(name: str) -> str:
    for line in _apt(["apt-cache", "policy", name]).splitlines():
        if line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            if version and version != "(none)":
                return version
    raise SandboxError(f"apt offers no {name}: run 'apt-get update'")


def _download(names: list[str], work: Path) -> dict[str, Path]:
    # As root apt would hand the download to its _apt user, who cannot write here.
    _apt(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", *names], cwd=work)
    return {name: _one(work.glob(f"{name}_*.deb")) for name in names}


def _unpack(deb: Path, into: Path) -> None:
    _apt(["dpkg-deb", "-x", str(deb), str(into)])


def _one(found: Iterable[Path]) -> Path:
    paths = sorted(found)
    if len(paths) != 1:
        raise SandboxError(f"expected one file, found {[str(p) for p in paths]}")
    return paths[0]


def _modules(root: Path) -> list[tuple[str, bytes]]:
    by_name = {p.name.removesuffix(".ko"): p for p in root.rglob("*.ko")}
    missing = [m for m in MODULES if m not in by_name]
    if missing:
        raise SandboxError(f"the guest kernel has no module {', '.join(missing)}")
    return [(f"{m}.ko", by_name[m].read_bytes()) for m in MODULES]


def initramfs(busybox: Path, modules: list[tuple[str, bytes]],
              python: list[tuple[str, int, bytes]]) -> bytes:
    """The guest's whole root: busybox, modules, /init, the agent, a minimal /etc, and under
    /usr either nothing (a host-root VM's: the host's /usr comes over 9p) or `python`, the
    agent's own (`runtime`); merged-/usr links make /bin, /lib... of either."""
    cpio = _Cpio()
    cpio.add(".", 0o040755)  # the root, else the kernel's own: 1777, anyone's to write in
    for name in ("dev", "proc", "sys", "usr", "tmp", "run", "etc", "etc/ssl", "etc/ssl/certs",
                 "home", "workspace", "sealgate", "sealgate/modules", f"sealgate/{staging.PACKAGE}",
                 "root",
                 "mnt", "var", "var/tmp"):
        cpio.add(name, 0o040755)  # /tmp and /var/tmp are tmpfs mounts of their own
    for name in ("bin", "sbin", "lib", "lib64"):
        cpio.add(name, 0o120777, f"usr/{name}".encode())
    for name, mode, data in python:
        cpio.add(name, mode, data)
    cpio.add("sealgate/busybox", 0o100755, busybox.read_bytes())
    cpio.add("init", 0o100755, staging.VM_INIT.read_bytes())
    for name in staging.VM_MODULES:
        cpio.add(f"sealgate/{staging.PACKAGE}/{name}", 0o100644,
                 (staging.HERE / name).read_bytes())
    cpio.add("sealgate/empty", 0o100444)
    cpio.add("sealgate/modules/order", 0o100644, "".join(f"{n}\n" for n, _ in modules).encode())
    for name, data in modules:
        cpio.add(f"sealgate/modules/{name}", 0o100644, data)
    etc = {
        "passwd": "root:x:0:0:root:/root:/bin/sh\nsandbox:x:65534:65534:sandbox:/home/sandbox:"
                  "/bin/sh\n",
        "group": "root:x:0:\nsandbox:x:65534:\n",
        "hostname": "sandbox\n",
        "hosts": "127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
    }
    for name, text in etc.items():
        cpio.add(f"etc/{name}", 0o100644, text.encode())
    # Debian's /usr/bin/awk, editor, ... point into /etc/alternatives: the host's links, so the
    # guest's commands are the host's (links only, nothing of the host's configuration).
    alternatives = Path("/etc/alternatives")
    if alternatives.is_dir():
        cpio.add("etc/alternatives", 0o040755)
        for entry in sorted(alternatives.iterdir()):
            if entry.is_symlink():
                cpio.add(f"etc/alternatives/{entry.name}", 0o120777,
                         os.readlink(entry).encode())
    return cpio.finish()


class _Cpio:
    """The newc format the kernel unpacks (no compression: the guest would pay to undo it)."""

    def __init__(self) -> None:
        self._out = io.BytesIO()
        self._ino = 1

    def add(self, name: str, mode: int, data: bytes = b"") -> None:
        encoded = name.encode() + b"\0"
        fields = (self._ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        self._ino += 1
        self._out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + encoded)
        self._pad()
        self._out.write(data)
        self._pad()

    def _pad(self) -> None:
        self._out.write(b"\0" * (-self._out.tell() % 4))

    def finish(self) -> bytes:
        self.add("TRAILER!!!", 0)
        return self._out.getvalue()


def main() -> int:
    try:
        image = build()
    except SandboxError as exc:
        print(f"sealgate: cannot build the microVM image: {exc}", file=sys.stderr)
        return 1
    print(image.kernel.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
