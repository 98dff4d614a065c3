"""What every injection processor is and can do (`Processor`), and the text rules their settings
and secrets share.

A processor is one way a secret goes into an HTTP request. Two paths inject secrets and both use
these, so the rules exist once: the token path (the processor and secret sealed in a token) and
the proxy's broker (processors built from rules, secrets from a secret store). The processors'
JSON form is the `processor` object of docs/token-format.md §4; rules use the same shape.

Each processor is a frozen dataclass whose fields are its settings, checked when it is built,
with its behaviour as methods: which secrets it takes, what it writes and how, and how
`sealgate rules explain` describes it. Callers ask it; none of them asks which processor it is.
The types are named by `kind` in the registry (`processors/__init__.py`).

No error raised here quotes or chains the secret.
"""

from __future__ import annotations

import re
import time
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import MISSING, dataclass
from dataclasses import fields as dataclass_fields
from typing import ClassVar, Final, Protocol, Self

from .. import jsonfields
from ..awskeys import AssumeRole
from ..errors import ProcessorInvalid, SecretInvalid
from ..httprequest import MutableRequest

__all__ = [
    "MAX_SECRET_LENGTH",
    "VISIBLE",
    "Exchange",
    "FixedHeaderProcessor",
    "Processor",
    "TokenExchange",
    "check_format",
    "check_header_name",
    "check_verbatim_secret",
    "unicode_problem",
]

MAX_SECRET_LENGTH: Final = 4096

_TCHAR: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
VISIBLE: Final = re.compile(r"[\x21-\x7e]+")
_PRINTABLE: Final = re.compile(r"[\x20-\x7e]+")
# Headers the proxy itself owns or that frame the message: a processor must not be able to set
# them.
_FORBIDDEN_HEADERS: Final = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "expect",
    }
)
_FORBIDDEN_HEADER_PREFIXES: Final = ("proxy-", "sealgate-", "x-sealgate-")
_DISALLOWED_CATEGORIES: Final = frozenset({"Cc", "Cs", "Zl", "Zp"})


# --- text rules -------------------------------------------------------------------------------


def check_header_name(name: str, what: str) -> None:
    if not _TCHAR.fullmatch(name):
        raise ProcessorInvalid(f"{what} must be an HTTP header name of 1-64 token characters")
    lowered = name.lower()
    if lowered in _FORBIDDEN_HEADERS or lowered.startswith(_FORBIDDEN_HEADER_PREFIXES):
        # Safe to quote: it matched the 64 token characters above.
        raise ProcessorInvalid(f"{what} {name!r} is a header a processor may not set")


def check_format(value: str, slot: str, what: str) -> None:
    if not _PRINTABLE.fullmatch(value) or len(value) > 256 or value != value.strip(" "):
        raise ProcessorInvalid(
            f"{what} must be 1-256 printable ASCII characters, not starting or ending with a space"
        )
    if value.count(slot) != 1:
        raise ProcessorInvalid(f"{what} must contain {slot} exactly once")


def unicode_problem(value: str, max_length: int, *, allow_empty: bool = False) -> str | None:
    """What is wrong with `value` as free text, or None."""
    if (not value and not allow_empty) or len(value) > max_length:
        return f"must be {0 if allow_empty else 1}-{max_length} characters"
    # Printable ASCII is the common case and needs no per-character lookup.
    if not (value.isascii() and value.isprintable()) and any(
        unicodedata.category(char) in _DISALLOWED_CATEGORIES for char in value
    ):
        return "contains a control or surrogate character"
    return None


def check_verbatim_secret(secret: str, kind: str) -> None:
    """SecretInvalid unless `secret` may go into a header value as it is: visible ASCII, so
    it cannot end or split the header."""
    if not VISIBLE.fullmatch(secret) or len(secret) > MAX_SECRET_LENGTH:
        raise SecretInvalid(
            f"secret for a {kind} processor must be "
            f"1-{MAX_SECRET_LENGTH} visible ASCII characters"
        )


# --- the processor ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Processor(ABC):
    """One way a secret goes into a request; a subclass's dataclass fields are its settings
    (strings, as the JSON form carries them), checked in its `__post_init__`."""

    kind: ClassVar[str]  # its `type` in the JSON form, and its name everywhere else
    # Fields holding a comma-separated list, which rules may also write as a YAML list.
    list_fields: ClassVar[frozenset[str]] = frozenset()
    # `sealgate mint --inject <kind>`: each field the command line sets -> its option's dest,
    # and the value a field takes when its option is not given, where that differs from the
    # field's own default (a required field the command line defaults).
    cli_options: ClassVar[Mapping[str, str]] = {}
    cli_defaults: ClassVar[Mapping[str, str]] = {}

    # -- its settings --------------------------------------------------------------------------

    @classmethod
    def required_fields(cls) -> list[str]:
        """Its settings that have no default, in order."""
        return [f.name for f in dataclass_fields(cls) if f.default is MISSING]

    @classmethod
    def from_fields(cls, value: Mapping[str, object]) -> Self:
        """Built from its JSON form (`type` is allowed, and not read): unknown or missing
        fields, non-string values and settings it refuses are ProcessorInvalid."""
        names = [f.name for f in dataclass_fields(cls)]
        problem = (jsonfields.unknown(value, {"type", *names})
                   or jsonfields.missing(value, cls.required_fields()))
        if problem:
            raise ProcessorInvalid(f"{cls.kind} processor: {problem}")
        arguments: dict[str, str] = {}
        for name in names:
            if name in value:
                item = value[name]
                if not isinstance(item, str):
                    raise ProcessorInvalid(f"{cls.kind} processor: {name} must be a string")
                arguments[name] = item
        return cls(**arguments)

    def to_object(self) -> dict[str, object]:
        """The JSON form `processor_from_object` reads; unset optional fields are left out."""
        obj: dict[str, object] = {"type": self.kind}
        for spec in dataclass_fields(self):
            value = getattr(self, spec.name)
            if value is not None:
                obj[spec.name] = value
        return obj

    # -- its secret ----------------------------------------------------------------------------

    def check_secret(self, secret: str) -> None:
        """Raise SecretInvalid unless it can carry `secret`: here 1-4096 characters, no control
        or surrogate characters; stricter where the secret goes into a header verbatim."""
        if unicode := unicode_problem(secret, MAX_SECRET_LENGTH):
            raise SecretInvalid(f"secret {unicode}")

    def needles(self, secret: str) -> tuple[str, ...]:
        """The forms of `secret`, besides itself, an echo of what it writes would give it away
        in (scrubbed from the response as the secret is)."""
        return ()

    def role(self, secret: str) -> AssumeRole | None:
        """The role whose keys go in instead of `secret`'s own, which the proxy gets from STS
        first (aws-sigv4 only)."""
        return None

    @property
    def token_exchange(self) -> TokenExchange | None:
        """Itself, when what goes in is a token the proxy obtains with the secret first
        (`exchange.ExchangeProcessor`)."""
        return None

    # -- what it writes ------------------------------------------------------------------------

    @property
    @abstractmethod
    def target(self) -> str:
        """What it writes: a header name, lower-case, or `?param` for a query parameter."""

    @abstractmethod
    def describe(self) -> str:
        """How it puts a secret in, for a reviewer (`sealgate rules explain`), never the secret
        itself: `Authorization: Bearer <secret>`."""

    def fixed_header(self, secret: str) -> tuple[str, str] | None:
        """The one header it writes, when that does not depend on the request: worked out once
        per secret, then written with the other header edits in one pass."""
        return None

    def needs_body(self, request: MutableRequest, now: float) -> bool:
        """Whether writing into `request` needs its whole body (a signature over it)."""
        return False

    def sent(self, request: MutableRequest) -> bool:
        """Whether the sandbox sent what this overwrites (for the audit line)."""
        return bool(request.get_header_values(self.target))

    def inject(self, secret: str, request: MutableRequest, *, now: float | None = None
               ) -> str | None:
        """Put `secret` into `request` (`now`: the clock a signature's date is checked against).
        Raises SecretInvalid (checked first, so the request is untouched) or another
        InjectionError. Returns what else it wrote that an echo must not give away (a
        signature that is a capability), or None."""
        self.check_secret(secret)
        return self.write(secret, request, time.time() if now is None else now)

    @abstractmethod
    def write(self, secret: str, request: MutableRequest, now: float) -> str | None:
        """`inject` for a secret already checked."""


@dataclass(frozen=True)
class FixedHeaderProcessor(Processor):
    """A processor that writes one header, the same for every request."""

    @abstractmethod
    def fixed_header(self, secret: str) -> tuple[str, str]:
        """The header's name, as it is to be written, and its value."""

    def write(self, secret: str, request: MutableRequest, now: float) -> str | None:
        name, value = self.fixed_header(secret)
        request.set_header_values(name, [value])
        return None


# --- token exchanges --------------------------------------------------------------------------


class Exchange(ABC):
    """One secret's exchange, worked out: what the proxy sends where, and what of the secret
    must be scrubbed from what comes back."""

    @property
    @abstractmethod
    def endpoint(self) -> str:
        """The https URL the token is asked for at (POST)."""

    @abstractmethod
    def token_request(self, now: float) -> tuple[dict[str, str], bytes]:
        """The call's headers and body; `now` dates the JWTs it signs."""

    @abstractmethod
    def needles(self) -> tuple[str, ...]:
        """What of the secret an echo must not give away (refresh token, client secret, the
        private key)."""

    def rotated(self, refresh_token: str) -> str | None:
        """The secret's text once an answer brought `refresh_token`, if that replaces the
        secret's own; None when nothing rotates."""
        return None


class TokenExchange(Protocol):
    """A processor whose secret is exchanged for the token that goes in, as the proxy sees it
    (`exchange.ExchangeProcessor` is every such processor's base)."""

    @property
    def kind(self) -> str: ...

    @property
    def carrier(self) -> Processor:
        """What puts the token obtained in."""

    def exchange(self, secret: str) -> Exchange:
        """`secret`'s exchange; GrantError naming what is wrong with the secret."""
