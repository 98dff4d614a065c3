"""`vault:https://vault:8200` - HashiCorp Vault KV v1/v2 through hvac.

hvac is synchronous, so every call runs in a small bounded thread pool with hvac's own
per-request timeout: a slow Vault can occupy at most `workers` threads, each for at most
`timeout` seconds, and the cache in front makes one call per secret at a time.

Why one module of ~420 lines: the auth methods (token, token file, AppRole, Kubernetes), the
re-login on expiry and KV v1/v2 share one client's state and its lock.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from os import PathLike
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import hvac
import hvac.exceptions
import requests

from sealgate.credentials.errors import (
    SecretConfigError,
    SecretDenied,
    SecretError,
    SecretNotFound,
    SecretUnavailable,
)
from sealgate.credentials.secretref import SecretRef, kv_location
from sealgate.watch import Snapshot

from .base import Secret

log = logging.getLogger(__name__)

AUTH_METHODS = ("token", "approle", "kubernetes")
K8S_JWT_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
# After a failed renewal and re-login, try again this often (capped by half the lease).
RETRY_DELAY = 5.0
_pool_ids = itertools.count(1)

OptionValue = str | float | PathLike[str] | None


@dataclass(frozen=True, slots=True)
class VaultConfig:
    """How to reach and log in to Vault.

    Secret material (token, secret_id, JWT) is only ever read from files, never taken
    from the URL or options, so it cannot end up in config dumps or process listings.
    """

    url: str
    auth: str = "token"
    token_file: Path | None = None
    role_id: str | None = None
    secret_id_file: Path | None = None
    role: str | None = None
    jwt_file: Path = K8S_JWT_FILE
    auth_mount: str | None = None
    namespace: str | None = None
    ca_file: Path | None = None
    timeout: float = 5.0
    workers: int = 4

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SecretConfigError(f"vault url {self.url!r} must be http(s)://host[:port]")
        if self.auth not in AUTH_METHODS:
            raise SecretConfigError(
                f"vault auth {self.auth!r} is not one of {', '.join(AUTH_METHODS)}"
            )
        needs = {"token": ("token_file",), "approle": ("role_id",), "kubernetes": ("role",)}
        missing = [name for name in needs[self.auth] if getattr(self, name) is None]
        if missing:
            raise SecretConfigError(f"vault auth {self.auth} needs {', '.join(missing)}")
        if not self.timeout > 0 or not 1 <= self.workers <= 32:
            raise SecretConfigError("vault timeout must be > 0 and workers within 1..32")
        if self.ca_file is not None and parts.scheme != "https":
            raise SecretConfigError("vault ca_file is set but the url is not https")

    @property
    def mount(self) -> str:
        return self.auth_mount or self.auth

    @classmethod
    def from_url(cls, url: str, **options: OptionValue) -> VaultConfig:
        """Build from `vault:https://host:8200?auth=approle&role_id=...` plus options.

        Options (keyword arguments, e.g. from YAML or CLI) override query parameters;
        both use the field names of this class. None values are ignored.
        """
        if not url.startswith("vault:"):
            raise SecretConfigError(f"{url!r} is not a vault: store URL")
        parts = urlsplit(url.removeprefix("vault:"))
        merged: dict[str, object] = dict(parse_qsl(parts.query, strict_parsing=bool(parts.query)))
        merged.update({k: v for k, v in options.items() if v is not None})
        base = parts._replace(query="", fragment="").geturl()
        return cls(url=base, **_typed(merged))


def _typed(raw: Mapping[str, object]) -> dict[str, Any]:
    known = {f.name: f for f in fields(VaultConfig) if f.name != "url"}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise SecretConfigError(
            f"unknown vault option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    converters: dict[str, Callable[[Any], object]] = {
        "token_file": Path,
        "secret_id_file": Path,
        "jwt_file": Path,
        "ca_file": Path,
        "timeout": float,
        "workers": int,
    }
    out: dict[str, Any] = {}
    for name, value in raw.items():
        try:
            out[name] = converters.get(name, str)(value)
        except (TypeError, ValueError):
            raise SecretConfigError(f"vault option {name} has an invalid value") from None
    return out


class VaultStore:
    scheme = "vault"

    def __init__(self, config: VaultConfig) -> None:
        self.config = config
        self.thread_name_prefix = f"vault-secrets-{next(_pool_ids)}"
        self._pool = ThreadPoolExecutor(config.workers, thread_name_prefix=self.thread_name_prefix)
        session = requests.Session()
        # Never route Vault traffic through an environment-configured HTTP proxy (which
        # could be this very proxy), nor pick up a CA bundle from the environment.
        session.trust_env = False
        # hvac prefers a given session's `verify` over its own argument: set it here.
        session.verify = str(config.ca_file) if config.ca_file is not None else True
        self._client = hvac.Client(
            url=config.url,
            token="",  # not VAULT_TOKEN or ~/.vault-token: only the configured auth
            verify=session.verify,
            timeout=config.timeout,
            namespace=config.namespace,
            session=session,
            # A redirect would carry X-Vault-Token to wherever it points.
            allow_redirects=False,
        )
        self._auth_lock = asyncio.Lock()
        self._generation = 0  # bumped on each login, to collapse concurrent re-logins
        # The token file as the current login read it.
        self._token_seen = Snapshot.unread(p for p in (config.token_file,) if p is not None)
        self._lease = 0.0
        self._renewable = False
        self._relogged = asyncio.Event()
        self._renewer: asyncio.Task[None] | None = None

    async def fetch(self, ref: SecretRef) -> tuple[Secret, float]:
        if ref.store != self.scheme or ref.field is None:
            raise SecretConfigError(f"{ref} is not a vault reference with a #field")
        await self._ensure_login()
        generation = self._generation
        try:
            data, lease = await self._read(ref.path)
        except SecretDenied:
            # A 403 also means an expired or revoked token: log in again once, but only
            # when the token itself is the problem, not the policy.
            if not await self._token_rejected():
                raise
            async with self._auth_lock:
                if generation == self._generation:
                    await self._login()
            try:
                data, lease = await self._read(ref.path)
            except SecretDenied:
                # Once only: a token refused straight after its login will be refused again.
                raise SecretDenied(
                    f"vault denied the read of {ref.path} again after logging in again"
                ) from None
        if ref.field not in data:
            raise SecretNotFound(f"vault secret {ref.path} has no field {ref.field!r}")
        value = data[ref.field]
        if not isinstance(value, str):
            raise SecretConfigError(f"vault secret {ref.path} field {ref.field!r} is not a string")
        return Secret(value), lease

    async def write(self, ref: SecretRef, value: str) -> None:
        """Set one field of a KV secret (a rotated refresh token), keeping its other fields:
        on KV v2 with check-and-set on the version read, so a write between the two is not
        lost but makes this one fail."""
        if ref.store != self.scheme or ref.field is None:
            raise SecretConfigError(f"{ref} is not a vault reference with a #field")
        await self._ensure_login()
        version, mount, secret_path = kv_location(ref.path)
        kv = self._client.secrets.kv
        what = f"write of {ref.path}"
        if version == 2:
            response = await self._call(f"read of {ref.path}", kv.v2.read_secret_version,
                                        path=secret_path, mount_point=mount,
                                        raise_on_deleted_version=True)
            data, current = _dig(response, "data", "data"), _dig(response, "data", "metadata",
                                                                 "version")
            if not isinstance(data, dict) or not isinstance(current, int):
                raise SecretUnavailable(f"vault answered the {what} with an unexpected shape")
            await self._call(what, kv.v2.create_or_update_secret, path=secret_path,
                             secret={**data, ref.field: value}, cas=current, mount_point=mount)
        else:
            data, _ = await self._read(ref.path)
            await self._call(what, kv.v1.create_or_update_secret, path=secret_path,
                             secret={**data, ref.field: value}, mount_point=mount)

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
            self._renewer = None
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.adapter.close()

    async def _read(self, path: str) -> tuple[dict[str, object], float]:
        version, mount, secret_path = kv_location(path)
        kv = self._client.secrets.kv
        what = f"read of {path}"
        if version == 2:
            response = await self._call(
                what,
                kv.v2.read_secret_version,
                path=secret_path,
                mount_point=mount,
                raise_on_deleted_version=True,
            )
            data = _dig(response, "data", "data")
        else:
            response = await self._call(
                what, kv.v1.read_secret, path=secret_path, mount_point=mount
            )
            data = _dig(response, "data")
        if not isinstance(data, dict):
            raise SecretUnavailable(f"vault answered the {what} with an unexpected shape")
        # KV v2 reports lease_duration 0: no opinion, the cache TTL decides.
        lease = _dig(response, "lease_duration")
        return data, float(lease) if isinstance(lease, int | float) and lease > 0 else math.inf

    async def _ensure_login(self) -> None:
        if self._generation and not self._token_file_changed():
            return
        async with self._auth_lock:
            if self._generation and not self._token_file_changed():
                return
            await self._login()
        if self._renewer is None:
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())

    def _token_file_changed(self) -> bool:
        path = self.config.token_file
        if self.config.auth != "token" or path is None:
            return False
        now = self._token_seen.now()
        if not self._token_seen.changed(now):
            return False
        if now != self._token_seen.identities:
            return True
        # Unchanged to a stat, but written too recently for that to mean unchanged content:
        # what the file holds decides, not another login (the first fetches after a token is
        # written would all log in again).
        try:
            same = _read_credential(path, "token file") == self._client.token
        except SecretError:
            return True  # the login says why
        if same:
            self._token_seen = self._token_seen.retake(now)
        return not same

    async def _token_rejected(self) -> bool:
        try:
            await self._call("token lookup", self._client.auth.token.lookup_self)
        except SecretDenied:
            return True
        return False

    async def _login(self) -> None:
        """Log in with the configured method; callers hold the auth lock."""
        cfg = self.config
        client = self._client
        if cfg.auth == "token":
            assert cfg.token_file is not None  # guaranteed by VaultConfig
            seen = self._token_seen.now()
            client.token = _read_credential(cfg.token_file, "token file")
            info = await self._call("token lookup", client.auth.token.lookup_self)
            self._token_seen = self._token_seen.retake(seen)
            ttl, renewable = _dig(info, "data", "ttl"), _dig(info, "data", "renewable")
        else:
            if cfg.auth == "approle":
                secret_id = (
                    _read_credential(cfg.secret_id_file, "secret_id file")
                    if cfg.secret_id_file is not None
                    else None
                )
                call: Callable[..., Any] = functools.partial(
                    client.auth.approle.login, role_id=cfg.role_id, secret_id=secret_id
                )
            else:
                # Service-account tokens rotate: read the JWT afresh for every login.
                jwt = _read_credential(cfg.jwt_file, "service account token file")
                call = functools.partial(client.auth.kubernetes.login, role=cfg.role, jwt=jwt)
            response = await self._call(f"{cfg.auth} login", call, mount_point=cfg.mount)
            ttl, renewable = (
                _dig(response, "auth", "lease_duration"),
                _dig(response, "auth", "renewable"),
            )
        self._lease = float(ttl) if isinstance(ttl, int | float) else 0.0
        self._renewable = renewable is True
        self._generation += 1
        self._relogged.set()
        log.info("vault: logged in", extra={
            "auth": cfg.auth, "lease_seconds": self._lease, "renewable": self._renewable})

    async def _renew_loop(self) -> None:
        """Renew at half the lease; when renewal fails, log in again; retry on failure."""
        delay = self._lease / 2
        while True:
            self._relogged.clear()
            try:
                # A login elsewhere (token file change, 403 recovery) restarts the clock.
                # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancel (close())
                # that arrives in the loop turn the event is set, and close() then hangs.
                async with asyncio.timeout(delay if delay > 0 else None):
                    await self._relogged.wait()
                delay = self._lease / 2
                continue
            except TimeoutError:
                pass
            try:
                async with self._auth_lock:
                    delay = await self._refresh_token()
            except Exception as exc:
                # Anything unforeseen would end renewal for good and let the token lapse. Named
                # by type only: its text could carry what Vault answered.
                log.error("vault: token refresh failed; retrying",
                          extra={"error_type": type(exc).__name__})
                delay = RETRY_DELAY
            self._relogged.clear()

    async def _refresh_token(self) -> float:
        if self._renewable:
            try:
                response = await self._call("token renewal", self._client.auth.token.renew_self)
            except SecretError as exc:
                log.warning("vault: token renewal failed; logging in again",
                            extra={"error": str(exc)})
            else:
                lease = _dig(response, "auth", "lease_duration")
                self._lease = float(lease) if isinstance(lease, int | float) else 0.0
                self._renewable = _dig(response, "auth", "renewable") is True
                return self._lease / 2
        try:
            await self._login()
        except SecretError as exc:
            log.error("vault: login after a failed renewal failed", extra={"error": str(exc)})
            return min(RETRY_DELAY, max(self._lease / 2, 0.05))
        return self._lease / 2

    async def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, functools.partial(fn, **kwargs))
        except hvac.exceptions.VaultError as exc:
            raise _translate_vault_error(what, exc) from None
        except requests.exceptions.JSONDecodeError:
            raise SecretUnavailable(f"vault {what}: answer is not JSON") from None
        except requests.exceptions.SSLError:
            raise SecretUnavailable(f"vault {what}: TLS verification failed") from None
        except requests.exceptions.Timeout:
            raise SecretUnavailable(
                f"vault {what}: no answer within {self.config.timeout}s"
            ) from None
        except requests.exceptions.RequestException as exc:
            raise SecretUnavailable(
                f"vault {what}: connection failed ({type(exc).__name__})"
            ) from None


def _translate_vault_error(what: str, exc: hvac.exceptions.VaultError) -> SecretError:
    # Vault's own error strings are left out: the message may reach a client.
    if isinstance(exc, hvac.exceptions.Forbidden | hvac.exceptions.Unauthorized):
        return SecretDenied(f"vault denied the {what} (permission denied)")
    if isinstance(exc, hvac.exceptions.InvalidRequest):
        return SecretDenied(f"vault rejected the {what} (invalid request)")
    if isinstance(exc, hvac.exceptions.InvalidPath):
        return SecretNotFound(f"vault has nothing at the {what} (404)")
    if isinstance(exc, hvac.exceptions.VaultDown):
        return SecretUnavailable(f"vault is sealed or down during the {what} (503)")
    return SecretUnavailable(f"vault failed the {what} ({type(exc).__name__})")


def _dig(obj: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _read_credential(path: Path, what: str) -> str:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise SecretUnavailable(f"vault {what} {path} cannot be read: {reason}") from None
    if not value:
        raise SecretUnavailable(f"vault {what} {path} is empty")
    return value
