"""Has a file we read changed since? One `stat` per path per check, and git's racy-file rule.

What a stat says about a file's content is its identity: inode, size and mtime. Any change
means read it again. The reverse does not hold for a file written within the filesystem's
timestamp granularity of when we read it: rewritten in place again in that tick, at the same
size, it looks unchanged (git's "racy" files). So an identity recorded while its mtime was that
recent vouches for nothing, and the file counts as changed until it is read again once its mtime
has settled. Watching a directory covers the files added to or removed from it (that changes
its mtime), not edits to the files in it: watch those too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FileIdentity", "Snapshot"]

# Coarser than any timestamp granularity a Linux filesystem has (FAT's is 2 s); a file changed
# this recently is read again rather than trusted by its identity.
_RACY_NS = 2_000_000_000


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What a cheap stat says about a file's content."""

    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_ino, st.st_size, st.st_mtime_ns)

    def settled(self) -> bool:
        """Old enough that this identity, unchanged later, means unchanged content."""
        return time.time_ns() - self.mtime_ns > _RACY_NS


Identities = tuple[FileIdentity | None, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What some paths looked like to a stat when they were read, and so whether to read them
    again. A value: after a read, take a new one (`retake`).

    A path that cannot be stat'ed (missing, say) has the identity None, so its appearing is a
    change too. `identities` is None for paths not read yet, which always count as changed.
    """

    paths: tuple[Path, ...]
    identities: Identities | None = None
    # Every identity was old enough when taken to vouch for the content read.
    trusted: bool = False

    @classmethod
    def unread(cls, paths: Iterable[Path]) -> Snapshot:
        return cls(tuple(dict.fromkeys(paths)))

    @classmethod
    def take(
        cls, paths: Iterable[Path], identities: Sequence[FileIdentity | None] | None = None
    ) -> Snapshot:
        """The paths as read: `identities` stat'ed before or while reading them (the fstat of
        the opened file is exact), or by default as they are now. Taken after the read, it
        misses only a replacement in between by a file whose mtime is already old (`cp -p`)."""
        unique = tuple(dict.fromkeys(paths))
        seen = _now(unique) if identities is None else tuple(identities)
        return cls(unique, seen, all(one is None or one.settled() for one in seen))

    def retake(self, identities: Sequence[FileIdentity | None] | None = None) -> Snapshot:
        """The same paths, read again."""
        return Snapshot.take(self.paths, identities)

    def now(self) -> Identities:
        """Each path's identity as a stat sees it now."""
        return _now(self.paths)

    def changed(self, now: Sequence[FileIdentity | None] | None = None) -> bool:
        """Whether to read again: an identity differs from this snapshot's, or was too recent
        when taken to vouch for the content. `now` is this instant's identities when the
        caller has stat'ed already."""
        if not self.trusted:
            return True
        return (self.now() if now is None else tuple(now)) != self.identities


def _now(paths: tuple[Path, ...]) -> Identities:
    return tuple(_identity(path) for path in paths)


def _identity(path: Path) -> FileIdentity | None:
    try:
        return FileIdentity.of(path.stat())
    except OSError:
        return None
