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

__all__ = ["FileIdentity", "Watch"]

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


class Watch:
    """Whether any of some paths may have changed since they were last read.

    `changed()` before reading, `mark()` after a read that succeeded. A path that cannot be
    stat'ed (missing, say) has the identity None, so its appearing is a change too.
    """

    def __init__(self, paths: Iterable[Path]) -> None:
        self.paths = tuple(dict.fromkeys(paths))
        self._seen: Identities | None = None
        self._trusted = False

    def now(self) -> Identities:
        """Each path's identity as a stat sees it now."""
        return tuple(_identity(path) for path in self.paths)

    @property
    def seen(self) -> Identities | None:
        """The identities of the last `mark`; None before the first."""
        return self._seen

    def changed(self, now: Sequence[FileIdentity | None] | None = None) -> bool:
        """Whether to read again: an identity differs from the last `mark`, or was too recent
        then to vouch for the content; always before the first `mark`. `now` is this instant's
        identities when the caller has stat'ed already."""
        if not self._trusted:
            return True
        return (self.now() if now is None else tuple(now)) != self._seen

    def mark(self, seen: Sequence[FileIdentity | None] | None = None) -> None:
        """Record what was read: the identities stat'ed before or while reading it (the fstat of
        the opened file is exact), or by default as they are now. Marking after the read misses
        only a replacement, in between, by a file whose mtime is already old (`cp -p`)."""
        self._seen = self.now() if seen is None else tuple(seen)
        self._trusted = all(identity is None or identity.settled() for identity in self._seen)


def _identity(path: Path) -> FileIdentity | None:
    try:
        return FileIdentity.of(path.stat())
    except OSError:
        return None
