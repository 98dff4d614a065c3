"""An image's layers as one read-only erofs disk: the root of a sandbox on a kernel of its own.

The microVM tier's guest cannot use the host's overlay of the layers (no host mount crosses
into a guest); serving the layers over 9p would cost a round trip to QEMU per lookup and read
under emulation, and a guest with 9p mounts cannot be migrated to a file. So the guest gets the
image as a disk (virtio-blk, read-only) and makes its own overlay on it (`guest/vmroot.py`).
The disk is erofs (Debian's `erofs-utils`):

- read-only by design: nothing in the guest, not even its root, can write to it, and QEMU
  opens it read-only too;
- compact (no journal, no free space, tail-packed inodes) and built in one pass from a
  directory, where ext4 would need a size guessed up front and squashfs compresses by default;
- uncompressed here: its blocks go straight into the guest's page cache, no decompression per
  read under emulation, and the guest's overlay reads it like any lower layer.

One disk per image key (its layers' ids, joined: `ImageRoot.key`), built once and kept in the
store's `disks/` as `<sha256 of the key>.erofs`; `Store.gc` removes those no image names. The
build merges the layers with a read-only overlay (`lowerdir=top:...:bottom`, no upper:
whiteouts and opaque directories are resolved by overlayfs itself) mounted in a private mount
namespace of its own (`unshare`), so the mount goes with the process whatever happens to it,
and runs `mkfs.erofs` on that; the file is written beside and renamed into place, under a
lock, so two slots never build the same disk twice and no reader ever sees half of one. Every
file is root's (`--all-root`; the layers' are anyway) and no extended attribute is kept
(`-x -1`: no file capability arrives, as the unpacker keeps none). The file is 0644 in the
store's 0700 directory: QEMU, unprivileged, never opens it by path (its starter hands it a
descriptor).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .errors import ImageError

MKFS = "/usr/bin/mkfs.erofs"
_BUILD_SECONDS = 900.0


def name(key: str) -> str:
    """The disk's file name for an image's key (its layers' ids, bottom first, joined by
    commas: what the daemon keys an image's pool by)."""
    return hashlib.sha256(key.encode()).hexdigest() + ".erofs"


def build(disks: Path, key: str, layers: Sequence[Path]) -> Path:
    """The disk of the image keyed `key` whose layer directories are `layers` (top first),
    in `disks`, built if it is not there yet. Raises ImageError."""
    target = disks / name(key)
    if target.is_file():
        return target
    if not layers:
        raise ImageError("an image with no layer")
    if not os.access(MKFS, os.X_OK):
        raise ImageError(f"{MKFS} is missing (Debian package erofs-utils): images on the "
                         "microVM tier need it")
    lowers = [str(layer) for layer in layers]
    # A colon or comma would end overlayfs' option: the store's paths are digests under a
    # directory the operator chose.
    if any(c in layer for layer in (*lowers, str(disks)) for c in ":,\\"):
        raise ImageError(f"the image store's path cannot be given to overlayfs: {disks}")
    disks.mkdir(mode=0o700, exist_ok=True)
    with open(disks / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the next finds it built
        if target.is_file():
            return target
        work = disks / f".{target.stem}.build"
        shutil.rmtree(work, ignore_errors=True)  # a build killed half way
        try:
            _make(work, lowers, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


# The overlay mounted in the namespace, then mkfs.erofs on it: "$1" its options, "$2" the
# merged directory, "$3" the disk being written.
_SCRIPT = ('mount -t overlay -o "ro,$1" sealgate-image "$2" && '
           'exec "$4" --quiet -x -1 --all-root "$3" "$2"')


def _make(work: Path, lowers: list[str], target: Path) -> None:
    work.mkdir(mode=0o700)
    # Without an upper directory overlayfs wants two lower layers: an empty one at the bottom.
    for sub in ("empty", "merged"):
        (work / sub).mkdir(mode=0o755)
    out = work / "disk.erofs"
    options = f"lowerdir={':'.join([*lowers, str(work / 'empty')])}"
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _SCRIPT, "sh",
            options, str(work / "merged"), str(out), MKFS]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_BUILD_SECONDS,
                              check=False, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageError(f"cannot build the image's disk: {exc}") from None
    if done.returncode != 0 or not out.is_file():
        said = (done.stderr or done.stdout).strip()[-400:]
        raise ImageError(f"cannot build the image's disk: {said or done.returncode}")
    out.chmod(0o644)
    os.replace(out, target)
