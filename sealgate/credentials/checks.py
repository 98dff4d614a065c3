"""Using an opened token: the checks of docs/token-format.md §7 that the proxy runs on unsealed
claims against one request, after `token.unseal`: the time window, the binding, the scope.

Pure functions of the claims, the request and the clock, so the proxy may run them again for
every request and cache nothing but their inputs.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence
from typing import Final, assert_never

from sealgate.hostname import HostError, canonical_name

from .errors import TokenBinding, TokenExpired, TokenScope
from .jsonfields import show
from .scope import path_allowed
from .token import (
    AuthDigestBinding,
    Claims,
    PolicyBinding,
    SandboxBinding,
)

__all__ = ["CLOCK_SKEW_SECONDS", "check_binding", "check_scope", "check_time", "validity"]

# Clocks of the issuer and the proxy may disagree by this much in either direction.
CLOCK_SKEW_SECONDS: Final = 30


def validity(claims: Claims) -> tuple[int, int]:
    """The Unix seconds [start, end) in which the token may be used, clock skew included."""
    start = claims.iat if claims.nbf is None else max(claims.iat, claims.nbf)
    return start - CLOCK_SKEW_SECONDS, claims.exp + CLOCK_SKEW_SECONDS


def check_time(claims: Claims, *, now: float | None = None) -> None:
    moment = time.time() if now is None else now
    start, end = validity(claims)
    if moment >= end:
        raise TokenExpired("token has expired")
    if moment < start:
        raise TokenExpired("token is not valid yet")


def check_scope(claims: Claims, host: str, port: int, method: str, path: str) -> None:
    """Raise TokenScope unless host:port, method and path are all inside the token.

    `host` is read as the proxy reads one (`hostname.canonical_name`: case, a trailing dot and
    IPv6 brackets do not matter). Path prefixes match whole segments (`/v1/charges` allows
    `/v1/charges/ch_1`, not `/v1/chargesX`), and a path with dot segments or encoded slashes
    never matches."""
    try:
        target = canonical_name(host)
    except HostError:
        # Not echoed: hostname.py refuses it for what it might carry (userinfo, a path).
        raise TokenScope("the request's host is not one a token can allow") from None
    if not any(pattern.matches(target, port) for pattern in claims.hosts):
        raise TokenScope(f"host {show(target.name, 80)} port {port} is not allowed by this token")
    if claims.methods is not None and method not in claims.methods:
        raise TokenScope(f"method {show(method, 20)} is not allowed by this token")
    if claims.paths is not None and not path_allowed(claims.paths, path):
        raise TokenScope(f"path {show(path, 80)} is not allowed by this token")


def _bearer_credentials(values: Sequence[str]) -> list[str]:
    found = []
    for value in values:
        scheme, _, credential = value.strip().partition(" ")
        if scheme.lower() == "bearer" and credential.strip():
            found.append(credential.strip())
    return found


def check_binding(
    claims: Claims,
    *,
    sandbox_id: str | None,
    policy: str | None,
    proxy_authorization: Sequence[str],
) -> None:
    """Raise TokenBinding unless the request meets the token's binding (if any).

    For an auth digest binding, any one `Proxy-Authorization: Bearer` value whose SHA-256 matches
    is enough; other schemes (the proxy's own Basic identity) are ignored."""
    binding = claims.binding
    match binding:
        case None:
            return
        case SandboxBinding(sandbox=bound):
            if sandbox_id is None or not hmac.compare_digest(
                sandbox_id.encode("utf-8"), bound.encode("utf-8")
            ):
                raise TokenBinding("token is bound to another sandbox")
        case PolicyBinding(policy=bound):
            if policy is None or not hmac.compare_digest(
                policy.encode("utf-8"), bound.encode("utf-8")
            ):
                raise TokenBinding("token is bound to another policy")
        case AuthDigestBinding(auth_sha256=digest):
            expected = bytes.fromhex(digest)
            matched = False
            for credential in _bearer_credentials(proxy_authorization):
                actual = hashlib.sha256(credential.encode("utf-8")).digest()
                matched |= hmac.compare_digest(actual, expected)
            if not matched:
                raise TokenBinding(
                    "token needs Proxy-Authorization: Bearer with the secret it was bound to"
                )
        case _:
            assert_never(binding)
