"""A directory of the workspace out as a tar stream, as the sandbox's uid, run by the agent's
shims (`shim`); its way in is `tarball`'s. Standard library only.

`tar`: the directory's entries, walked as `tarball` walks (`fsops.open_child`, never following a
link): directories, regular files (exactly the size they had when opened) and symlinks (as
links); FIFOs, sockets and devices are never opened and not in the stream. Its status says `ok`
before the stream and `done` after its end-of-archive; a failure on the way (a directory it may
not read, a file that shrank) ends the stream with no end-of-archive and says `error` instead,
so that the daemon cuts its answer rather than pass part of the directory as the whole.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import tarfile
from typing import Any

from .files import _said, open_child
from .fsops import MAX_DEPTH, open_dir
from .protocol import report


class _Exactly(io.RawIOBase):
    """A file's bytes, exactly `size` of them (the tar header said `size`): cut if it grew
    since it was opened; if it shrank, an OSError (the stream is cut: never zeros passed off
    as its content)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.left = fd, size

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        want = self.left if size is None or size < 0 else min(size, self.left)
        got = b""
        while len(got) < want and (chunk := os.read(self.fd, want - len(got))):
            got += chunk
        if len(got) < want:
            raise OSError(errno.EIO, "a file shrank while it was sent")
        self.left -= want
        return got


def tar(req: dict[str, Any], fds: list[int]) -> None:
    data, status = fds
    try:
        root = open_dir(str(req["path"]))
    except (OSError, ValueError, KeyError) as exc:
        report(status, {"error": _said(exc)})
        return
    report(status, {"ok": True})
    # Past the first status, a failure can only cut the stream short: an exception leaves
    # tarfile's end-of-archive unwritten, and the last status says it was cut.
    try:
        with os.fdopen(data, "wb", closefd=False) as out, \
                tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
            _pack(archive, root, "", 0)
    except (OSError, ValueError) as exc:
        report(status, {"error": f"cut short: {_said(exc)}"})
        return
    report(status, {"done": True})


def _pack(archive: tarfile.TarFile, parent: int, prefix: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"deeper than {MAX_DEPTH} levels")
    for name in sorted(os.listdir(parent)):
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            continue
        member = tarfile.TarInfo(prefix + name)
        member.mode, member.mtime = stat.S_IMODE(info.st_mode), int(info.st_mtime)
        if stat.S_ISDIR(info.st_mode):
            member.type = tarfile.DIRTYPE
            archive.addfile(member)
            child = open_child(parent, name)
            try:
                _pack(archive, child, f"{prefix}{name}/", depth + 1)
            finally:
                os.close(child)
        elif stat.S_ISLNK(info.st_mode):
            member.type, member.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=parent)
            archive.addfile(member)
        elif stat.S_ISREG(info.st_mode):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=parent)
            try:
                opened = os.fstat(fd)
                if stat.S_ISREG(opened.st_mode):  # still a file, not what replaced it
                    member.size = opened.st_size
                    archive.addfile(member, _Exactly(fd, opened.st_size))
            finally:
                os.close(fd)
        # FIFOs, sockets and devices: never opened, not in the stream.
