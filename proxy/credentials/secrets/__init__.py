"""Secret stores chosen by URL (`file:PATH`, `env:`, `vault:https://...`) behind a cache.

broker = SecretBroker([open_store("file:/etc/sealgate/secrets.yaml"),
                       open_store("vault:https://vault:8200?auth=approle&role_id=ci",
                                  secret_id_file="/run/secrets/vault-secret-id")])
secret = await broker.get("vault:kv/data/ci/github#token")
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from sealgate.credentials.errors import (
    SecretConfigError,
    SecretDenied,
    SecretError,
    SecretNotFound,
    SecretUnavailable,
)
from sealgate.credentials.secretref import SecretRef, parse_ref

from .base import Secret, SecretStore
from .cache import SecretCache
from .envstore import EnvStore
from .filestore import FileStore
from .vault import OptionValue, VaultConfig, VaultStore

__all__ = [
    "EnvStore",
    "FileStore",
    "Secret",
    "SecretBroker",
    "SecretCache",
    "SecretConfigError",
    "SecretDenied",
    "SecretError",
    "SecretNotFound",
    "SecretRef",
    "SecretStore",
    "SecretUnavailable",
    "VaultConfig",
    "VaultStore",
    "open_store",
    "parse_ref",
]


def open_store(url: str, **options: OptionValue) -> SecretStore:
    """Open the store a URL names.

    - `file:/path/secrets.yaml` (no options)
    - `env:` or `env:PREFIX_` (no options)
    - `vault:https://host:8200?auth=...` - options are VaultConfig fields and override
      the query string, e.g. `open_store(url, secret_id_file="/run/secrets/sid")`.
    """
    scheme, sep, rest = url.partition(":")
    if not sep:
        raise SecretConfigError(f"secret store URL {url!r} has no scheme")
    if scheme == "vault":
        try:
            return VaultStore(VaultConfig.from_url(url, **options))
        except ValueError as exc:  # urllib's parsers; SecretConfigError is not one
            raise SecretConfigError(f"vault store URL is malformed: {exc}") from None
    if options:
        raise SecretConfigError(f"the {scheme} store takes no options, got {', '.join(options)}")
    if scheme == "file":
        if not rest:
            raise SecretConfigError("file store URL needs a path: file:/path/secrets.yaml")
        return FileStore(rest)
    if scheme == "env":
        return EnvStore(prefix=rest)
    raise SecretConfigError(f"unknown secret store {scheme!r}; use file:, env: or vault:")


class SecretBroker:
    """Routes references to stores by scheme; each store sits behind its own SecretCache.

    Cache settings apply to every store (see SecretCache for their meaning).
    """

    def __init__(
        self,
        stores: Iterable[SecretStore],
        *,
        ttl: float = 300,
        refresh_ahead: float = 0.2,
        stale_grace: float = 30,
        fetch_timeout: float = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._caches: dict[str, SecretCache] = {}
        for store in stores:
            if store.scheme in self._caches:
                raise SecretConfigError(f"more than one {store.scheme} store configured")
            self._caches[store.scheme] = SecretCache(
                store,
                ttl=ttl,
                refresh_ahead=refresh_ahead,
                stale_grace=stale_grace,
                fetch_timeout=fetch_timeout,
                clock=clock,
            )

    def check(self, ref: SecretRef | str) -> SecretRef:
        """Validate a reference at config-load time: parsable and served by a store."""
        parsed = parse_ref(ref) if isinstance(ref, str) else ref
        if parsed.store not in self._caches:
            raise SecretConfigError(f"{parsed} needs a {parsed.store} store, none is configured")
        return parsed

    def fresh(self, ref: SecretRef) -> Secret | None:
        """A cache hit, without waiting; None when `get` is needed."""
        cache = self._caches.get(ref.store)
        return cache.fresh(ref) if cache is not None else None

    async def get(self, ref: SecretRef | str) -> Secret:
        parsed = self.check(ref)
        return await self._caches[parsed.store].get(parsed)

    async def write(self, ref: SecretRef, value: str) -> None:
        """Write a secret back (a rotated refresh token): the file store and Vault KV can be
        written; the env store cannot (SecretConfigError)."""
        await self._caches[self.check(ref).store].write(ref, value)

    def caches(self) -> Mapping[str, SecretCache]:
        """Each store's cache, by scheme (read for the metrics)."""
        return MappingProxyType(self._caches)

    def unavailable(self) -> list[str]:
        """The stores that failed a request past its grace and have not answered since."""
        return [scheme for scheme, cache in self._caches.items() if cache.unavailable]

    async def close(self) -> None:
        for cache in self._caches.values():
            await cache.close()
