"""A secret's name in a store (`SecretRef`): `vault:kv/data/ci/github#token`, `file:stripe_key`,
`env:NAME`, parsed and checked. What a rule's `inject` entry names and the proxy's secret
stores (`sealgate.proxy.credentials.secrets`) look up, so both the rules and the stores use it
from here. Errors are `SecretConfigError`s; their messages never quote the reference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import SecretConfigError

__all__ = ["STORES", "SecretRef", "kv_location", "parse_ref"]

STORES = frozenset({"file", "env", "vault"})

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A file secret's name, a Vault path segment, a Vault field.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


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
