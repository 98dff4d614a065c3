"""Why a credential is refused: one root, `CredentialError`, and beneath it why a sealed token
is refused (`TokenError`, one class per reason of docs/token-format.md §7), why a secret
cannot be injected (`InjectionError`), and why a secret store cannot give a secret
(`SecretError`; the stores are the proxy's). The errors of grants, SigV4 and key files, kept
beside their code, are `CredentialError`s too.

Each carries its `Reason` (sealgate.reasons), and so the status the proxy answers with; the
issuer reports them as its own refusals. Messages never quote a secret; other fields they may
quote, shortened (`jsonfields.show`).
"""

from __future__ import annotations

from sealgate.reasons import Reason, SealgateError

__all__ = [
    "CredentialError",
    "InjectionError",
    "ProcessorInvalid",
    "RequestInapplicable",
    "SecretConfigError",
    "SecretDenied",
    "SecretError",
    "SecretInvalid",
    "SecretNotFound",
    "SecretUnavailable",
    "TokenBinding",
    "TokenError",
    "TokenExpired",
    "TokenInapplicable",
    "TokenInvalid",
    "TokenMalformed",
    "TokenScope",
]


class CredentialError(SealgateError):
    """Why a credential, a token or a key cannot be used: every error of this library."""


# --- tokens -----------------------------------------------------------------------------------


class TokenError(CredentialError):
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


# --- injection --------------------------------------------------------------------------------


class InjectionError(CredentialError):
    """Why a secret cannot be injected: one of the subclasses, each with its reason. Token
    parsing reports them as `TokenMalformed`, the proxy under their own reasons."""


class ProcessorInvalid(InjectionError):
    """A processor's settings break its rules: unknown type or field, a header a processor may
    not set, a format without its slot, and so on."""

    reason = Reason.PROCESSOR_INVALID


class SecretInvalid(InjectionError):
    """The processor cannot carry this secret (empty, too long, or characters that could end or
    split a header). The message never quotes the secret."""

    reason = Reason.SECRET_INVALID


class RequestInapplicable(InjectionError):
    """The request lacks what the processor needs (the placeholder it replaces), or is one it
    cannot write to unambiguously (a query in a target with a `#`)."""

    reason = Reason.REQUEST_INAPPLICABLE


# --- secret stores ----------------------------------------------------------------------------


class SecretError(CredentialError):
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
