"""watch: a directory's changes as they happen, from inotify inside the sandbox, as the
sandbox's uid, in a shim that runs until it is killed (the daemon kills it when its caller
leaves) or its reader is gone.

Each directory is watched by its own descriptor, never by a path: the walk to it is
`fsops.open_child`'s (never through a link), the shim moves into it (fchdir) and watches "."
with IN_DONT_FOLLOW | IN_ONLYDIR, so no link planted on the way can turn the watch elsewhere.
Recursive: a directory made or moved in below is watched as it appears, and what it already
holds by then is said as created (nothing made between its creation and its watch is missed).

The events, one JSON object a line on the events descriptor, paths relative to /workspace:
`create`, `modify`, `chmod`, `delete`, `rename` (`from`: when both ends of the move were seen
together; else a move out is a `delete` and a move in a `create`), each with `dir`; `overflow`
when the kernel's queue dropped events (the caller should look again), or with `path` and
`detail` a directory under the watch that is not watched (deeper than `MAX_DEPTH`, past
`MAX_WATCHED` or the kernel's own limit, gone or a link by the time it was opened), said as
the watch starts or when it appears, never dropped unsaid; the watched directory's
own removal or move is a last `delete` of it, and the watch ends. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import stat
import struct
from typing import Any

from .files import _said, open_child
from .fsops import MAX_DEPTH, open_dir
from .protocol import report

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x4000, 0x8000, 0x40000000
IN_ONLYDIR, IN_DONT_FOLLOW, IN_EXCL_UNLINK = 0x01000000, 0x02000000, 0x04000000
MASK = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)
MAX_WATCHED = 8192  # directories under one watch
_HEAD = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
_READ = 1 << 16
_PAIRING = 0.05  # seconds a move's first end waits for its second
_PAIRING_READS = 16


class _Gone(Exception):
    """The watch is over: its directory went, or its reader did."""


class Watcher:
    def __init__(self, root: str, recursive: bool, out: int) -> None:
        self.root, self.recursive, self.out = root, recursive, out
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_CLOEXEC)
        if self.fd < 0:
            raise _os_error("inotify")
        self.paths: dict[int, str] = {}  # watch descriptor -> its directory's path
        found: list[dict[str, Any]] = []
        fd = open_dir(root)
        try:
            self.root_wd = self._add(fd, root, 0, found)
        finally:
            os.close(fd)
        # What is there at the start is not said, but what of it is not watched is.
        self.unwatched = [e for e in found if e["event"] == "overflow"]

    def _add(self, fd: int, path: str, depth: int, found: list[dict[str, Any]]) -> int:
        """Watch the directory `fd` (at `path`), and below it if recursive; what it holds is
        appended to `found` as created."""
        if len(self.paths) >= MAX_WATCHED:
            raise ValueError(f"over {MAX_WATCHED} directories to watch")
        os.fchdir(fd)
        wd: int = self._libc.inotify_add_watch(self.fd, b".", MASK)
        if wd < 0:
            raise _os_error(path or "the workspace")
        self.paths[wd] = path
        for name in os.listdir(fd):  # after the watch: nothing made since is missed
            child = _join(path, name)
            try:
                is_dir = stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
            except OSError:
                continue
            found.append({"event": "create", "path": child, "dir": is_dir})
            if is_dir and self.recursive:
                self._add_below(fd, name, child, depth + 1, found)
        return wd

    def _add_below(self, parent: int, name: str, path: str, depth: int,
                   found: list[dict[str, Any]]) -> None:
        """The directory `name` of `parent` watched too; if it cannot be, an overflow with
        its path says so (the caller must look there itself)."""
        try:
            _within(depth)
            sub = open_child(parent, name)
            try:
                self._add(sub, path, depth, found)
            finally:
                os.close(sub)
        except (OSError, ValueError) as exc:  # over a limit, gone, or a link by now
            found.append({"event": "overflow", "path": path, "detail": _said(exc)})

    def _watch_new(self, path: str) -> list[dict[str, Any]]:
        """A directory that appeared under the watch: watched too, its content said."""
        found: list[dict[str, Any]] = []
        # Its depth below the watched directory ("" is the workspace, at 0 as any root is).
        depth = path.count("/") + 1 - (self.root.count("/") + 1 if self.root else 0)
        try:
            _within(depth)
            fd = open_dir(path)
            try:
                self._add(fd, path, depth, found)
            finally:
                os.close(fd)
        except (OSError, ValueError) as exc:
            # Not watched (gone again, or over a limit): the caller must look for itself.
            found.append({"event": "overflow", "path": path, "detail": _said(exc)})
        return found

    def _forget(self, prefix: str) -> None:
        """Stop watching what was under `prefix` (moved out of the watch)."""
        for wd, path in list(self.paths.items()):
            if path == prefix or path.startswith(prefix + "/"):
                self._libc.inotify_rm_watch(self.fd, wd)
                del self.paths[wd]

    def _moved(self, old: str, new: str) -> None:
        for wd, path in self.paths.items():
            if path == old or path.startswith(old + "/"):
                self.paths[wd] = new + path[len(old):]

    def run(self) -> None:
        with contextlib.suppress(_Gone):
            self._send(self.unwatched)
            while True:
                said: list[dict[str, Any]] = []
                moving: dict[int, tuple[int, str, bool]] = {}  # cookie -> (said[i], path, dir)
                self._events(os.read(self.fd, _READ), said, moving)
                # A move's two ends may come in two reads: its other end is waited for a
                # moment (and a few reads at most) before it is said as a delete.
                for _ in range(_PAIRING_READS):
                    if not moving or not select.select([self.fd], [], [], _PAIRING)[0]:
                        break
                    self._events(os.read(self.fd, _READ), said, moving)
                for _, path, is_dir in moving.values():  # moved out of the watch
                    if is_dir:
                        self._forget(path)
                self._send(said)

    def _events(self, data: bytes, said: list[dict[str, Any]],
                moving: dict[int, tuple[int, str, bool]]) -> None:
        offset = 0
        while offset + _HEAD.size <= len(data):
            wd, mask, cookie, size = _HEAD.unpack_from(data, offset)
            raw = data[offset + _HEAD.size:offset + _HEAD.size + size]
            offset += _HEAD.size + size
            if mask & IN_Q_OVERFLOW:
                said.append({"event": "overflow"})
                continue
            base = self.paths.get(wd)
            if base is None:
                continue
            name = raw.split(b"\0", 1)[0].decode(errors="surrogateescape")
            if mask & IN_IGNORED:
                del self.paths[wd]
            if not name:  # the directory itself: only the watched one's end is said
                if wd == self.root_wd and mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                    said.append({"event": "delete", "path": self.root, "dir": True})
                    self._send(said)
                    raise _Gone
                continue
            path, is_dir = _join(base, name), bool(mask & IN_ISDIR)
            if mask & IN_CREATE:
                said.append({"event": "create", "path": path, "dir": is_dir})
                if is_dir and self.recursive:
                    said += self._watch_new(path)
            elif mask & IN_MODIFY:
                said.append({"event": "modify", "path": path, "dir": is_dir})
            elif mask & IN_ATTRIB:
                said.append({"event": "chmod", "path": path, "dir": is_dir})
            elif mask & IN_DELETE:
                said.append({"event": "delete", "path": path, "dir": is_dir})
            elif mask & IN_MOVED_FROM:
                # A delete unless its other end follows in this read (then a rename).
                moving[cookie] = (len(said), path, is_dir)
                said.append({"event": "delete", "path": path, "dir": is_dir})
            elif mask & IN_MOVED_TO:
                if (pair := moving.pop(cookie, None)) is not None:
                    said[pair[0]] = {"event": "rename", "path": path, "from": pair[1],
                                     "dir": is_dir}
                    self._moved(pair[1], path)
                else:
                    said.append({"event": "create", "path": path, "dir": is_dir})
                    if is_dir and self.recursive:
                        said += self._watch_new(path)

    def _send(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        data = memoryview("".join(json.dumps(e) + "\n" for e in events).encode())
        try:
            while data:
                data = data[os.write(self.out, data):]
        except OSError:
            raise _Gone from None  # its reader left


def _within(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"deeper than {MAX_DEPTH} levels below the watched directory")


def _join(base: str, name: str) -> str:
    return f"{base}/{name}" if base else name


def _os_error(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code), what)


def watch(req: dict[str, Any], fds: list[int]) -> None:
    events, status = fds
    try:
        watcher = Watcher(str(req["path"]), bool(req["recursive"]), events)
    except (OSError, ValueError, KeyError) as exc:
        report(status, {"error": _said(exc)})
        return
    report(status, {"ok": True, "watching": len(watcher.paths)})
    watcher.run()
