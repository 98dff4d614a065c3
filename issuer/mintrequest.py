"""A mint request (docs/issuer.md): the body a caller POSTs, read into claims the token module
validates, and every reason a mint is refused.

Nothing here quotes the secret or the API key: messages about other fields go through `scrub`
in case a caller pasted the secret where it does not belong.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Final

from sealgate import credentials as tk
from sealgate.credentials import jsonfields
from sealgate.reasons import Reason, SealgateError

from . import callers as cl

__all__ = [
    "BadJson",
    "BodyTooLarge",
    "InvalidRequest",
    "MintRefused",
    "MissingField",
    "RateLimited",
    "Unauthenticated",
    "Unavailable",
    "UnknownField",
    "claims_for",
    "parse_body",
    "scrub",
    "secret_of",
]

_REALM: Final = 'Bearer realm="sealgate-issuer"'
_BODY_FIELDS: Final = frozenset({"secret", "inject", "hosts", "methods", "paths", "ttl", "binding"})
_REQUIRED_FIELDS: Final = ("secret", "inject", "hosts", "ttl")
_OPTIONAL_CLAIMS: Final = ("methods", "paths", "binding")


class MintRefused(SealgateError):
    """Why a mint request was refused: one of the subclasses, each with its reason (whose
    `.status` the issuer answers with). Messages never contain the secret or the API key."""

    reason = Reason.MINT_REFUSED

    def headers(self) -> Mapping[str, str]:
        return {}


class Unauthenticated(MintRefused):
    reason = Reason.UNAUTHENTICATED

    def headers(self) -> Mapping[str, str]:
        return {"WWW-Authenticate": _REALM}


class RateLimited(MintRefused):
    reason = Reason.RATE_LIMITED

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"rate limit reached; retry in {retry_after} s")
        self.retry_after = retry_after

    def headers(self) -> Mapping[str, str]:
        return {"Retry-After": str(self.retry_after)}


class BodyTooLarge(MintRefused):
    reason = Reason.BODY_TOO_LARGE


class BadJson(MintRefused):
    """Not UTF-8, not JSON, or not a JSON object (strict: no duplicate keys, no floats)."""

    reason = Reason.BAD_JSON


class UnknownField(MintRefused):
    reason = Reason.UNKNOWN_FIELD


class MissingField(MintRefused):
    reason = Reason.MISSING_FIELD


class InvalidRequest(MintRefused):
    """A field's value breaks the token format's rules (the token module's own message)."""

    reason = Reason.INVALID_REQUEST


class Unavailable(MintRefused):
    """The audit log cannot be written: no token is issued that nobody could account for."""

    reason = Reason.AUDIT_UNAVAILABLE


# --- the body ---------------------------------------------------------------------------------


def parse_body(data: bytes) -> dict[str, object]:
    # Errors are raised outside the except blocks: a JSON decode error holds the whole document
    # (and so the secret) and must not ride along as __context__.
    problem = ""
    try:
        obj = jsonfields.load_json_object(data.decode("utf-8"))
    except UnicodeDecodeError:
        problem = "body is not UTF-8"
    except ValueError as exc:
        problem = f"body is not a valid JSON object: {exc}"
    if problem:
        raise BadJson(problem)
    if unknown := jsonfields.unknown(obj, _BODY_FIELDS):
        raise UnknownField(f"{unknown}; allowed: {', '.join(sorted(_BODY_FIELDS))}")
    if missing := jsonfields.missing(obj, _REQUIRED_FIELDS):
        raise MissingField(missing)
    return obj


def _ttl(value: object) -> int:
    if isinstance(value, str):
        try:
            return cl.parse_duration(value)
        except ValueError as exc:
            raise InvalidRequest(f"ttl: {exc}") from None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidRequest('ttl must be a duration like "15m" or a number of seconds')


def claims_for(request: Mapping[str, object], kid: str, now: int) -> tk.Claims:
    ttl = _ttl(request["ttl"])
    if ttl <= 0:
        raise InvalidRequest("ttl must be more than 0")
    obj: dict[str, object] = {
        "version": tk.CLAIMS_VERSION,
        "kid": kid,
        "secret": request["secret"],
        "processor": request["inject"],
        "hosts": request["hosts"],
        "exp": now + ttl,
        "iat": now,
        "jti": secrets.token_urlsafe(12),
    }
    obj.update((name, request[name]) for name in _OPTIONAL_CLAIMS if name in request)
    try:
        return tk.claims_from_object(obj)
    except tk.TokenMalformed as exc:
        raise InvalidRequest(str(exc)) from None


def scrub(text: str, secret: object) -> str:
    """Defence in depth: a secret pasted into another field would otherwise come back in the
    message or audit line about that field (lowercased, if it went in as a host name)."""
    if isinstance(secret, str) and len(secret) >= 4:
        return re.sub(re.escape(secret), "[redacted]", text, flags=re.IGNORECASE)
    return text


def secret_of(body: bytes) -> object:
    try:
        return jsonfields.load_json_object(body.decode("utf-8")).get("secret")
    except ValueError:
        return None
