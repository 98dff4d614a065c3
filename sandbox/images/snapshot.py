"""A sandbox's overlayfs upper directory copied into a new layer, and the layer's id.

The upper directory is the sandbox's work: files owned by its uid, perhaps setuid, symlinks
pointing anywhere, whiteouts (character devices 0/0) and opaque directories
(`trusted.overlay.opaque=y`). The copy walks it by descriptors and never follows a link:
ownership becomes 0:0 (made by root), setuid and setgid are dropped (the sticky bit stays),
whiteouts and opaque directories are kept, symlinks are copied as links, hard links become
separate files (each counted against the layer's bytes), and other devices, FIFOs and
sockets are skipped. A file overlayfs marked as metacopy (data elsewhere) or a directory with
a redirect is refused: the copy would be wrong.

The layer's id is "sha256:" of a canonical description of its content, computed while copying:
a sorted walk hashing each entry's path, type, mode, link target, and its file's size and
sha256. Ownership and mtimes are not part of it (ownership is always 0:0), so the same content
gets the same id and is stored once.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from ..guest.tarout import xattr
from .errors import ImageError
from .unpack import OPAQUE_XATTR

MAX_DEPTH = 256
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20
_REFUSED_XATTRS = ("trusted.overlay.metacopy", "trusted.overlay.redirect")


def copy_upper(upper: Path, dest: Path, *, max_bytes: int, max_entries: int
               ) -> tuple[str, int]:
    """Copy the upper directory `upper` into the empty directory `dest`; returns the layer's
    id and the bytes of its regular files. Past `max_bytes` written (every name of a file
    counted, as each becomes a copy; a sparse file's whole length, as its holes are written)
    or `max_entries` entries, ImageError: a sandbox's small scratch disk could otherwise
    become a host disk full of copies (a 10 TiB sparse file costs its tmpfs nothing; found by
    review)."""
    try:
        source = os.open(upper, _DIR_FLAGS)
    except OSError as exc:
        raise ImageError(f"snapshot of {upper}: cannot open it ({exc.strerror})") from None
    target = os.open(dest, _DIR_FLAGS)
    walk = _Walk(upper, max_bytes, max_entries)
    try:
        walk.directory(source, target, b"", 0)
        os.fchmod(target, 0o755)
    except OSError as exc:
        raise ImageError(f"snapshot of {upper}: {walk.at!r}: {exc.strerror or exc}") from None
    finally:
        os.close(source)
        os.close(target)
    return "sha256:" + walk.hash.hexdigest(), walk.size


class _Walk:
    def __init__(self, upper: Path, max_bytes: int, max_entries: int) -> None:
        self.upper, self.max_bytes, self.max_entries = upper, max_bytes, max_entries
        self.entries = 0
        self.hash = hashlib.sha256()
        self.size = 0
        self.at = ""
        self._buffer = bytearray(_CHUNK)

    def _record(self, *fields: bytes) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise self._refuse(f"more than {self.max_entries} entries (max_layer_entries)")
        for value in fields:
            self.hash.update(len(value).to_bytes(8, "big"))
            self.hash.update(value)

    def _refuse(self, reason: str) -> ImageError:
        return ImageError(f"snapshot of {self.upper}: {self.at!r}: {reason}")

    def directory(self, source: int, target: int, path: bytes, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self._refuse(f"nested more than {MAX_DEPTH} directories deep")
        for name in sorted(os.listdir(source), key=os.fsencode):
            entry = path + b"/" + os.fsencode(name)
            self.at = os.fsdecode(entry)
            st = os.stat(name, dir_fd=source, follow_symlinks=False)
            mode = st.st_mode & 0o1777
            times = (st.st_atime_ns, st.st_mtime_ns)
            if stat.S_ISDIR(st.st_mode):
                self._subdirectory(source, target, name, entry, mode=mode, times=times,
                                   depth=depth)
            elif stat.S_ISREG(st.st_mode):
                self._file(source, target, name, entry, mode=mode, times=times)
            elif stat.S_ISLNK(st.st_mode):
                link = os.readlink(name, dir_fd=source)
                os.symlink(link, name, dir_fd=target)
                os.utime(name, ns=times, dir_fd=target, follow_symlinks=False)
                self._record(b"l", entry, os.fsencode(link))
            elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                os.mknod(name, stat.S_IFCHR, os.makedev(0, 0), dir_fd=target)
                self._record(b"w", entry)
            # other devices, FIFOs and sockets: not part of a layer

    def _subdirectory(self, source: int, target: int, name: str, entry: bytes, *,
                      mode: int, times: tuple[int, int], depth: int) -> None:
        inner = os.open(name, _DIR_FLAGS, dir_fd=source)
        try:
            xattrs = os.listxattr(inner)
            if any(x in xattrs for x in _REFUSED_XATTRS):
                raise self._refuse("an overlayfs redirect (mount without redirect_dir)")
            opaque = OPAQUE_XATTR in xattrs and xattr(inner, OPAQUE_XATTR) == b"y"
            os.mkdir(name, 0o700, dir_fd=target)
            copy = os.open(name, _DIR_FLAGS, dir_fd=target)
            try:
                if opaque:
                    os.setxattr(copy, OPAQUE_XATTR, b"y")
                self._record(b"d", entry, b"%o" % mode, b"o" if opaque else b"")
                self.directory(inner, copy, entry, depth + 1)
                os.fchmod(copy, mode)
                os.utime(copy, ns=times)
            finally:
                os.close(copy)
        finally:
            os.close(inner)

    def _file(self, source: int, target: int, name: str, entry: bytes, *, mode: int,
              times: tuple[int, int]) -> None:
        fd = os.open(name, _READ_FLAGS, dir_fd=source)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._refuse("changed from a regular file while being copied")
            if self.size + st.st_size > self.max_bytes:
                raise self._over()
            if "trusted.overlay.metacopy" in os.listxattr(fd):
                raise self._refuse("an overlayfs metacopy file (mount without metacopy)")
            out = os.open(name, _WRITE_FLAGS, 0o600, dir_fd=target)
            try:
                digest, size = self._copy(fd, out)
                os.fchmod(out, mode)
                os.utime(out, ns=times)
            finally:
                os.close(out)
        finally:
            os.close(fd)
        self.size += size
        self._record(b"f", entry, b"%o" % mode, b"%d" % size, digest)

    def _copy(self, source: int, target: int) -> tuple[bytes, int]:
        digest = hashlib.sha256()
        view = memoryview(self._buffer)
        size = 0
        with open(source, "rb", buffering=0, closefd=False) as f:
            while n := f.readinto(view):
                digest.update(view[:n])
                done = 0
                while done < n:
                    done += os.write(target, view[done:n])
                size += n
                if self.size + size > self.max_bytes:  # grown since its size was looked at
                    raise self._over()
        return digest.digest(), size

    def _over(self) -> ImageError:
        return self._refuse(f"its files come to more than {self.max_bytes} bytes copied "
                            "(max_layer_bytes; a sparse file counts its whole length, a hard "
                            "link each name)")

