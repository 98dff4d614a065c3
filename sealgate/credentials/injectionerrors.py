"""Why a secret cannot be injected: the errors of `issuer.processors` and `issuer.injection`
(re-exported by `issuer.processors`), apart so that every processor module can raise them.
No message quotes a secret."""

from __future__ import annotations

from sealgate.reasons import Reason, SealgateError

__all__ = ["InjectionError", "ProcessorInvalid", "RequestInapplicable", "SecretInvalid"]


class InjectionError(SealgateError):
    """Why a secret cannot be injected: one of the subclasses, each with its reason."""


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
