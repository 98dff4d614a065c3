"""An `oci-archive` (a plain tar of an OCI image layout) opened into a directory of ours.

Only what a layout holds is taken: `oci-layout`, `index.json` and `blobs/sha256/<64 hex>`
regular files (and the directories `blobs/` and `blobs/sha256/`); anything else, a duplicate,
a member over `max_member` bytes or more than `max_members` members refuses the archive. The
files are written at paths this module builds from the validated name, never from the member
name itself, with O_CREAT|O_EXCL|O_NOFOLLOW into a fresh directory.
"""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path

from .errors import ImageError
from .unpack import Meter, parts

MAX_TOP = 16 << 20  # oci-layout, index.json
_BLOB = re.compile(r"[0-9a-f]{64}")
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


def extract(archive: Path, dest: Path, *, max_member: int, max_total: int,
            max_members: int = 10_000) -> None:
    """Write the layout in `archive` into the empty directory `dest`."""
    what = f"archive {archive}"
    try:
        source = open(archive, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise ImageError(f"{what}: cannot be opened ({exc.strerror})") from None
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, mode=0o700)
    seen: set[str] = set()
    try:
        with source, tarfile.open(fileobj=Meter(source, max_total, what),  # type: ignore[call-overload]
                                  mode="r|") as tar:
            while (member := tar.next()) is not None:
                tar.members.clear()
                if len(seen) >= max_members:
                    raise ImageError(f"{what}: more than {max_members} members")
                path = "/".join(parts(member.name, what))
                if member.isdir() and path in ("", "blobs", "blobs/sha256"):
                    continue
                if path in seen:
                    raise ImageError(f"{what}: member {member.name!r} appears twice")
                seen.add(path)
                if path in ("oci-layout", "index.json"):
                    limit, out = MAX_TOP, dest / path
                elif path.startswith("blobs/sha256/") and _BLOB.fullmatch(path[13:]):
                    limit, out = max_member, blobs / path[13:]
                else:
                    raise ImageError(f"{what}: member {member.name!r} is not part of an OCI "
                                     "image layout")
                if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    raise ImageError(f"{what}: member {member.name!r} is not a regular file")
                if member.size > limit:
                    raise ImageError(f"{what}: member {member.name!r} is {member.size} bytes, "
                                     f"over the {limit}-byte limit")
                _write(tar, member, out)
    except tarfile.TarError as exc:
        raise ImageError(f"{what}: not a valid tar archive ({exc})") from None
    except OSError as exc:
        raise ImageError(f"{what}: {exc.strerror or exc}") from None


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, out: Path) -> None:
    source = tar.extractfile(member)
    fd = os.open(out, _FLAGS, 0o600)
    with os.fdopen(fd, "wb") as f:
        while source is not None and (data := source.read(_CHUNK)):
            f.write(data)
