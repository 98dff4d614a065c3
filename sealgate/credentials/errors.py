"""Why a sealed token is refused: one class per reason of docs/token-format.md §7.

Each carries its `Reason` (sealgate.reasons), and so the status the proxy answers with; the
issuer reports them as its own refusals. Messages never quote the secret; other fields they may
quote, shortened (`jsonfields.show`).
"""

from __future__ import annotations

from sealgate.reasons import Reason, SealgateError

__all__ = [
    "TokenBinding",
    "TokenError",
    "TokenExpired",
    "TokenInapplicable",
    "TokenInvalid",
    "TokenMalformed",
    "TokenScope",
]


class TokenError(SealgateError):
    """Why a token was refused: one of the subclasses, each with its reason."""


class TokenMalformed(TokenError):
    """Bad prefix, shape, base64, size, JSON, schema, unknown field or unknown processor."""

    reason = Reason.TOKEN_MALFORMED


class TokenInvalid(TokenError):
    """Unknown kid, decryption failure, or the sealed kid differs from the visible one."""

    reason = Reason.TOKEN_INVALID


class TokenExpired(TokenError):
    """Outside the validity window: past `exp`, or before `nbf`/`iat` (with clock skew)."""

    reason = Reason.TOKEN_EXPIRED


class TokenScope(TokenError):
    """The request's host, port, method or path is outside what the token allows."""

    reason = Reason.TOKEN_SCOPE


class TokenBinding(TokenError):
    """The token's binding (sandbox, policy or proxy bearer secret) is not met."""

    reason = Reason.TOKEN_BINDING


class TokenInapplicable(TokenError):
    """The request lacks what the processor needs (the placeholder it replaces)."""

    reason = Reason.TOKEN_INAPPLICABLE
