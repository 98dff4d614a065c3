"""`file:PATH` - named secrets in a private YAML or JSON file, reloaded when it changes."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import yaml

from sealgate.credentials.errors import SecretConfigError, SecretNotFound, SecretUnavailable
from sealgate.credentials.secretref import SecretRef
from sealgate.files import read_regular
from sealgate.watch import FileIdentity, Snapshot

from .base import Secret

_MAX_FILE_BYTES = 16 * 1024 * 1024  # bytes

# Cache entries for file secrets live this long, so an edit is seen within a second
# even though the broker's cache sits in front of the store.
FILE_TTL = 1.0


class FileStore:
    """Secrets from one file mapping name -> string.

    Refused if group or world can access it (mode & 0o077), since then another local
    user could read every credential the proxy injects.
    """

    scheme = "file"

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._seen = Snapshot.unread((self.path,))
        self._secrets: dict[str, str] = {}

    async def fetch(self, ref: SecretRef) -> tuple[Secret, float]:
        if ref.store != self.scheme:
            raise SecretConfigError(f"{ref} is not a file secret reference")
        self._reload_if_changed()
        try:
            return Secret(self._secrets[ref.path]), FILE_TTL
        except KeyError:
            raise SecretNotFound(f"secret {ref.path!r} is not in {self.path}") from None

    async def write(self, ref: SecretRef, value: str) -> None:
        """Set one secret (a rotated refresh token): the file is written anew, next to it and
        renamed over it, mode 600, so a reader sees the old file or the new one whole. Written
        as YAML or, if it was JSON, as JSON; comments do not survive."""
        if ref.store != self.scheme:
            raise SecretConfigError(f"{ref} is not a file secret reference")
        self._reload_if_changed()
        updated = {**self._secrets, ref.path: value}
        try:
            current = self.path.read_text(encoding="utf-8")
        except OSError:
            current = ""
        text = (json.dumps(updated, indent=2) + "\n" if current.lstrip().startswith("{")
                else yaml.safe_dump(updated, default_flow_style=False, width=1 << 20))
        fresh = self.path.with_name(f".{self.path.name}.{os.getpid()}.new")
        try:
            fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(fresh, self.path)
        except OSError as exc:
            fresh.unlink(missing_ok=True)
            raise SecretUnavailable(
                f"secrets file {self.path} cannot be written: {exc.strerror}") from None
        self._secrets = updated

    async def close(self) -> None:
        self._secrets = {}

    def _reload_if_changed(self) -> None:
        # A stat per fetch is the cheap check; the file is re-read (and its mode
        # re-checked on the opened descriptor, so a swap cannot slip by) only on change.
        st = self._checked(self.path.stat)
        if not self._seen.changed((FileIdentity.of(st),)):
            return
        try:
            data, opened = read_regular(self.path, _MAX_FILE_BYTES)
        except OSError as exc:
            raise SecretUnavailable(
                f"secrets file {self.path} cannot be read: {exc.strerror}"
            ) from None
        st = self._checked(lambda: opened)
        if len(data) > _MAX_FILE_BYTES:
            raise SecretConfigError(f"secrets file {self.path} is larger than {_MAX_FILE_BYTES}")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SecretConfigError(f"secrets file {self.path} is not UTF-8") from None
        self._secrets = self._parse(text)
        self._seen = self._seen.retake((FileIdentity.of(st),))

    def _checked(self, do_stat: Callable[[], os.stat_result]) -> os.stat_result:
        try:
            st = do_stat()
        except OSError as exc:
            raise SecretUnavailable(
                f"secrets file {self.path} cannot be read: {exc.strerror}"
            ) from None
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise SecretConfigError(
                f"secrets file {self.path} has mode {mode:o}; "
                "it must not be group- or world-accessible (chmod 600)"
            )
        return st

    def _parse(self, text: str) -> dict[str, str]:
        try:
            # YAML is a superset of JSON, so one parser reads both.
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            # The parser's own message can quote the offending line, i.e. a value.
            mark = getattr(exc, "problem_mark", None)
            line = f" near line {mark.line + 1}" if mark is not None else ""
            raise SecretConfigError(f"secrets file {self.path} is not valid YAML{line}") from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise SecretConfigError(f"secrets file {self.path} must be a mapping of name to string")
        bad = sorted(
            str(k) for k, v in data.items() if not isinstance(k, str) or not isinstance(v, str)
        )
        if bad:
            raise SecretConfigError(
                f"secrets file {self.path}: entries {', '.join(bad)} are not name: string"
            )
        return dict(data)
