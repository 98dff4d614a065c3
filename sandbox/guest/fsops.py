"""list, stat, mkdir, remove and rename in the workspace, as the sandbox's uid, run by the
agent's shims like put and get (`files`): every path walked from /workspace by `files._walk`,
which never follows a symbolic link; an entry is acted on by its name in its directory's
descriptor, so a link is listed, removed or renamed as the link itself, never followed.
"" names the workspace itself where a directory is wanted (list, stat); it is never removed
or renamed. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Callable, Iterator
from typing import Any

from .files import DIR_FLAGS, _said, _walk, open_child
from .protocol import WORKSPACE, report

MAX_DEPTH = 256  # a recursive remove's (each level holds a descriptor)


def open_dir(path: str, create: bool = False) -> int:
    """A descriptor of the directory `path` ("" the workspace), never through a link; made,
    with its parents, when `create`."""
    if path == "":
        return os.open(WORKSPACE, DIR_FLAGS)
    parent, name = _walk(path, create=create)
    try:
        return open_child(parent, name, create)
    finally:
        os.close(parent)


def kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "symlink" if stat.S_ISLNK(mode) else "other"  # a FIFO, socket or device


def entry(parent: int, name: str, path: str) -> dict[str, Any]:
    """What a caller sees of one entry, looked at and never followed."""
    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    said: dict[str, Any] = {
        "name": name, "path": path, "type": kind(info.st_mode), "size": info.st_size,
        "mode": stat.S_IMODE(info.st_mode), "mtime": round(info.st_mtime, 3),
    }
    if stat.S_ISLNK(info.st_mode):
        with contextlib.suppress(OSError):
            said["target"] = os.readlink(name, dir_fd=parent)
    return said


def _answer(status: int, work: Callable[[dict[str, Any]], dict[str, Any]],
            req: dict[str, Any]) -> None:
    """Run one op; its answer, or its error in words, on the status descriptor."""
    try:
        report(status, work(req))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        report(status, _error(exc))


def _error(exc: BaseException) -> dict[str, Any]:
    said: dict[str, Any] = {"error": _said(exc)}
    if isinstance(exc, OSError) and exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
        said["exists"] = True
    return said


def ls(req: dict[str, Any], fds: list[int]) -> None:
    """The entries of a directory, as JSON on the data descriptor after the status."""
    data, status = fds
    try:
        fd = open_dir(str(req["path"]))
        try:
            names = os.listdir(fd)
            if len(names) > int(req["limit"]):
                report(status, {"error": f"{len(names)} entries: over the limit of "
                                         f"{req['limit']}", "too_large": True})
                return
            prefix = f"{req['path']}/" if req["path"] else ""
            found = []
            for name in sorted(names):
                with contextlib.suppress(FileNotFoundError):  # gone since it was listed
                    found.append(entry(fd, name, prefix + name))
        finally:
            os.close(fd)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        report(status, _error(exc))
        return
    body = json.dumps(found).encode()
    report(status, {"size": len(body)})
    with contextlib.suppress(OSError):
        view = memoryview(body)
        while view:
            view = view[os.write(data, view):]


def _stat(req: dict[str, Any]) -> dict[str, Any]:
    path = str(req["path"])
    if path == "":
        fd = os.open(WORKSPACE, DIR_FLAGS)
        try:
            return {"entry": {**entry(fd, ".", ""), "name": ""}}
        finally:
            os.close(fd)
    parent, name = _walk(path, create=False)
    try:
        return {"entry": entry(parent, name, path)}
    finally:
        os.close(parent)


def _mkdir(req: dict[str, Any]) -> dict[str, Any]:
    path = str(req["path"])
    parent, name = _walk(path, create=bool(req["parents"]))
    try:
        try:
            os.mkdir(name, int(req["mode"]) & 0o777, dir_fd=parent)
        except FileExistsError:
            if not req["parents"]:
                raise
            # As mkdir -p: an existing directory is no error; a link or a file there is one.
            if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise
            return {"created": False}
        return {"created": True}
    finally:
        os.close(parent)


def _remove(req: dict[str, Any]) -> dict[str, Any]:
    path = str(req["path"])
    parent, name = _walk(path, create=False)
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        if not stat.S_ISDIR(mode):
            os.unlink(name, dir_fd=parent)  # a link goes itself, never what it names
        elif req["recursive"]:
            _remove_tree(parent, name, 0)
        else:
            os.rmdir(name, dir_fd=parent)
        return {"removed": True}
    finally:
        os.close(parent)


def _remove_tree(parent: int, name: str, depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise ValueError(f"{name[:255]!r}: deeper than {MAX_DEPTH} levels")
    fd = open_child(parent, name)
    try:
        for child in os.listdir(fd):
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.stat(child, dir_fd=fd, follow_symlinks=False).st_mode):
                    _remove_tree(fd, child, depth + 1)
                else:
                    os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def _rename(req: dict[str, Any]) -> dict[str, Any]:
    source, target = str(req["path"]), str(req["to"])
    if target == source or target.startswith(source + "/"):
        raise ValueError("a directory cannot be moved into itself")
    with _both(source, target) as (src_dir, src_name, dst_dir, dst_name):
        # rename(2) moves the entry itself (a link stays a link) and replaces a file or an
        # empty directory at the target, never writing through a link there.
        os.rename(src_name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
    return {"path": target}


@contextlib.contextmanager
def _both(source: str, target: str) -> Iterator[tuple[int, str, int, str]]:
    src_dir, src_name = _walk(source, create=False)
    try:
        dst_dir, dst_name = _walk(target, create=False)
        try:
            yield src_dir, src_name, dst_dir, dst_name
        finally:
            os.close(dst_dir)
    finally:
        os.close(src_dir)


def stat_op(req: dict[str, Any], fds: list[int]) -> None:
    _answer(fds[-1], _stat, req)


def mkdir(req: dict[str, Any], fds: list[int]) -> None:
    _answer(fds[-1], _mkdir, req)


def remove(req: dict[str, Any], fds: list[int]) -> None:
    _answer(fds[-1], _remove, req)


def rename(req: dict[str, Any], fds: list[int]) -> None:
    _answer(fds[-1], _rename, req)
