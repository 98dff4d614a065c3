"""A sandbox's root from an image, made inside the microVM (the agent's `root` op, before any
command runs). Standard library only, as the agent; imported only for an image's sandbox.

The host hands the image's layers as one read-only erofs disk (`sandbox.images.disk`, the only
virtio-blk device: /dev/vda). Here:

- the disk is mounted read-only at /mnt/image, a tmpfs at /mnt/rw holds the overlay's upper
  and work directories (tmpfs's own cap: half the guest's RAM, which QEMU's cgroup on the host
  bounds in turn), and the overlay of the two at `ROOT` is the image's root: writable, what is
  written in the guest's memory only, gone with the VM, the disk never changed;
- the places the sandbox needs (`dirs`: /proc, /dev, /run, /tmp, /workspace, the home, the
  image's WorkingDir) are made plain directories and each staged file (`files`: the CA
  bundle, resolv.conf, hosts, ...; what the host put in the guest's own root) a plain file,
  replacing whatever link or other thing the image put there, never following one: every
  path is walked from the root's descriptor one component at a time (`O_NOFOLLOW`), and
  every mount lands on the descriptor the walk ended on (`/proc/self/fd/N`), never on a path
  resolved again;
- over them: a proc of the guest's, its boot line empty; a /dev of its own with only the
  harmless devices (no disk, no console port: the agent's channel is not there); a tmpfs at
  /run; the workspace bound at /workspace, first given what the image has there (a
  snapshot's workspace: `_seed`); each staged file bound read-only. The workspace is the
  host's 9p share (a one-shot run's), or a sandboxd slot's, a tmpfs of the guest's own of
  the slot's `--disk` size: no 9p mount is left in such a guest, so QEMU can save it.

Commands then run chrooted into `ROOT` (`vmagent`), which shows them nothing of the guest's
own root: not the Python the agent runs on, nor the agent's files.
"""

from __future__ import annotations

import ctypes
import os
import stat

from . import layover

ROOT = "/mnt/root"
_IMAGE, _RW = "/mnt/image", "/mnt/rw"
_DISK = "/dev/vda"
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_DEPTH = 256  # as the workspace's own walks (`fsops`)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
# The new mount API (x86_64's and arm64's numbers), for binds that are read-only at once.
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, 0o2000000
_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
_MOVE_MOUNT_F_EMPTY_PATH, _MOVE_MOUNT_T_EMPTY_PATH = 4, 0x40
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
# The devices a command may have (as bubblewrap's --dev gives), by name: (major, minor).
_DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8),
            "urandom": (1, 9), "tty": (5, 0)}
_DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
              "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"}
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                   flags, data.encode() if data else None) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source} ({fstype or 'bind'}): {os.strerror(error)}")


def present() -> bool:
    """Whether the host gave this guest an image's disk."""
    return os.path.exists("/sys/block/vda")


def make(dirs: dict[str, int], files: list[str], owner: tuple[int, int],
         workspace: int | None = None, home: str | None = None) -> str:
    """The image's root, ready for commands (see the module); where it is. `workspace`: the
    size of a tmpfs of the guest's own for /workspace, `owner`'s, where the host shares none;
    `home` (one of `dirs`): made `owner`'s, the image's User's. Raises OSError."""
    if not present():
        raise OSError("this VM has no image disk")
    if workspace is not None:
        if os.path.ismount("/workspace"):
            raise OSError("this VM has the host's workspace already")
        _mount("workspace", "/workspace", "tmpfs", _MS_NOSUID | _MS_NODEV,
               f"size={workspace},nr_inodes=1m,mode=0755,uid={owner[0]},gid={owner[1]}")
    for path in (_IMAGE, _RW, ROOT):
        os.makedirs(path, mode=0o755, exist_ok=True)
    _mount(_DISK, _IMAGE, "erofs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    _mount("image-rw", _RW, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=755")
    for sub in ("upper", "work"):
        os.mkdir(f"{_RW}/{sub}", 0o755)
    _mount("image", ROOT, "overlay", _MS_NOSUID | _MS_NODEV,
           f"lowerdir={_IMAGE},upperdir={_RW}/upper,workdir={_RW}/work")
    top = os.open(ROOT, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        made = {path: layover.walk(top, path, True, mode) for path, mode in dirs.items()}
        try:
            if home in made:
                os.fchown(made[home], *owner)
            _fill(top, made, owner)
        finally:
            for fd in made.values():
                os.close(fd)
        for path in files:
            fd = layover.walk(top, path, False, 0o644)
            try:
                _bind(path, fd, read_only=True)
            finally:
                os.close(fd)
    finally:
        os.close(top)
    return ROOT


def _at(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def _bind(source: str, fd: int, *, read_only: bool) -> None:
    """`source` bound over what `fd` is, read-only from the start if asked: the new mount API
    (a bind made read-only by a remount would need the new mount found by a path again)."""
    tree = _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, source.encode(),
                         _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC)
    if tree < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"open_tree {source}: {os.strerror(error)}")
    try:
        if read_only:
            attr = (ctypes.c_uint64 * 4)(_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID
                                         | _MOUNT_ATTR_NODEV, 0, 0, 0)
            _call(_libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, attr,
                                ctypes.sizeof(attr)), f"mount_setattr {source}")
        _call(_libc.syscall(_SYS_MOVE_MOUNT, tree, b"", fd, b"",
                            _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH),
              f"move_mount {source}")
    finally:
        os.close(tree)


def _call(result: int, what: str) -> None:
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _fill(top: int, made: dict[str, int], owner: tuple[int, int]) -> None:
    """What goes over the places made: proc, dev, run, the workspace. (A descriptor opened
    before a mount is the directory under it: what is mounted is reached again from `top`.)"""
    if "/proc" in made:
        _mount("proc", _at(made["/proc"]), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        # Its boot line reads empty, as the guest's own /proc/cmdline does.
        proc = os.open("proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=top)
        try:
            cmdline = os.open("cmdline", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
        finally:
            os.close(proc)
        try:
            _bind("/sealgate/empty", cmdline, read_only=True)
        finally:
            os.close(cmdline)
    if "/dev" in made:
        _mount("dev", _at(made["/dev"]), "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=755")
        _dev(os.open("dev", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=top))
    if "/run" in made:
        _mount("run", _at(made["/run"]), "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=755")
    if "/workspace" in made and os.path.ismount("/workspace"):
        # What the image has there (a snapshot's workspace) goes into the workspace itself,
        # which is mounted apart and hides the image's own directory once bound.
        into = os.open("/workspace", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _seed(made["/workspace"], into, owner, 0)
        finally:
            os.close(into)
        _bind("/workspace", made["/workspace"], read_only=False)


def _seed(source: int, target: int, owner: tuple[int, int], depth: int) -> None:
    """Directories, regular files and symlinks of `source` copied into `target`, never
    following a link, owned by `owner`, setuid and setgid dropped; anything else skipped."""
    if depth > _MAX_DEPTH:
        raise OSError(f"the image's /workspace is nested over {_MAX_DEPTH} deep")
    for name in os.listdir(source):
        st = os.stat(name, dir_fd=source, follow_symlinks=False)
        mode = stat.S_IMODE(st.st_mode) & 0o1777
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(name, 0o700, dir_fd=target)
            inner = os.open(name, _OPEN_DIR, dir_fd=source)
            made = os.open(name, _OPEN_DIR, dir_fd=target)
            try:
                _seed(inner, made, owner, depth + 1)
                os.fchown(made, *owner)
                os.fchmod(made, mode)
            finally:
                os.close(inner)
                os.close(made)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=target)
            os.chown(name, *owner, dir_fd=target, follow_symlinks=False)
        elif stat.S_ISREG(st.st_mode):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=source)
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o600, dir_fd=target)
            try:
                while os.sendfile(out, fd, None, 1 << 20):
                    pass
                os.fchown(out, *owner)
                os.fchmod(out, mode)
            finally:
                os.close(fd)
                os.close(out)


def _dev(dev: int) -> None:
    """The devices, links and mounts of /dev (`dev`: its tmpfs, closed here)."""
    try:
        for name, (major, minor) in _DEVICES.items():
            os.mknod(name, stat.S_IFCHR | 0o666, os.makedev(major, minor), dir_fd=dev)
            os.chmod(name, 0o666, dir_fd=dev)  # noqa: S103 - /dev/null and the like: anyone's
        for name, target in _DEV_LINKS.items():
            os.symlink(target, name, dir_fd=dev)
        for name, mode in (("pts", 0o755), ("shm", 0o1777)):
            os.mkdir(name, mode, dir_fd=dev)
            os.chmod(name, mode, dir_fd=dev)
        _mount("devpts", f"{_at(dev)}/pts", "devpts", _MS_NOSUID | _MS_NOEXEC,
               "newinstance,ptmxmode=0666,mode=620")
        _mount("shm", f"{_at(dev)}/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    finally:
        os.close(dev)
