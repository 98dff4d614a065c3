"""A sandbox's root from an image: the image's layers shared read-only, its own writes on top.

The layers (`sandbox.images`: unpacked once per host, owned by root, in overlayfs's format) are
the lower layers of an overlay whose upper and work directories are on the sandbox's scratch
tmpfs (`sandbox.host.scratch`): one copy on disk and in the page cache for every sandbox of an
image, each sandbox's changes (an `apt-get install`, a `pip install`) charged to its own capped
tmpfs and gone with it.

The sandbox runs as root of its own user namespace, which is its unprivileged host uid. Each
layer is mounted for it idmapped (`mount_setattr(MOUNT_ATTR_IDMAP)`) so that the image's root
files are that uid's: the sandbox may change them (overlay copies them up into its tmpfs) while
on disk they stay root's, and no other sandbox, with another uid, can. Files of other owners in
the image show as the overflow id, read as their mode allows.

Everything is mounted under the scratch tmpfs's mount point, so the tmpfs's lazy unmount at
teardown takes the overlay and the idmapped layers with it.

`lay_over` makes the places bubblewrap mounts over (/proc, /tmp, the trust store, resolv.conf)
plain directories and files of the sandbox's root before it starts: an image is untrusted, and
a link there would lead a mount elsewhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import SandboxError
from ..guest import layover

HOST = "/run/sealgate/host"  # where an image sandbox's agent finds the host's /usr

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
# x86_64 and arm64 share these numbers (the new mount API postdates the split tables).
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, 0o2000000
_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 4
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
_MOUNT_ATTR_IDMAP = 0x00100000
_MS_NOSUID, _MS_NODEV = 2, 4


class RootError(SandboxError):
    """The sandbox's root could not be made from its image; the sandbox must not start."""


@dataclass(frozen=True)
class ImageRoot:
    """What a slot needs of an image: its layers, top first, and its configuration."""

    key: str  # the same key, the same root (a pool is kept per key)
    layers: tuple[Path, ...]
    env: tuple[str, ...] = ()  # "NAME=value", the image's
    workdir: str = ""
    disks: Path | None = None  # where its disk is kept, for a tier that takes one (the store's)
    # The ids its `User` names (`sandbox.images.user`), the sandbox's names for itself inside;
    # None: root of its own user namespace. `home`: that user's, for HOME where Env has none.
    user: tuple[int, int] | None = None
    home: str = ""


class _Attr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(result: int, what: str) -> int:
    if result < 0:
        raise RootError(f"{what}: {os.strerror(ctypes.get_errno())}")
    return result


_namespaces: dict[tuple[int, int], int] = {}
_namespaces_lock = threading.Lock()


def _user_namespace(owner: tuple[int, int]) -> int:
    """A descriptor of a user namespace mapping uid and gid 0 to `owner`'s: what an idmapped
    mount needs. Kept for the daemon's life, one per owner (a few hundred at most)."""
    uid, gid = owner
    with _namespaces_lock:
        if owner in _namespaces:
            return _namespaces[owner]
        # A child that makes the namespace and waits on its stdin; root writes its maps.
        child = subprocess.Popen(["unshare", "--user", "--", "cat"], stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ours = os.readlink("/proc/self/ns/user")
            for _ in range(2000):  # bounded: 2 s for an exec and an unshare
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{child.pid}/ns/user") != ours:
                        break
                time.sleep(0.001)
            else:
                raise RootError("no user namespace for the image's idmapped mount")
            proc = f"/proc/{child.pid}"
            Path(f"{proc}/uid_map").write_text(f"0 {uid} 1\n")
            Path(f"{proc}/setgroups").write_text("deny\n")
            Path(f"{proc}/gid_map").write_text(f"0 {gid} 1\n")
            fd = os.open(f"{proc}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise RootError(f"cannot map the image for {uid}:{gid}: {exc.strerror}") from None
        finally:
            child.kill()
            child.wait()
        _namespaces[owner] = fd
        return fd


def _idmapped(source: Path, target: Path, userns: int) -> None:
    """`source` mounted at `target`, read-only, its root files `userns`'s uid's."""
    tree = _check(_libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source),
                                _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC), f"open_tree {source}")
    try:
        attr = _Attr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID
                     | _MOUNT_ATTR_NODEV, 0, 0, userns)
        _check(_libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr),
                             ctypes.sizeof(attr)), "mount_setattr (idmap)")
        _check(_libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(target),
                             _MOVE_MOUNT_F_EMPTY_PATH), f"move_mount {target}")
    finally:
        os.close(tree)


def mount(point: Path, owner: tuple[int, int], layers: Sequence[Path]) -> Path:
    """The root for a sandbox whose scratch tmpfs is mounted at `point`, its files `owner`'s
    (uid and gid: its layers idmapped to them; (0, 0): the layers as they are, for a tier whose
    host side writes as root): the merged directory to give the tier as /. Raises RootError
    (what was mounted goes with the tmpfs)."""
    if not layers:
        raise RootError("an image with no layer")
    lowers = [str(layer) for layer in layers]
    if owner != (0, 0):
        userns = _user_namespace(owner)
        lowers = []
        for depth, layer in enumerate(layers):
            target = point / "lower" / str(depth)
            target.mkdir(parents=True, mode=0o700)
            _idmapped(layer, target, userns)
            lowers.append(str(target))
    for name in ("upper", "work", "root"):
        (point / name).mkdir(mode=0o755)
        os.chown(point / name, *owner)
    root = point / "root"
    # A colon or comma in a path would end the option: ours are digits and fixed names, and
    # the store's (`sandbox.images`) are digests under a directory the operator chose.
    if any(c in layer for layer in lowers for c in ":,\\"):
        raise RootError(f"the image store's path cannot be given to overlayfs: {lowers[0]}")
    options = f"lowerdir={':'.join(lowers)},upperdir={point / 'upper'},workdir={point / 'work'}"
    if _libc.mount(b"sealgate-root", os.fsencode(root), b"overlay", _MS_NOSUID | _MS_NODEV,
                   options.encode()) != 0:
        raise RootError(f"cannot mount the image's overlay: {os.strerror(ctypes.get_errno())}")
    return root


def lay_over(root: Path, owner: tuple[int, int], dirs: Mapping[str, int], files: Iterable[str]
             ) -> None:
    """Make each of `dirs` a directory (of that mode, if made) and each of `files` a regular
    file in `root` (the sandbox's overlay, as host root), `owner`'s if made, replacing whatever
    link or other thing the image has there, never following one (`guest.layover`). Raises
    RootError."""
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for path, mode in dirs.items():
            os.close(layover.walk(top, path, True, mode, owner))
        for path in files:
            os.close(layover.walk(top, path, False, 0o644, owner))
    except OSError as exc:
        raise RootError(f"cannot prepare the image's root: {exc.strerror}") from None
    finally:
        os.close(top)


def loader() -> tuple[str, str]:
    """The host Python's ELF interpreter and the directory of its libraries, both under /usr
    (a merged-/usr host): how an image sandbox's agent runs the host's Python from `HOST`
    without the image's libraries (`--inhibit-cache`, `--library-path`)."""
    python = os.path.realpath("/usr/bin/python3")
    interpreter = os.path.realpath(_interpreter(python))
    if not interpreter.startswith("/usr/") or not python.startswith("/usr/"):
        raise RootError(f"the host's Python ({python}, {interpreter}) is not under /usr")
    return interpreter, python


def _interpreter(program: str) -> str:
    """An ELF program's PT_INTERP (64-bit, little-endian: the hosts sealgate runs on)."""
    with open(program, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise RootError(f"{program}: not a 64-bit little-endian ELF program")
        phoff = int.from_bytes(head[32:40], "little")
        size, count = (int.from_bytes(head[54:56], "little"),
                       int.from_bytes(head[56:58], "little"))
        f.seek(phoff)
        table = f.read(size * count)
        for i in range(count):
            entry = table[i * size:(i + 1) * size]
            if int.from_bytes(entry[0:4], "little") == 3:  # PT_INTERP
                offset = int.from_bytes(entry[8:16], "little")
                length = int.from_bytes(entry[32:40], "little")
                f.seek(offset)
                return f.read(length).rstrip(b"\0").decode()
    raise RootError(f"{program}: no ELF interpreter")
