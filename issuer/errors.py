"""Why a sealed token is refused: one class per reason code of docs/token-format.md §7.

Messages never quote the secret; other fields they may quote, shortened (`jsonfields.show`).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "TokenBinding",
    "TokenError",
    "TokenExpired",
    "TokenInapplicable",
    "TokenInvalid",
    "TokenMalformed",
    "TokenScope",
]


class TokenError(Exception):
    """Why a token was refused. `reason` is the machine code, `status` the HTTP status to answer."""

    reason: ClassVar[str] = "token_error"
    status: ClassVar[int] = 400


class TokenMalformed(TokenError):
    """Bad prefix, shape, base64, size, JSON, schema, unknown field or unknown processor."""

    reason = "token_malformed"
    status = 400


class TokenInvalid(TokenError):
    """Unknown kid, decryption failure, or the sealed kid differs from the visible one."""

    reason = "token_invalid"
    status = 400


class TokenExpired(TokenError):
    """Outside the validity window: past `exp`, or before `nbf`/`iat` (with clock skew)."""

    reason = "token_expired"
    status = 401


class TokenScope(TokenError):
    """The request's host, port, method or path is outside what the token allows."""

    reason = "token_scope"
    status = 403


class TokenBinding(TokenError):
    """The token's binding (sandbox, policy or proxy bearer secret) is not met."""

    reason = "token_binding"
    status = 407


class TokenInapplicable(TokenError):
    """The request lacks what the processor needs (the placeholder it replaces)."""

    reason = "token_inapplicable"
    status = 400

