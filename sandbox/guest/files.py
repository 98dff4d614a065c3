"""put and get in the workspace, as the sandbox's uid, run by the agent's shims (`agent`):
a path walked from /workspace that never follows a symbolic link, a file written whole or not
at all (`shim` serves them). Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import Any

from .protocol import WORKSPACE, report

_CHUNK = 1 << 16


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _walk(path: str, create: bool) -> tuple[int, str]:
    """The directory holding `path` (under /workspace) and the last name, never through a
    symbolic link; missing directories are made when `create`."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError("a path inside the workspace: names joined by '/', no '..'")
    fd = os.open(WORKSPACE, DIR_FLAGS)
    try:
        for name in parts[:-1]:
            nxt = open_child(fd, name, create)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def open_child(parent: int, name: str, create: bool = False) -> int:
    """The directory `name` of `parent`, itself and never where a link there leads; made
    (0755) when missing and `create`."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
        os.mkdir(name, 0o755, dir_fd=parent)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError:
        _refuse_link(parent, name)
        raise
    _same_entry(parent, name, fd)
    return fd


def _same_entry(parent: int, name: str, opened: int) -> None:
    """What was opened is the directory entry itself, not where a link there leads: gVisor's
    kernel (2022-12) follows a link to a directory even under O_NOFOLLOW | O_DIRECTORY. A link
    put there after the open is refused the same way (it is not what was opened)."""
    try:
        entry = os.lstat(name, dir_fd=parent)
        got = os.fstat(opened)
        same = (entry.st_dev, entry.st_ino) == (got.st_dev, got.st_ino)
    except OSError:
        same = False
    if not same:
        os.close(opened)
        _refuse_link(parent, name)
        raise ValueError(f"{name[:255]!r} changed while it was opened")


def _refuse_link(parent: int, name: str) -> None:
    """A link where a directory or file is wanted is refused as one (O_NOFOLLOW says only
    "not a directory" or "too many levels"), so the caller learns it is never followed."""
    try:
        info = os.lstat(name, dir_fd=parent)
    except OSError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise ValueError(f"{name[:255]!r} is a symbolic link: never followed")


def put(req: dict[str, Any], fds: list[int]) -> None:
    data, status = fds
    try:
        parent, name = _walk(str(req["path"]), create=True)
        # A short temporary name: the final one may already be as long as a name can be.
        tmp = f".sealgate-put-{os.getpid()}"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                      int(req.get("mode", 0o644)) & 0o777, dir_fd=parent)
        size, want = 0, int(req["size"])
        try:
            try:
                while chunk := os.read(data, _CHUNK):
                    size += len(chunk)
                    if size > want:
                        break
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view):]
            finally:
                os.close(out)
            if size != want:
                raise ValueError(f"received {size} bytes of {want}")
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            # Never a partial file left behind: after ENOSPC it would hold the space it took.
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise
        report(status, {"size": size})
    except (OSError, ValueError, KeyError) as exc:
        report(status, {"error": _said(exc)})


def get(req: dict[str, Any], fds: list[int]) -> None:
    data, status = fds
    try:
        parent, name = _walk(str(req["path"]), create=False)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
        except OSError:
            _refuse_link(parent, name)
            raise
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            report(status, {"error": "not a regular file"})
            return
        if info.st_size > int(req["limit"]):
            report(status, {"error": f"{info.st_size} bytes: over the limit of {req['limit']}",
                             "too_large": True})
            return
        report(status, {"size": info.st_size})
        os.set_blocking(fd, True)
        left = info.st_size
        while left > 0 and (chunk := os.read(fd, min(_CHUNK, left))):
            left -= len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(data, view):]
    except (OSError, ValueError, KeyError) as exc:
        report(status, {"error": _said(exc)})


def _said(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc) if isinstance(exc, ValueError) else f"missing field {exc}"

