"""The places a sandbox's runtime mounts over, made plain in an image's root, never through a
link the image put there. One walk for both sides: the host lays over a bubblewrap or gVisor
sandbox's overlay (`sandbox.host.rootfs`), the microVM's guest over its own (`vmroot`).
Standard library only: it runs inside the guest too.

Each component is opened by a directory descriptor with O_NOFOLLOW. What is not what it must be
(a link, a file where a directory is to be, a directory where a file is) is replaced: a link
or file unlinked, a directory set aside as `.NAME.image` (never removed through whatever it
holds). An image is untrusted; its root is the sandbox's own to change, so replacing is safe.
"""

from __future__ import annotations

import errno
import os
import stat


def walk(top: int, path: str, directory: bool, mode: int,
         owner: tuple[int, int] | None = None) -> int:
    """A descriptor of `path` under the directory `top`: a directory (or, not `directory`, an
    empty regular file), made so with `mode` (and `owner`, uid and gid, if given) if it
    is missing or anything else. Parents made are 0755. Raises OSError."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise OSError(errno.EINVAL, f"not a path to lay over: {path[:200]!r}")
    fd = os.dup(top)
    try:
        for depth, name in enumerate(parts):
            last = depth == len(parts) - 1
            fd = _step(fd, name, directory or not last, mode if last else 0o755, owner)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _step(parent: int, name: str, want_dir: bool, mode: int,
          owner: tuple[int, int] | None) -> int:
    """`name` in `parent` as a directory or an empty file; closes `parent`."""
    try:
        try:
            info = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            info = None
        if info is not None:
            fits = stat.S_ISDIR(info.st_mode) if want_dir else stat.S_ISREG(info.st_mode)
            if not fits:
                if stat.S_ISDIR(info.st_mode):
                    os.rename(name, f".{name}.image", src_dir_fd=parent, dst_dir_fd=parent)
                else:
                    os.unlink(name, dir_fd=parent)
                info = None
        if info is None:
            if want_dir:
                os.mkdir(name, 0o700, dir_fd=parent)
            else:
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600, dir_fd=parent))
            if owner is not None:
                os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)
            os.chmod(name, mode, dir_fd=parent)  # just made: ours, not a link
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if want_dir else 0)
        return os.open(name, flags, dir_fd=parent)
    finally:
        os.close(parent)
