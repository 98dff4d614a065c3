"""A directory of the workspace in as a tar stream (out: `tarout`), as the sandbox's uid, run by
the agent's shims (`files`, `fsops`). Standard library only: the host's unpacker of image layers
(`sandbox/images/unpack.py`) cannot come into a sandbox, so this one keeps its rules for hostile
archives, tested against the same inputs (tests/sandboxd/test_files.py):

- every member is walked from the directory's descriptor without following anything
  (`fsops.open_child`): a member whose path goes through a symlink (one the archive made
  earlier, or one that was there) or a non-directory is refused; files are made
  O_CREAT|O_EXCL|O_NOFOLLOW;
- refused: absolute names, `..` components, NUL in a name or link, device nodes, FIFOs, sparse
  files, unknown types, hard links to anything but a regular file this archive made, a name (or
  a hard link's target) over `MAX_LEVELS` components, more than `max_entries` members, more
  than `max_bytes` of the (decompressed) stream, an extended header over 1 MiB;
- symlinks are made with their target as written: it means something inside the sandbox, with
  the sandbox's rights, and is never followed here (nor by get, put, tar or the fs ops);
- setuid and setgid are dropped; ownership is the sandbox's uid; PAX xattrs are ignored;
- all or nothing: the archive is unpacked into a staging directory beside its destination,
  which is merged in (renames: a later file replaces an earlier one, a directory merges into a
  directory, a non-empty directory is never replaced) only once the whole stream passed and a
  dry run of the merge found nothing to refuse. A refusal leaves the destination as it was.

Out: `tarout`.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import math
import os
import stat
import tarfile
import zlib
from typing import IO, Any

from .files import _said, open_child
from .fsops import MAX_DEPTH, _remove_tree, open_dir
from .protocol import report

MAX_HEADER = 1 << 20  # a PAX or GNU long-name header
# A member's components at most: each costs a walk from the staging root, and the staging
# directory (at depth 0 of fsops' bounded removal) must come away whole after a refusal.
MAX_LEVELS = MAX_DEPTH - 1
_CHUNK = 1 << 16
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
META = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
         tarfile.GNUTYPE_LONGLINK)


class Refused(ValueError):
    """The archive is hostile or over a cap: said with the member it is about."""


class _Meter(io.RawIOBase):
    """The (decompressed) stream, counted against its cap as it is read: a bomb stops early."""

    def __init__(self, source: IO[bytes] | gzip.GzipFile, limit: int) -> None:
        self.source, self.limit, self.count = source, limit, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(_CHUNK if size is None or size < 0 else min(size, _CHUNK))
        self.count += len(data)
        if self.count > self.limit:
            raise Refused(f"over {self.limit} bytes unpacked")
        return data


class _Rejoined(io.RawIOBase):
    """`head`, already read from `rest`, then the rest of it."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.rest.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class Member(tarfile.TarInfo):
    """A header that refuses an oversized PAX or long-name header before reading it whole
    (the image unpacker's too, `sandbox/images/unpack.py`)."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> Any:
        if self.type in META and self.size > MAX_HEADER:
            raise Refused(f"a {self.size}-byte extended header (over {MAX_HEADER})")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def untar(req: dict[str, Any], fds: list[int]) -> None:
    data, status = fds
    try:
        with os.fdopen(data, "rb", closefd=False) as raw:
            report(status, _untar(str(req["path"]), raw, int(req["max_bytes"]),
                                  int(req["max_entries"])))
    except Refused as exc:
        report(status, {"error": str(exc), "refused": True})
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        report(status, {"error": f"not a valid tar stream ({exc})", "refused": True})
    except (OSError, ValueError, KeyError) as exc:
        report(status, {"error": _said(exc)})


def _untar(path: str, raw: io.BufferedReader, max_bytes: int,
           max_entries: int) -> dict[str, Any]:
    target = open_dir(path, create=True)
    try:
        return {"path": path, **unpack_into(target, raw, max_bytes, max_entries)}
    finally:
        os.close(target)


def unpack_into(target: int, raw: io.BufferedReader, max_bytes: int,
                max_entries: int) -> dict[str, int]:
    """The tar (or gzipped tar) `raw` into the directory `target`, all or nothing; its regular
    files' bytes and its members. Refused raises Refused."""
    # Read, not peeked: a peek returns what is buffered, which from a pipe may be one byte.
    head = raw.read(2)
    whole = io.BufferedReader(_Rejoined(head, raw), _CHUNK)
    source: IO[bytes] | gzip.GzipFile = whole
    if head == b"\x1f\x8b":
        source = gzip.GzipFile(fileobj=whole, mode="rb")
    staging = f".sealgate-untar-{os.getpid()}"
    os.mkdir(staging, 0o700, dir_fd=target)
    try:
        stage = open_child(target, staging)
        try:
            out = _Extractor(stage)
            with tarfile.open(fileobj=_Meter(source, max_bytes), mode="r|",
                              tarinfo=Member) as tar:
                while (member := tar.next()) is not None:
                    tar.members.clear()  # type: ignore[attr-defined]  # stream mode keeps all
                    out.entries += 1
                    if out.entries > max_entries:
                        raise Refused(f"more than {max_entries} members")
                    out.member(member, tar)
            out.finish()
            _merge(stage, target, "", dry=True)
            _merge(stage, target, "", dry=False)
        finally:
            os.close(stage)
    finally:
        with contextlib.suppress(OSError, ValueError):
            _remove_tree(target, staging, 0)
    return {"size": out.size, "entries": out.entries}


def parts(name: str) -> tuple[str, ...]:
    """A member name's components, `./` and empty ones dropped; absolute names, `..`, NUL and
    more than MAX_LEVELS components refused (for the image unpacker too)."""
    if "\x00" in name:
        raise Refused(f"member {_shown(name)!r}: a NUL in its name")
    if name.startswith("/"):
        raise Refused(f"member {_shown(name)!r}: an absolute name")
    comps = tuple(c for c in name.split("/") if c not in ("", "."))
    if ".." in comps:
        raise Refused(f"member {_shown(name)!r}: a '..' component")
    if len(comps) > MAX_LEVELS:  # a hard link's target too: the same walk
        raise Refused(f"member {_shown(name)!r}: {len(comps)} levels deep (at most {MAX_LEVELS})")
    return comps


def _shown(name: str) -> str:
    return name if len(name) <= 255 else f"{name[:255]}..."  # a pax name has no bound


class _Extractor:
    def __init__(self, root: int) -> None:
        self.root = root
        self.size = self.entries = 0
        self.dirs: dict[tuple[str, ...], tuple[int, float]] = {}

    def member(self, m: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        try:
            self._member(m, tar, parts(m.name))
        except Refused:
            raise
        except (OSError, ValueError, OverflowError) as exc:
            raise Refused(f"member {m.name!r}: {_said(exc)}") from None

    def _member(self, m: tarfile.TarInfo, tar: tarfile.TarFile, comps: tuple[str, ...]) -> None:
        if m.ischr() or m.isblk():
            raise _refuse(m, "a device node")
        if m.isfifo():
            raise _refuse(m, "a FIFO")
        if m.type == tarfile.GNUTYPE_SPARSE or m.sparse is not None:
            raise _refuse(m, "a sparse file (not supported)")
        if not (m.isdir() or m.type in REGULAR or m.issym() or m.islnk()):
            raise _refuse(m, f"unknown member type {m.type!r}")
        if "\x00" in m.linkname:
            raise _refuse(m, "a NUL in its link target")
        if not comps:
            if m.isdir():
                return  # the archive's root: the destination itself
            raise _refuse(m, "a non-directory at the archive's root")
        mtime, mode = mtime_of(m.mtime), m.mode & 0o1777  # setuid and setgid dropped
        parent = self._dir(m, comps[:-1])
        try:
            base = comps[-1]
            if m.isdir():
                if not _is_dir(parent, base):
                    _clear(m, parent, base)
                    os.mkdir(base, 0o700, dir_fd=parent)
                self.dirs[comps] = (mode, mtime)
                return
            if m.islnk():  # only to a regular file this archive made
                target = parts(m.linkname)
                source = self._dir(m, target[:-1]) if target else -1
                try:
                    if not target or not _is_regular(source, target[-1]):
                        raise _refuse(m, f"a hard link to {m.linkname!r}, not a regular file "
                                         "this archive made")
                    _clear(m, parent, base)
                    os.link(target[-1], base, src_dir_fd=source, dst_dir_fd=parent,
                            follow_symlinks=False)
                finally:
                    if source >= 0:
                        os.close(source)
                return
            _clear(m, parent, base)
            if m.issym():
                os.symlink(m.linkname, base, dir_fd=parent)
                return
            fd = os.open(base, _FILE_FLAGS, 0o600, dir_fd=parent)
            try:
                if (source_file := tar.extractfile(m)) is not None:
                    copy(source_file, fd, _CHUNK)
                os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)
            self.size += m.size
        finally:
            os.close(parent)

    def _dir(self, m: tarfile.TarInfo, comps: tuple[str, ...]) -> int:
        """The staged directory `comps` (made if missing), never through a link."""
        fd = os.dup(self.root)
        try:
            for i, comp in enumerate(comps):
                try:
                    nxt = open_child(fd, comp, create=True)
                except (OSError, ValueError):
                    raise _refuse(m, f"its path goes through {'/'.join(comps[:i + 1])!r}, "
                                     "a symlink or not a directory") from None
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def finish(self) -> None:
        """Directories' modes and mtimes, deepest first, once nothing more is made in them."""
        for comps, (mode, mtime) in sorted(self.dirs.items(), key=lambda kv: -len(kv[0])):
            with contextlib.suppress(OSError, ValueError):  # replaced later by a file
                fd = self._dir(_ROOT, comps)
                try:
                    os.fchmod(fd, mode | 0o700)  # the uid must be able to merge into it
                    os.utime(fd, (mtime, mtime))
                finally:
                    os.close(fd)


_ROOT = tarfile.TarInfo(".")


def _refuse(m: tarfile.TarInfo, reason: str) -> Refused:
    return Refused(f"member {_shown(m.name)!r}: {reason}")


def _mode(parent: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def _is_dir(parent: int, name: str) -> bool:
    return stat.S_ISDIR(_mode(parent, name) or 0)


def _is_regular(parent: int, name: str) -> bool:
    return stat.S_ISREG(_mode(parent, name) or 0)


def _clear(m: tarfile.TarInfo, parent: int, name: str) -> None:
    """Make way for a later member of an earlier one's name (an empty directory only)."""
    mode = _mode(parent, name)
    if mode is None:
        return
    if not stat.S_ISDIR(mode):
        os.unlink(name, dir_fd=parent)
        return
    try:
        os.rmdir(name, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise _refuse(m, "it would replace a non-empty directory") from None
        raise


def _merge(source: int, target: int, where: str, *, dry: bool, depth: int = 0) -> None:
    """Move what is staged in `source` into `target`: a directory into a directory of the
    same name, anything else by rename (replacing a file or link there, never following it).
    `dry`: only look for what would be refused (a non-empty directory replaced)."""
    if depth > MAX_DEPTH:
        raise Refused(f"{where}: deeper than {MAX_DEPTH} levels")
    for name in sorted(os.listdir(source)):
        path = f"{where}{name}"
        staged, there = _mode(source, name), _mode(target, name)
        if staged is None:
            continue
        if there is not None and stat.S_ISDIR(there):
            if stat.S_ISDIR(staged):
                src, dst = open_child(source, name), open_child(target, name)
                try:
                    _merge(src, dst, f"{path}/", dry=dry, depth=depth + 1)
                finally:
                    os.close(src)
                    os.close(dst)
                continue
            if dry:
                sub = open_child(target, name)
                try:
                    if os.listdir(sub):
                        raise Refused(f"{path}: the archive would replace a non-empty "
                                      "directory with a file")
                finally:
                    os.close(sub)
                continue
            os.rmdir(name, dir_fd=target)
        elif dry:
            continue
        elif there is not None and stat.S_ISDIR(staged):
            os.unlink(name, dir_fd=target)  # a file or link where the directory goes
        os.rename(name, name, src_dir_fd=source, dst_dir_fd=target)


def copy(source: IO[bytes], fd: int, chunk: int) -> None:
    """A member's bytes written whole to `fd`."""
    while data := source.read(chunk):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


def mtime_of(value: object) -> float:
    """A header's mtime as a time to set: 0 for one that is not a finite number, clamped to
    0 .. 2**33."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return min(max(number, 0.0), float(1 << 33)) if math.isfinite(number) else 0.0
