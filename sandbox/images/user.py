"""The image config's `User`, as the ids a sandbox of the image runs its commands as.

`User` is `user`, `uid`, `user:group`, `uid:gid`, `user:gid` or `uid:group` (the OCI image
spec's forms); names are looked up in the image's own `/etc/passwd` and `/etc/group`, read
from its unpacked layers as overlayfs would show them (the top layer that has the path wins;
a whiteout there, or an opaque `/etc` above it, means the file is absent), never following a
link, at most `MAX_FILE` bytes each: the files are the image's, so untrusted. As Docker does,
a user alone takes the primary group its passwd entry names (0 for a uid it lacks), and its
home directory becomes HOME where the image's Env sets none.

The ids are the sandbox's own names for its one unprivileged identity (every tier maps the
whole root to it: docs/sandbox.md, "The image's User"), never a host uid: nothing here chooses
who the sandbox is on the host.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .errors import ImageError
from .unpack import OPAQUE_XATTR

__all__ = ["ImageUser", "UserError", "resolve"]

MAX_FILE: Final = 1 << 20
_MAX_ID: Final = (1 << 31) - 2  # below the kernel's (uid_t)-1
_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UserError(ImageError):
    """The image's `User` names no ids this image has: no sandbox of it starts."""


@dataclass(frozen=True)
class ImageUser:
    uid: int
    gid: int
    home: str  # "" where its passwd entry has none


def resolve(user: str, layers: Sequence[Path]) -> ImageUser | None:
    """The ids `user` names in the image of `layers` (top first); None for an empty `User`
    (the sandbox's root, as before). Raises ImageError naming what is wrong."""
    if not user:
        return None
    name, _, group = user.partition(":")
    if not name or (group == "" and user.endswith(":")):
        raise UserError(f"the image's User {user[:64]!r} is not user[:group]")
    entries = _table(layers, "etc/passwd") if not (_number(name) and _number(group)) else []
    by_name: dict[str, list[str]] = {}
    for entry in entries:  # the first entry of a name, as libc's lookup finds it
        if len(entry) >= 7:
            by_name.setdefault(entry[0], entry)
    row: list[str] | None
    if _number(name):
        uid = _id(name, user)
        row = next((r for r in by_name.values() if r[2] == name), None)
    elif (row := by_name.get(name)) is not None:
        uid = _id(row[2], user)
    else:
        raise UserError(f"the image's User {name[:64]!r}: no such user in its /etc/passwd")
    if group:
        if _number(group):
            gid = _id(group, user)
        else:
            groups: dict[str, list[str]] = {}
            for r in _table(layers, "etc/group"):
                if len(r) >= 3:
                    groups.setdefault(r[0], r)
            if group not in groups:
                raise UserError(f"the image's User group {group[:64]!r}: no such group in its "
                                 "/etc/group")
            gid = _id(groups[group][2], user)
    else:
        gid = _id(row[3], user) if row is not None else 0
    home = row[5] if row is not None and row[5].startswith("/") and "\0" not in row[5] else ""
    return ImageUser(uid, gid, home)


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit()  # not fullwidth digits, which int() reads too


def _id(text: str, user: str) -> int:
    if not _number(text) or len(text) > 10 or int(text) > _MAX_ID:
        raise UserError(f"the image's User {user[:64]!r}: {text[:16]!r} is no id")
    return int(text)


def _table(layers: Sequence[Path], path: str) -> list[list[str]]:
    """The colon-separated lines of the image's file at `path`, [] where it has none."""
    data = _read(layers, path)
    return [line.split(":") for line in data.decode("utf-8", "replace").splitlines()
            if line and not line.startswith("#")]


def _read(layers: Sequence[Path], path: str) -> bytes:
    """The file as overlayfs would show it, each component opened without following a link:
    an image's `etc` may be a link out of the store, to the host's own /etc."""
    parent, _, name = path.rpartition("/")
    for layer in layers:
        try:
            top = os.open(layer, _DIR)
        except OSError as exc:
            raise UserError(f"a layer of the image: {exc.strerror}") from None
        try:
            try:
                directory = os.open(parent, _DIR, dir_fd=top)
            except FileNotFoundError:
                continue
            except OSError:  # a whiteout, a file or a link where /etc is: none below shows
                return b""
            try:
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                                 | os.O_CLOEXEC, dir_fd=directory)
                except FileNotFoundError:
                    if _opaque(directory):
                        return b""  # this layer's /etc hides every lower one's
                    continue
                except OSError:  # a link, say: no file to read
                    return b""
                with os.fdopen(fd, "rb") as fh:
                    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                        return b""  # a whiteout (a device), a FIFO, a directory
                    data = fh.read(MAX_FILE + 1)
            finally:
                os.close(directory)
        finally:
            os.close(top)
        if len(data) > MAX_FILE:
            raise UserError(f"the image's /{path} is over {MAX_FILE} bytes")
        return data
    return b""


def _opaque(directory: int) -> bool:
    try:
        return os.getxattr(directory, OPAQUE_XATTR) == b"y"
    except OSError:
        return False
