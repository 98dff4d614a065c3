"""The secret-store interface: references, redacting values, errors, the store protocol.

Error messages name references, paths and causes, never values: they end up in logs
and in 503 bodies, and a credential must not leak through either.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from typing import Protocol

from sealgate.reasons import Reason, SealgateError

STORES = frozenset({"file", "env", "vault"})

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A file secret's name, a Vault path segment, a Vault field.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


class SecretError(SealgateError):
    """Base of every secret-store failure; `reason` says which (a request that needs the
    secret is refused with secret_unavailable whichever it is)."""

    reason = Reason.SECRET_ERROR


class SecretNotFound(SecretError):
    reason = Reason.SECRET_NOT_FOUND


class SecretUnavailable(SecretError):
    """The backend is down, sealed or too slow, and no cached value is within grace."""

    reason = Reason.SECRET_UNAVAILABLE


class SecretDenied(SecretError):
    reason = Reason.SECRET_DENIED


class SecretConfigError(SecretError):
    """A bad store URL, reference or option, or an unsafe secrets file."""

    reason = Reason.SECRET_CONFIG


@dataclass(frozen=True, slots=True)
class SecretRef:
    """Names one secret: `vault:kv/data/ci/github#token`, `file:stripe_key`, `env:NAME`.

    For Vault, `path` is the HTTP API path below /v1/: a KV v2 secret `ci/github` on
    mount `kv` is `kv/data/ci/github`; a path without a `data` segment is KV v1.
    """

    store: str
    path: str
    field: str | None = None

    def __str__(self) -> str:
        suffix = f"#{self.field}" if self.field is not None else ""
        return f"{self.store}:{self.path}{suffix}"

    @classmethod
    def vault(cls, mount: str, path: str, field: str, *, kv_version: int = 2) -> SecretRef:
        """Build a Vault ref from the YAML form (mount, path, field) and validate it."""
        if kv_version not in (1, 2):
            raise SecretConfigError(f"kv_version must be 1 or 2, not {kv_version!r}")
        middle = "/data/" if kv_version == 2 else "/"
        return parse_ref(f"vault:{mount.strip('/')}{middle}{path.strip('/')}#{field}")


def parse_ref(text: str) -> SecretRef:
    """Parse and validate a reference; raise SecretConfigError naming what is wrong. The
    messages never quote the reference: a secret pasted where its reference belongs would
    otherwise travel on into logs and error answers."""
    store, sep, rest = text.partition(":")
    if not sep or store not in STORES:
        raise SecretConfigError(
            f"a secret reference ({len(text)} characters) must start with one of "
            f"{', '.join(sorted(STORES))} followed by ':'"
        )
    path, hashmark, field = rest.partition("#")
    if store == "vault":
        return _vault_ref(path, field if hashmark else None)
    if hashmark:
        raise SecretConfigError("secret reference: '#field' is only valid for vault")
    pattern = _ENV_NAME if store == "env" else _NAME
    if not pattern.fullmatch(path):
        raise SecretConfigError(f"secret reference: invalid {store} secret name")
    return SecretRef(store, path, None)


def _vault_ref(path: str, field: str | None) -> SecretRef:
    segments = path.split("/")
    if len(segments) < 2 or not all(_NAME.fullmatch(s) for s in segments):
        raise SecretConfigError(
            "secret reference: vault path must be mount/path with segments of "
            "letters, digits, '_', '.', '-' (no empty or dot-leading segments)"
        )
    kv_location(path)  # raises if a KV v2 path names no secret
    if field is None or not _NAME.fullmatch(field):
        raise SecretConfigError("secret reference: vault references need an explicit '#field'")
    return SecretRef("vault", path, field)


def kv_location(path: str) -> tuple[int, str, str]:
    """Split a Vault API path into (KV version, mount, secret path).

    The first `data` segment after the mount marks KV v2 (`kv/data/ci/github`, also for
    nested mounts such as `team/kv/data/app`); without one the first segment is a KV v1
    mount (`secret/app`).
    """
    segments = path.split("/")
    if "data" in segments[1:]:
        cut = segments.index("data", 1)
        version, mount, rest = 2, segments[:cut], segments[cut + 1 :]
    else:
        version, mount, rest = 1, segments[:1], segments[1:]
    if not rest:
        raise SecretConfigError("vault path names a mount but no secret")
    return version, "/".join(mount), "/".join(rest)


class Secret:
    """A secret value whose repr and str never show it; `reveal()` is the one way out."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret(<redacted, {len(self._value)} chars>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    __hash__ = None  # type: ignore[assignment]  # values must not become dict keys

    def __reduce__(self) -> str:
        # Pickling would copy the value somewhere we cannot redact it.
        raise TypeError("Secret values cannot be pickled")


class SecretStore(Protocol):
    """One backend. `fetch` returns the value and how long the backend says it is good
    for (math.inf when the backend has no opinion: the cache TTL then decides)."""

    scheme: str

    async def fetch(self, ref: SecretRef) -> tuple[Secret, float]: ...

    async def close(self) -> None: ...
