"""A directory of the workspace out as a tar stream, as the sandbox's uid, run by the agent's
shims (`shim`); its way in is `tarball`'s. Standard library only.

`tar`: the directory's entries, walked as `tarball` walks (`fsops.open_child`, never following a
link): directories, regular files (exactly the size they had when opened) and symlinks (as
links); FIFOs, sockets and devices are never opened and not in the stream. Its status says `ok`
before the stream and `done` after its end-of-archive; a failure on the way (a directory it may
not read, a file that shrank) ends the stream with no end-of-archive and says `error` instead,
so that the daemon cuts its answer rather than pass part of the directory as the whole.

`layer`: the microVM's image root as a layer (its snapshot), run by its guest agent as the
guest's root: the overlay's upper directory (what the sandbox wrote over its image, in the
guest's memory) with overlayfs's marks turned into the OCI layer format's (a whiteout, a 0/0
character device, becomes an empty `.wh.NAME`; an opaque directory gets `.wh..wh..opq`), and
in place of the upper's /workspace (a mount point there) the workspace itself. A directory
overlayfs redirected or a file it only copied the metadata of cannot be carried: refused, as
the host's copy of an upper refuses them (`sandbox.images.snapshot`). The host trusts none of
it: it unpacks the stream with the image unpacker's rules and caps.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import tarfile
from collections.abc import Callable
from typing import Any

from .files import _said, open_child
from .fsops import MAX_DEPTH, open_dir
from .protocol import WORKSPACE, report

UPPER = "/mnt/rw/upper"  # the image root's overlay upper directory in the guest (`vmroot`)
_WHITEOUT, _OPAQUE = ".wh.", ".wh..wh..opq"
_OPAQUE_XATTR = "trusted.overlay.opaque"
_REFUSED_XATTRS = ("trusted.overlay.redirect", "trusted.overlay.metacopy")


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
    try:
        root = open_dir(str(req["path"]))
    except (OSError, ValueError, KeyError) as exc:
        report(fds[-1], {"error": _said(exc)})
        return
    _stream(fds, lambda archive: _pack(archive, root, "", 0))


def layer(_: dict[str, Any], fds: list[int]) -> None:
    try:
        upper = os.open(UPPER, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        workspace = os.open(WORKSPACE, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        report(fds[-1], {"error": _said(exc)})
        return

    def pack(archive: tarfile.TarFile) -> None:
        _pack(archive, upper, "", 0, layer=True, skip=WORKSPACE.strip("/"))
        top = tarfile.TarInfo(WORKSPACE.strip("/"))
        top.type, top.mode = tarfile.DIRTYPE, 0o755
        archive.addfile(top)
        # Opaque: the workspace is exactly what it holds now, nothing of a lower layer's.
        opaque = tarfile.TarInfo(f"{top.name}/{_OPAQUE}")
        opaque.mode = 0o644
        archive.addfile(opaque)
        _pack(archive, workspace, f"{top.name}/", 1)

    _stream(fds, pack)


def _stream(fds: list[int], pack: Callable[[tarfile.TarFile], None]) -> None:
    data, status = fds
    report(status, {"ok": True})
    # Past the first status, a failure can only cut the stream short: an exception leaves
    # tarfile's end-of-archive unwritten, and the last status says it was cut.
    try:
        with os.fdopen(data, "wb", closefd=False) as out, \
                tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
            pack(archive)
    except (OSError, ValueError) as exc:
        report(status, {"error": f"cut short: {_said(exc)}"})
        return
    report(status, {"done": True})


def _pack(archive: tarfile.TarFile, parent: int, prefix: str, depth: int, *,
          layer: bool = False, skip: str = "") -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"deeper than {MAX_DEPTH} levels")
    if layer and xattr(parent, _OPAQUE_XATTR) == b"y":
        opaque = tarfile.TarInfo(prefix + _OPAQUE)
        opaque.mode = 0o644
        archive.addfile(opaque)
    for name in sorted(os.listdir(parent)):
        if name == skip:
            continue
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
                if layer:
                    _refuse_marks(child, member.name)
                _pack(archive, child, f"{prefix}{name}/", depth + 1, layer=layer)
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
                    if layer:
                        _refuse_marks(fd, member.name)
                    member.size = opened.st_size
                    archive.addfile(member, _Exactly(fd, opened.st_size))
            finally:
                os.close(fd)
        elif layer and stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
            whiteout = tarfile.TarInfo(prefix + _WHITEOUT + name)
            whiteout.mode, whiteout.mtime = 0o644, member.mtime
            archive.addfile(whiteout)
        # FIFOs, sockets and devices: never opened, not in the stream.


def xattr(fd: int, name: str) -> bytes:
    """An extended attribute's value; empty if it is not there (or not supported)."""
    try:
        return os.getxattr(fd, name)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP):
            return b""
        raise


def _refuse_marks(fd: int, path: str) -> None:
    if any(xattr(fd, name) for name in _REFUSED_XATTRS):
        raise ValueError(f"{path}: overlayfs redirected it or copied only its metadata")
