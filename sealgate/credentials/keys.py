"""Proxy key pairs: X25519 keys named by a key id, their files, and the proxy's keyring.

The proxy holds private keys (several at once, so keys can rotate); the issuer holds public keys
only and seals to the newest. A key id (kid) is derived from the public key, so it cannot drift
from the key it names. File formats are in docs/token-format.md.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, TypeVar

from nacl.public import PrivateKey

from sealgate.files import read_regular
from sealgate.reasons import Reason

from .errors import CredentialError
from .jsonfields import load_json_object

__all__ = [
    "KeyFileError",
    "KeyPermissionError",
    "Keyring",
    "NoKeysError",
    "PrivateKeyEntry",
    "PublicKeyEntry",
    "format_time",
    "generate",
    "kid_for",
    "load_private",
    "load_public",
    "newest_first",
    "newest_public",
    "private_entries",
    "public_entries",
]

KEY_BYTES: Final = 32
KID_BYTES: Final = 8
PRIVATE_SUFFIX: Final = ".key"
PUBLIC_SUFFIX: Final = ".pub"
PRIVATE_FORMAT: Final = "sealgate-x25519-private-v1"
PUBLIC_FORMAT: Final = "sealgate-x25519-public-v1"
# Key files are a few hundred bytes; anything much larger is not one of ours.
_MAX_FILE_BYTES: Final = 4096
_KID: Final = re.compile(r"[0-9a-f]{16}")
_HEX_KEY: Final = re.compile(r"[0-9a-f]{64}")
_TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"


class KeyFileError(CredentialError):
    """A key file or key directory we refuse to use. The message names the file, never key bytes."""

    reason = Reason.KEY_FILE_INVALID


class KeyPermissionError(KeyFileError):
    reason = Reason.KEY_FILE_PERMISSIONS


class NoKeysError(KeyFileError):
    reason = Reason.NO_KEYS


def kid_for(public_key: bytes) -> str:
    """The key id: the first 8 bytes of SHA-256(public key), as 16 lowercase hex digits."""
    return hashlib.sha256(public_key).digest()[:KID_BYTES].hex()


def _check_created(created: datetime) -> None:
    if created.utcoffset() != timedelta(0):
        raise ValueError("key creation time must be timezone-aware UTC")


@dataclass(frozen=True)
class PublicKeyEntry:
    kid: str
    public_key: bytes
    created: datetime

    def __post_init__(self) -> None:
        if len(self.public_key) != KEY_BYTES:
            raise ValueError("an X25519 public key is 32 bytes")
        if self.kid != kid_for(self.public_key):
            raise ValueError(f"kid {self.kid!r} does not match the public key")
        _check_created(self.created)


@dataclass(frozen=True)
class PrivateKeyEntry:
    kid: str
    private_key: bytes = field(repr=False)
    created: datetime

    def __post_init__(self) -> None:
        if len(self.private_key) != KEY_BYTES:
            raise ValueError("an X25519 private key is 32 bytes")
        if self.kid != kid_for(self.public_key):
            raise ValueError(f"kid {self.kid!r} does not match the private key")
        _check_created(self.created)

    @classmethod
    def from_private_key(cls, private_key: bytes, created: datetime) -> PrivateKeyEntry:
        public = bytes(PrivateKey(private_key).public_key)
        return cls(kid=kid_for(public), private_key=private_key, created=created)

    @property
    def public_key(self) -> bytes:
        return bytes(PrivateKey(self.private_key).public_key)

    def public(self) -> PublicKeyEntry:
        return PublicKeyEntry(kid=self.kid, public_key=self.public_key, created=self.created)


class Keyring:
    """The private keys a proxy accepts tokens for, by kid."""

    def __init__(self, entries: Iterable[PrivateKeyEntry]) -> None:
        self._entries: dict[str, PrivateKeyEntry] = {}
        for entry in entries:
            if entry.kid in self._entries:
                raise KeyFileError(f"key {entry.kid} appears twice")
            self._entries[entry.kid] = entry

    def get(self, kid: str) -> PrivateKeyEntry | None:
        return self._entries.get(kid)

    @property
    def kids(self) -> tuple[str, ...]:
        """Key ids, newest key first."""
        return tuple(entry.kid for entry in newest_first(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Keyring(kids={list(self.kids)!r})"

    @classmethod
    def load(cls, directory: Path) -> Keyring:
        """Every `<kid>.key` in `directory`. Refuses an empty directory and unsafe files."""
        entries = private_entries(directory)
        if not entries:
            raise NoKeysError(f"no private keys (*{PRIVATE_SUFFIX}) in {directory}")
        return cls(entries)


def format_time(moment: datetime) -> str:
    """UTC to the second, as key files, `keys list` and the issuer's /v1/keys show it."""
    return moment.astimezone(UTC).strftime(_TIME_FORMAT)


_Entry = TypeVar("_Entry", "PrivateKeyEntry", "PublicKeyEntry")


def newest_first(entries: Iterable[_Entry]) -> list[_Entry]:
    """Newest key first: by creation time, then the highest kid. The issuer seals to the
    first."""
    return sorted(entries, key=lambda entry: (entry.created, entry.kid), reverse=True)


def _parse_time(text: str, path: Path) -> datetime:
    try:
        return datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        raise KeyFileError(f"{path}: 'created' is not a time like 2025-01-31T12:00:00Z") from None


def _check_private_mode(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise KeyFileError(f"{path} is not a regular file")
    if mode & 0o077:
        raise KeyPermissionError(
            f"{path} is accessible by group or others (mode {stat.S_IMODE(mode):04o}); "
            f"run: chmod 600 {path}"
        )


def _read_fields(
    path: Path, fmt: str, key_field: str, *, private: bool
) -> tuple[str, bytes, datetime]:
    """Read and check one key file: (kid, 32 key bytes, created)."""
    try:
        data, st = read_regular(path, _MAX_FILE_BYTES)
    except OSError as exc:
        raise KeyFileError(f"cannot read {path}: {exc.strerror}") from None
    if private:
        # The fstat of the opened file: the mode checked is the mode of what was read.
        _check_private_mode(path, st.st_mode)
    if len(data) > _MAX_FILE_BYTES:
        raise KeyFileError(f"{path} is larger than {_MAX_FILE_BYTES} bytes")
    # Raised outside the except block: decode errors hold the file content (key bytes), which
    # must not ride along as __context__. Their messages give only positions.
    problem = ""
    try:
        obj = load_json_object(data.decode("utf-8"))
    except UnicodeDecodeError:
        problem = "not UTF-8"
    except ValueError as exc:
        problem = str(exc)
    if problem:
        raise KeyFileError(f"{path} is not a JSON key file: {problem}")
    expected = {"format", "kid", "created", key_field}
    if set(obj) != expected:
        raise KeyFileError(f"{path} must have exactly the fields {sorted(expected)}")
    values = [obj[name] for name in ("format", "kid", "created", key_field)]
    if not all(isinstance(value, str) for value in values):
        raise KeyFileError(f"{path}: every field must be a string")
    file_format, kid, created, key_hex = (str(value) for value in values)
    if file_format != fmt:
        raise KeyFileError(f"{path}: format must be {fmt!r}")
    if not _KID.fullmatch(kid) or path.name != kid + path.suffix:
        raise KeyFileError(f"{path}: kid must be 16 hex digits and match the file name")
    if not _HEX_KEY.fullmatch(key_hex):
        raise KeyFileError(f"{path}: {key_field} must be 64 lowercase hex digits")
    return kid, bytes.fromhex(key_hex), _parse_time(created, path)


def load_public(path: Path) -> PublicKeyEntry:
    kid, key, created = _read_fields(path, PUBLIC_FORMAT, "public_key", private=False)
    if kid != kid_for(key):
        raise KeyFileError(f"{path}: kid does not match the public key")
    return PublicKeyEntry(kid=kid, public_key=key, created=created)


def load_private(path: Path) -> PrivateKeyEntry:
    """Load a private key file, refusing one that group or others can read or write."""
    kid, key, created = _read_fields(path, PRIVATE_FORMAT, "private_key", private=True)
    entry = PrivateKeyEntry.from_private_key(key, created)
    if entry.kid != kid:
        raise KeyFileError(f"{path}: kid does not match the private key")
    return entry


def _files(directory: Path, suffix: str) -> list[Path]:
    if not directory.is_dir():
        raise KeyFileError(f"{directory} is not a directory")
    return sorted(path for path in directory.iterdir() if path.name.endswith(suffix))


def private_entries(directory: Path) -> list[PrivateKeyEntry]:
    return [load_private(path) for path in _files(directory, PRIVATE_SUFFIX)]


def public_entries(directory: Path) -> list[PublicKeyEntry]:
    return [load_public(path) for path in _files(directory, PUBLIC_SUFFIX)]


def newest_public(directory: Path) -> PublicKeyEntry:
    """The public key the issuer seals to: the newest by creation time (ties: highest kid)."""
    entries = public_entries(directory)
    if not entries:
        raise NoKeysError(f"no public keys (*{PUBLIC_SUFFIX}) in {directory}")
    return newest_first(entries)[0]


def _write_new(path: Path, text: str, mode: int) -> None:
    # O_EXCL: never overwrite a key; O_NOFOLLOW: never write through a planted symlink.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have removed bits we want (0644 for .pub)
        data = text.encode("utf-8")
        while data:  # a short write (a full disk) must not leave half a key
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    except OSError:
        # Created here and not complete: a broken key file would fail every later load.
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def _key_file_text(fmt: str, kid: str, created: datetime, key_field: str, key: bytes) -> str:
    return (
        "{\n"
        f'  "format": "{fmt}",\n'
        f'  "kid": "{kid}",\n'
        f'  "created": "{format_time(created)}",\n'
        f'  "{key_field}": "{key.hex()}"\n'
        "}\n"
    )


def generate(out: Path, *, now: datetime | None = None) -> PublicKeyEntry:
    """Create a key pair in `out` (made 0700 if missing): `<kid>.key` (0600) and `<kid>.pub`."""
    created = (now or datetime.now(UTC)).replace(microsecond=0)
    entry = PrivateKeyEntry.from_private_key(bytes(PrivateKey.generate()), created)
    try:
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise KeyFileError(f"cannot create {out}: {exc.strerror}") from None
    private_path = out / f"{entry.kid}{PRIVATE_SUFFIX}"
    public_path = out / f"{entry.kid}{PUBLIC_SUFFIX}"
    public = entry.public()
    written: list[Path] = []
    try:
        _write_new(
            private_path,
            _key_file_text(PRIVATE_FORMAT, entry.kid, created, "private_key", entry.private_key),
            0o600,
        )
        written.append(private_path)
        _write_new(
            public_path,
            _key_file_text(PUBLIC_FORMAT, entry.kid, created, "public_key", public.public_key),
            0o644,
        )
    except OSError as exc:
        # A private key without its public half would sit in the proxy's keyring unannounced.
        for path in written:
            path.unlink(missing_ok=True)
        raise KeyFileError(f"cannot write key files in {out}: {exc.strerror}") from None
    return public
