"""What the sync and asyncio clients' `files` share (`files`, `afiles`): the routes, the
entries and events as objects, and the local side of a directory's tar stream.

A tar stream from a sandbox is the sandbox's word, hostile until shown otherwise: it is
unpacked here with tarfile's `data` filter (no absolute names, no `..`, no link leading out,
no device, setuid and setgid dropped) into the directory given.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlencode

from sealgate.reasons import Reason

from .clientshared import DaemonError

SPOOL = 8 << 20  # a directory's tar kept in memory up to this, on disk past it


@dataclass(frozen=True)
class Entry:
    """A workspace entry, as the sandbox saw it (never followed: a link is a `symlink`)."""

    name: str
    path: str  # from /workspace
    type: str  # file, dir, symlink, other (a FIFO, socket or device)
    size: int
    mode: int  # permission bits
    mtime: float
    target: str | None = None  # a symlink's, as written

    @classmethod
    def of(cls, raw: Any) -> Entry:
        try:
            return cls(str(raw["name"]), str(raw["path"]), str(raw["type"]), int(raw["size"]),
                       int(raw["mode"]), float(raw["mtime"]),
                       None if raw.get("target") is None else str(raw["target"]))
        except (KeyError, TypeError, ValueError):
            raise DaemonError("the daemon's entry is not one", reason=Reason.INTERNAL_ERROR,
                              status=200) from None


@dataclass(frozen=True)
class WatchEvent:
    """One change under a watch: `event` create, modify, chmod, delete, rename (`source` the
    old path) or overflow (events were dropped: look again); `path` from /workspace."""

    event: str
    path: str
    is_dir: bool = False
    source: str | None = None
    dropped: int = 0

    @classmethod
    def of(cls, line: bytes) -> WatchEvent:
        try:
            raw = json.loads(line)
            return cls(str(raw["event"]), str(raw.get("path", "")), bool(raw.get("dir")),
                       None if raw.get("from") is None else str(raw["from"]),
                       int(raw.get("dropped", 0)))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise DaemonError("the daemon's watch event is not one",
                              reason=Reason.INTERNAL_ERROR, status=200) from None


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        said = json.loads(raw)
    except ValueError:
        said = None
    if not isinstance(said, dict):
        raise DaemonError("the daemon answered with something other than an object",
                          reason=Reason.INTERNAL_ERROR, status=200)
    return said


def route(ident: str, tail: str, **query: Any) -> str:
    said = {k: ("true" if v else "false") if isinstance(v, bool) else v
            for k, v in query.items() if v is not None}
    where = f"/v1/sandboxes/{quote(ident, safe='')}{tail}"
    return where + (f"?{urlencode(said)}" if said else "")


def clean(path: str) -> str:
    """A workspace path as the daemon takes it, from /workspace whether or not it says so
    ("/workspace/a", "/a" and "a" alike); "" for the workspace itself."""
    if path == "/workspace" or path.startswith("/workspace/"):
        path = path[len("/workspace"):]
    return "" if path in ("", ".", "/") else path.lstrip("/")


def pack(local: str | os.PathLike[str]) -> IO[bytes]:
    """The directory `local` as a tar, rewound: in memory if small, else on disk."""
    source = Path(local)
    if not source.is_dir():
        raise NotADirectoryError(f"{source}: not a directory")
    out = tempfile.SpooledTemporaryFile(SPOOL)  # noqa: SIM115 - the caller's to close
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        for child in sorted(source.iterdir()):
            archive.add(child, arcname=child.name)
    out.seek(0)
    return out


def unpack(data: IO[bytes] | bytes, local: str | os.PathLike[str]) -> None:
    """A sandbox's tar stream into the directory `local` (made if missing), under tarfile's
    `data` filter: the stream is not trusted."""
    Path(local).mkdir(parents=True, exist_ok=True)
    source = io.BytesIO(data) if isinstance(data, bytes) else data
    try:
        with tarfile.open(fileobj=source, mode="r|") as archive:
            archive.extractall(local, filter="data")
    except tarfile.TarError as exc:
        raise DaemonError(f"the sandbox's tar stream was refused: {exc}",
                          reason=Reason.BAD_ARCHIVE, status=200) from None
