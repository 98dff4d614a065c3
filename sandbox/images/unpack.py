"""The unpacker: one untrusted layer (a tar stream) into a fresh directory, in overlayfs
lower-layer format, with nothing written or read outside that directory.

Why our own, and not umoci, tar(1) or tarfile's extractall: a layer is hostile input, and we
need all of these at once, which none of them gives. A cap on decompressed bytes and on members,
counted while reading, so a gzip bomb is stopped early; the layer's diff_id verified on the
stream as it is unpacked (no second pass, no whole blob in memory); a refusal that names the
member and the reason; setuid, setgid, file capabilities (`SCHILY.xattr.*`) and ownership never
carried over; whiteouts written as overlayfs wants them (a 0/0 character device, the
`trusted.overlay.opaque` xattr). umoci has none of the caps and runs as a separate program.

The rules (docs/sandbox.md, "Images: the store and the unpacker"):

- every path is walked from the destination's descriptor, one component at a time with
  O_DIRECTORY|O_NOFOLLOW: a member whose parent goes through a symlink (or a non-directory) is
  refused; files are created O_CREAT|O_EXCL|O_NOFOLLOW; nothing is ever followed;
- refused: absolute names, `..` components, NUL in a name or link, device nodes, FIFOs, sparse
  files, unknown types, hard links to anything but a regular file this layer already extracted,
  more than `max_entries` members, more than `max_bytes` decompressed, a name or link header
  over 1 MiB;
- symlinks are made with their target as written: it means something inside the sandbox's
  root at run time and is never followed here;
- a later member replaces an earlier one of the same name (a directory stays a directory when
  the later one is a directory too; a non-empty directory replaced by a non-directory is
  refused; an empty one is removed first);
- owner 0:0 (made by root, in a directory with no setgid bit), mode masked with 0o1777 (setuid
  and setgid dropped, the sticky bit kept), PAX xattrs ignored, mtimes from the tar;
- `.wh.NAME` becomes a character device 0/0 named NAME; `.wh..wh..opq` sets
  `trusted.overlay.opaque=y` on its directory; other `.wh..wh.` names (aufs' bookkeeping)
  are skipped.

The caller removes the destination on any refusal (`store.py` unpacks into its own temporary
directory and renames into place only a layer that passed).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import stat
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import zstandard

from ..guest.tarball import REGULAR, Member, Refused, copy, mtime_of
from ..guest.tarball import parts as member_parts
from .errors import ImageError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
OPAQUE_XATTR = "trusted.overlay.opaque"
_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class Unpacked:
    """A layer unpacked: its diff_id (the uncompressed stream's sha256), the bytes of its
    regular files and its number of members."""

    diff_id: str
    size: int
    entries: int


class Meter:
    """The decompressed stream: counted against the cap as it is read, and hashed."""

    def __init__(self, source: Readable, limit: int, what: str) -> None:
        self.source, self.limit, self.what = source, limit, what
        self.count = 0
        self._hash = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        want = _CHUNK if size is None or size < 0 else min(size, _CHUNK)
        try:
            data = self.source.read(want)
        except (OSError, EOFError, zlib.error) as exc:
            raise ImageError(f"{self.what}: cannot be decompressed ({exc})") from None
        self.count += len(data)
        if self.count > self.limit:
            raise ImageError(f"{self.what}: over {self.limit} bytes uncompressed "
                             "(max_layer_bytes); refused")
        self._hash.update(data)
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass

    @property
    def digest(self) -> str:
        return "sha256:" + self._hash.hexdigest()


def unpack_blob(blob: Readable, compression: str, dest: Path, *, max_bytes: int,
                max_entries: int, what: str) -> Unpacked:
    """Unpack a layer blob (`compression` "", "gzip" or "zstd") into the empty directory
    `dest`; the whole uncompressed stream is read, so `.diff_id` covers it. Both decompress as
    they are read: the byte cap stops a bomb of either early."""
    source: Readable = blob
    if compression == "gzip":
        source = gzip.GzipFile(fileobj=blob, mode="rb")  # type: ignore[call-overload]
    elif compression == "zstd":
        # zstandard is ours already (the proxy scrubs zstd-encoded answers with it).
        source = zstandard.ZstdDecompressor().stream_reader(
            blob, read_across_frames=True)  # type: ignore[arg-type]  # any .read(n) will do
    elif compression:
        raise ImageError(f"{what}: {compression} compression is not supported")
    meter = Meter(source, max_bytes, what)
    size, entries = unpack(meter, dest, max_entries=max_entries, what=what)
    meter.drain()
    return Unpacked(meter.digest, size, entries)


def unpack(stream: Readable, dest: Path, *, max_entries: int, what: str) -> tuple[int, int]:
    """Extract the tar `stream` into the empty directory `dest` by the rules above; returns
    (bytes of regular files, members). Raises ImageError naming the member on a refusal."""
    root = os.open(dest, _DIR_FLAGS)
    out = _Extractor(root, what)
    entries = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|",  # type: ignore[call-overload]
                          tarinfo=Member) as tar:
            while True:
                member = tar.next()
                if member is None:
                    break
                tar.members.clear()  # stream mode keeps every header otherwise
                entries += 1
                if entries > max_entries:
                    raise ImageError(f"{what}: more than {max_entries} members "
                                     "(max_layer_entries); refused")
                out.member(member, tar)
        out.finish()
    except (ImageError, Refused) as exc:  # Refused: an oversized header (`Member`)
        if str(exc).startswith(what):
            raise
        raise ImageError(f"{what}: {exc}") from None
    except tarfile.TarError as exc:
        raise ImageError(f"{what}: not a valid tar stream ({exc})") from None
    finally:
        out.close()
    return out.size, entries


def parts(name: str, what: str) -> tuple[str, ...]:
    """A member name's components (the guest unpacker's rule, one for both), its refusal an
    ImageError naming `what`."""
    try:
        return member_parts(name)
    except Refused as exc:
        raise ImageError(f"{what}: {exc}") from None


@dataclass
class _Extractor:
    root: int
    what: str
    size: int = 0
    dirs: dict[tuple[str, ...], tuple[int, float | None]] = field(default_factory=dict)
    _cached: tuple[tuple[str, ...], int] | None = None

    def member(self, m: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        name = m.name
        try:
            self._member(m, tar, parts(name, self.what))
        except OSError as exc:
            raise ImageError(f"{self.what}: member {name!r}: {exc.strerror or exc}") from None
        except (ValueError, OverflowError) as exc:
            raise ImageError(f"{self.what}: member {name!r}: {exc}") from None

    def _refuse(self, m: tarfile.TarInfo, reason: str) -> ImageError:
        return ImageError(f"{self.what}: member {m.name!r}: {reason}")

    def _member(self, m: tarfile.TarInfo, tar: tarfile.TarFile, comps: tuple[str, ...]) -> None:
        if m.ischr() or m.isblk():
            raise self._refuse(m, "a device node")
        if m.isfifo():
            raise self._refuse(m, "a FIFO")
        if m.type == tarfile.GNUTYPE_SPARSE or m.sparse is not None:
            raise self._refuse(m, "a sparse file (not supported)")
        if not (m.isdir() or m.type in REGULAR or m.issym() or m.islnk()):
            raise self._refuse(m, f"unknown member type {m.type!r}")
        if "\x00" in m.linkname:
            raise self._refuse(m, "a NUL in its link target")
        if not comps:
            if m.isdir():
                return  # the layer's root: it stays 0755
            raise self._refuse(m, "a non-directory at the layer's root")
        base, parent_parts = comps[-1], comps[:-1]
        if base.startswith(WHITEOUT):
            self._whiteout(m, base, parent_parts)
            return
        mtime = mtime_of(m.mtime)
        mode = m.mode & 0o1777
        if m.islnk():  # found before anything of the destination is touched
            source_dir, source_name = self._link_source(m)
            try:
                parent = self._dir(m, parent_parts, create=True)
                self._clear(m, parent, base)
                os.link(source_name, base, src_dir_fd=source_dir, dst_dir_fd=parent,
                        follow_symlinks=False)
            finally:
                os.close(source_dir)
            return
        parent = self._dir(m, parent_parts, create=True)
        if m.isdir():
            try:
                existing = os.stat(base, dir_fd=parent, follow_symlinks=False).st_mode
            except FileNotFoundError:
                existing = 0
            if not stat.S_ISDIR(existing):
                self._clear(m, parent, base)
                os.mkdir(base, 0o700, dir_fd=parent)
            self.dirs[comps] = (mode, mtime)
            return
        self._clear(m, parent, base)
        if m.issym():
            os.symlink(m.linkname, base, dir_fd=parent)
            os.utime(base, (mtime, mtime), dir_fd=parent, follow_symlinks=False)
            return
        fd = os.open(base, _FILE_FLAGS, 0o600, dir_fd=parent)
        try:
            source = tar.extractfile(m)
            if source is not None:
                copy(source, fd, _CHUNK)
            os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)
        self.size += m.size

    def _whiteout(self, m: tarfile.TarInfo, base: str, parent_parts: tuple[str, ...]) -> None:
        if base == OPAQUE:
            os.setxattr(self._dir(m, parent_parts, create=True), OPAQUE_XATTR, b"y")
            return
        if base.startswith(WHITEOUT + WHITEOUT):
            return  # aufs' own bookkeeping (.wh..wh.plnk, .wh..wh.aufs): not content
        hidden = base[len(WHITEOUT):]
        if hidden in ("", ".", ".."):
            raise self._refuse(m, f"a whiteout of {hidden!r}")
        parent = self._dir(m, parent_parts, create=True)
        self._clear(m, parent, hidden)
        os.mknod(hidden, stat.S_IFCHR, os.makedev(0, 0), dir_fd=parent)

    def _link_source(self, m: tarfile.TarInfo) -> tuple[int, str]:
        """The hard link's target, as (its directory's descriptor, its name): only a regular
        file this layer extracted."""
        target = parts(m.linkname, f"{self.what}: member {m.name!r}: hard link")
        if not target:
            raise self._refuse(m, "a hard link to the layer's root")
        directory = self._dir(m, target[:-1], create=False, cache=False)
        try:
            mode = os.stat(target[-1], dir_fd=directory, follow_symlinks=False).st_mode
        except FileNotFoundError:
            mode = 0
        if not stat.S_ISREG(mode):
            os.close(directory)
            raise self._refuse(m, f"a hard link to {m.linkname!r}, not a regular file this "
                                  "layer extracted")
        return directory, target[-1]

    def _dir(self, m: tarfile.TarInfo, comps: tuple[str, ...], *, create: bool,
             cache: bool = True) -> int:
        """A descriptor of the directory `comps` under the root, walked without following
        anything; missing directories made if `create`. A cached descriptor is the
        extractor's (the caller must not close it); an uncached one is the caller's."""
        if cache and self._cached is not None and self._cached[0] == comps:
            return self._cached[1]
        current = self.root
        try:
            for i, comp in enumerate(comps):
                try:
                    nxt = os.open(comp, _DIR_FLAGS, dir_fd=current)
                except FileNotFoundError:
                    if not create:
                        raise self._refuse(m, f"{'/'.join(comps[:i + 1])} does not exist") \
                            from None
                    os.mkdir(comp, 0o700, dir_fd=current)
                    self.dirs.setdefault(comps[:i + 1], (0o755, None))
                    nxt = os.open(comp, _DIR_FLAGS, dir_fd=current)
                except OSError as exc:
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    kind = os.stat(comp, dir_fd=current, follow_symlinks=False).st_mode
                    where = "/".join(comps[:i + 1])
                    raise self._refuse(m, f"its path goes through the symlink {where!r}"
                                       if stat.S_ISLNK(kind) else
                                       f"its path goes through {where!r}, not a directory") \
                        from None
                if current != self.root:
                    os.close(current)
                current = nxt
        except BaseException:
            if current != self.root:
                os.close(current)
            raise
        if cache:
            self._drop_cache()
            self._cached = (comps, current)
        elif current == self.root:
            current = os.dup(self.root)
        return current

    def _clear(self, m: tarfile.TarInfo, parent: int, name: str) -> None:
        """Make way for a new `name` in `parent`: an earlier member of that name removed (an
        empty directory only)."""
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(mode):
            os.unlink(name, dir_fd=parent)
            return
        try:
            os.rmdir(name, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise self._refuse(m, "it would replace a non-empty directory") from None
            raise
        # The cached descriptor, if any, is `parent` itself: an empty directory below it
        # holds no directory of ours that could be cached.

    def finish(self) -> None:
        """Directories' modes and mtimes, deepest first, once nothing more is made in them."""
        self._drop_cache()
        for comps, (mode, mtime) in sorted(self.dirs.items(), key=lambda kv: -len(kv[0])):
            try:
                fd = self._dir(_ROOT_MEMBER, comps, create=False, cache=False)
            except ImageError:
                continue  # replaced later by a non-directory
            try:
                os.fchmod(fd, mode)
                if mtime is not None:
                    os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)
        os.fchmod(self.root, 0o755)

    def _drop_cache(self) -> None:
        if self._cached is not None:
            if self._cached[1] != self.root:
                os.close(self._cached[1])
            self._cached = None

    def close(self) -> None:
        self._drop_cache()
        os.close(self.root)


_ROOT_MEMBER = tarfile.TarInfo(".")
