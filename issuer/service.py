"""The token issuer service without HTTP: keys, callers, rate limits and the audit log, and what
one mint does with them (`Issuer`). `webapp.py` serves it; docs/issuer.md describes both.

The service holds public keys only: it can seal tokens but never open one. Claims are validated
by the token module itself (`claims_from_object`), so the service cannot mint a token the proxy
would read differently.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TypeVar

from sealgate import credentials as tk
from sealgate.audit import AuditLog
from sealgate.credentials import keys

from . import callers as cl
from .mintrequest import (
    InvalidRequest,
    RateLimited,
    Unauthenticated,
    Unavailable,
    claims_for,
    parse_body,
    scrub,
)

__all__ = ["Issuer"]

_MAX_API_KEY: Final = 512

_T = TypeVar("_T")
logger = logging.getLogger("sealgate.issuer")


def _stamp(path: Path, suffix: str | None) -> object:
    """What changes when `path` (a file, or the `suffix` files in a directory) changes."""
    try:
        if suffix is None:
            info = path.stat()
            return (info.st_ino, info.st_mtime_ns, info.st_size)
        with os.scandir(path) as listing:
            return sorted(
                (entry.name, entry.stat().st_mtime_ns, entry.stat().st_size)
                for entry in listing
                if entry.name.endswith(suffix)
            )
    except OSError:
        return None


class Issuer:
    """Keys, callers, rate limits and the audit log: everything a mint needs but HTTP."""

    def __init__(
        self,
        keys_dir: Path,
        callers_path: Path,
        audit: AuditLog,
        *,
        clock: Callable[[], float] = time.time,
        rate_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys_dir = keys_dir
        self.callers_path = callers_path
        self.audit = audit
        self._clock = clock
        self.limiter = cl.RateLimiter(rate_clock)
        # Problems of the last reload, by what failed; the previous state stays in force.
        self.problems: dict[str, str] = {}
        self._keys_stamp = _stamp(keys_dir, keys.PUBLIC_SUFFIX)
        self._callers_stamp = _stamp(callers_path, None)
        self.public_keys = self._load_keys()
        self.callers = cl.load_callers(callers_path)

    @property
    def current_key(self) -> keys.PublicKeyEntry:
        return self.public_keys[0]

    def _load_keys(self) -> tuple[keys.PublicKeyEntry, ...]:
        entries = keys.public_entries(self.keys_dir)
        if not entries:
            raise keys.NoKeysError(f"no public keys (*{keys.PUBLIC_SUFFIX}) in {self.keys_dir}")
        return tuple(keys.newest_first(entries))

    def reload(self, why: str) -> None:
        """Re-read the key directory and the callers file. What fails to load keeps its previous
        state, is logged, and makes /healthz answer 503 until a reload succeeds."""
        self._keys_stamp = _stamp(self.keys_dir, keys.PUBLIC_SUFFIX)
        self._callers_stamp = _stamp(self.callers_path, None)
        loaded = self._attempt("keys", why, self._load_keys, keys.KeyFileError)
        if loaded is not None:
            if loaded != self.public_keys:
                logger.info("keys reloaded",
                            extra={"why": why, "kid": loaded[0].kid, "keys": len(loaded)})
            self.public_keys = loaded
        registry = self._attempt(
            "callers", why, lambda: cl.load_callers(self.callers_path), cl.CallersFileError
        )
        if registry is not None:
            self.callers = registry
            self.limiter.forget_except(registry.names)
            logger.info("callers reloaded", extra={"why": why, "callers": len(registry)})

    def _attempt(
        self, part: str, why: str, load: Callable[[], _T], expected: type[Exception]
    ) -> _T | None:
        """`load()`, or None with the previous state kept, the failure logged and /healthz
        answering 503 until a reload of `part` succeeds. An `expected` error says what is
        wrong; anything else is named by type only (its text could quote the file)."""
        try:
            loaded = load()
        except Exception as exc:
            problem = str(exc) if isinstance(exc, expected) else f"{type(exc).__name__} loading it"
            self.problems[part] = problem
            logger.error("reload failed, keeping the previous",
                         extra={"part": part, "why": why, "error": problem})
            return None
        self.problems.pop(part, None)
        return loaded

    def changed(self) -> bool:
        return (
            _stamp(self.keys_dir, keys.PUBLIC_SUFFIX) != self._keys_stamp
            or _stamp(self.callers_path, None) != self._callers_stamp
        )

    async def watch(self, interval: float) -> None:
        """Reload whenever the key directory or the callers file changes (polled), until
        cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                if self.changed():
                    self.reload("files changed")
            except Exception as exc:
                # Keep watching: one odd failure must not silently end reloads for good.
                logger.error("reload failed", extra={"error_type": type(exc).__name__})

    def authenticate(self, authorization: Sequence[str], subject: str | None) -> cl.Caller:
        """The caller named by `Authorization: Bearer <api key>` and/or the verified client
        certificate subject. Each credential presented must name a caller, and the same one."""
        found: list[cl.Caller | None] = []
        if len(authorization) > 1:
            raise Unauthenticated("send one Authorization header")
        if authorization:
            scheme, _, credential = authorization[0].strip().partition(" ")
            credential = credential.strip()
            if (
                scheme.lower() != "bearer"
                or not 0 < len(credential) <= _MAX_API_KEY
                or not (credential.isascii() and credential.isprintable())
            ):
                raise Unauthenticated("Authorization must be: Bearer <api key>")
            found.append(self.callers.by_api_key(credential))
        if subject is not None:
            found.append(self.callers.by_subject(subject))
        if not found:
            raise Unauthenticated("no credentials: send Authorization: Bearer <api key>")
        first = found[0]
        if first is None or any(caller is not first for caller in found):
            raise Unauthenticated("unknown credentials")
        return first

    def mint(
        self, caller: cl.Caller, body: bytes, record: dict[str, object]
    ) -> tuple[str, tk.Claims]:
        """Rate-limit, parse, validate and check `body` against `caller`'s limits, then seal.
        Fills the audit `record` with what it learns. Raises MintRefused or NotPermitted."""
        wait = self.limiter.acquire(caller)
        if wait > 0:
            raise RateLimited(max(1, math.ceil(wait)))
        request = parse_body(body)
        key = self.current_key
        now = int(self._clock())
        claims = claims_for(request, key.kid, now)
        record.update(
            kid=claims.kid,
            hosts=[scrub(str(pattern), claims.secret) for pattern in claims.hosts],
            processor=claims.processor.kind,
            ttl=claims.exp - claims.iat,
            binding=cl.binding_kind(claims.binding),
            jti=claims.jti,
        )
        caller.check(claims, claims.exp - claims.iat)
        if not self.audit.healthy:
            raise Unavailable("the audit log cannot be written; not minting")
        try:
            token = tk.seal(claims, key)
        except tk.TokenError as exc:
            raise InvalidRequest(str(exc)) from None
        return token, claims
