"""A long-lived sandbox's writable layer: one tmpfs of its own, capped in size, gone with it.

Everything a sandbox of the daemon may write lives here: /workspace, its home (pip's user site,
npm's prefix, caches), /tmp and /var/tmp, each a directory of the one tmpfs, bound in place by
bubblewrap. One cap covers them all (the `disk` limit), its pages count against the sandbox's
memory limit (tmpfs is charged to the cgroup that writes it), nothing of it ever reaches the
host's disk, and deleting the sandbox unmounts it: an install does not outlive its sandbox, so
a poisoned dependency cannot persist into the next one.

The mount point is `/run/sealgate-slots/<n>` (n the link index): the parent may be passed
through but not listed (0711), and the tmpfs's root belongs to the sandbox's uid alone (0700),
since bubblewrap, already that uid, resolves the directories it binds. Inside, the sandbox's
mount table names the tmpfs and a directory of it, never a host path.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

from ..errors import SandboxError

ROOT = Path("/run/sealgate-slots")
# Where in the sandbox -> its directory on the tmpfs.
PLACES = {"/workspace": "workspace", "/home/sandbox": "home", "/tmp": "tmp",  # noqa: S108
          "/var/tmp": "var-tmp"}  # noqa: S108


_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
# The syscalls themselves, not mount(8) and umount(8): a fork and exec each, on the path of
# every create and delete.
_libc = ctypes.CDLL(None, use_errno=True)


class ScratchError(SandboxError):
    """The writable layer could not be made; the sandbox must not start."""



def mount_point(index: int) -> Path:
    return ROOT / str(index)


def create(index: int, uid: int, gid: int, size: int) -> dict[str, Path]:
    """A fresh tmpfs for link `index`, owned by `uid`: the places to bind, by sandbox path."""
    ROOT.mkdir(mode=0o711, exist_ok=True)
    ROOT.chmod(0o711)
    point = mount_point(index)
    remove(index)  # whatever an earlier holder of the index left
    point.mkdir(mode=0o700)
    options = f"size={size},nr_inodes=1m,mode=0700,uid={uid},gid={gid}"
    if _libc.mount(b"sealgate-scratch", os.fsencode(point), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                   options.encode()) != 0:
        error = ctypes.get_errno()
        with contextlib.suppress(OSError):
            point.rmdir()
        raise ScratchError(f"cannot mount the sandbox's tmpfs: {os.strerror(error)}")
    places = {}
    try:
        for inside, name in PLACES.items():
            path = point / name
            path.mkdir(mode=0o1777 if "tmp" in name else 0o755)
            os.chown(path, uid, gid)
            places[inside] = path
    except OSError as exc:
        remove(index)
        raise ScratchError(f"cannot prepare the sandbox's tmpfs: {exc}") from None
    return places


def remove(index: int) -> None:
    """Unmount and remove link `index`'s tmpfs, if there is one (after its processes are gone;
    a lazy unmount all the same, so a straggler cannot keep the mount point)."""
    point = mount_point(index)
    if os.path.ismount(point):
        _libc.umount2(os.fsencode(point), _MNT_DETACH)  # what is left is rmdir's to report
    with contextlib.suppress(OSError):
        point.rmdir()
