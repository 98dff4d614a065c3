"""Injection processors: how a secret is put into an HTTP request, as data, with their rules.

Two paths inject secrets and both use these, so the rules exist once: the token path (the
processor and secret sealed in a token) and the proxy's broker (processors built from rules,
secrets from a secret store). The processors' JSON form is the `processor` object of
docs/token-format.md §4; rules use the same shape. Doing it to a request is `issuer.injection`.

This module knows nothing of tokens: its errors are `InjectionError`s, which `issuer.token`
reports as `TokenMalformed` and the proxy under their own reasons. No error raised here quotes or
chains the secret.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import MISSING, dataclass
from dataclasses import fields as dataclass_fields
from functools import cached_property
from typing import ClassVar, Final

from . import awskeys, grants, jsonfields
from .exchangeprocessors import (
    EXCHANGED,
    SCHEMES,
    GcpServiceAccountProcessor,
    GitHubAppProcessor,
    OAuth2Processor,
    exchanged_secret,
)
from .injectionerrors import (
    InjectionError,
    ProcessorInvalid,
    RequestInapplicable,
    SecretInvalid,
)

__all__ = [
    "AWS_PLACEHOLDER_KEY_ID",
    "AWS_PLACEHOLDER_SECRET",
    "EXCHANGED",
    "MAX_SECRET_LENGTH",
    "PROCESSOR_TYPES",
    "SCHEMES",
    "AwsSigV4Processor",
    "BasicProcessor",
    "BearerProcessor",
    "GcpServiceAccountProcessor",
    "GitHubAppProcessor",
    "HeaderProcessor",
    "HmacProcessor",
    "InjectionError",
    "OAuth2Processor",
    "PlaceholderProcessor",
    "Processor",
    "ProcessorInvalid",
    "QueryProcessor",
    "RequestInapplicable",
    "SecretInvalid",
    "check_secret",
    "processor_from_object",
    "processor_to_object",
    "target",
]

MAX_SECRET_LENGTH: Final = 4096

_TCHAR: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
_VISIBLE: Final = re.compile(r"[\x21-\x7e]+")
_PRINTABLE: Final = re.compile(r"[\x20-\x7e]+")
_QUERY_NAME: Final = re.compile(r"[A-Za-z0-9._~\[\]-]{1,128}")
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
_AWS_NAME: Final = re.compile(r"[a-z0-9-]{1,64}")  # a region or a service, as scopes spell them
# The key pair a sandbox signs with (docs/rules.md, aws-sigv4). Public on purpose: the proxy
# never checks the sandbox's signature, which proves nothing when everyone knows the key.
AWS_PLACEHOLDER_KEY_ID: Final = "SEALGATEPLACEHOLDER"
AWS_PLACEHOLDER_SECRET: Final = "sealgate-placeholder-secret-access-key"  # noqa: S105 (public)



# --- text rules -------------------------------------------------------------------------------


def _check_header_name(name: str, what: str) -> None:
    if not _TCHAR.fullmatch(name):
        raise ProcessorInvalid(f"{what} must be an HTTP header name of 1-64 token characters")
    lowered = name.lower()
    if lowered in _FORBIDDEN_HEADERS or lowered.startswith(_FORBIDDEN_HEADER_PREFIXES):
        # Safe to quote: it matched the 64 token characters above.
        raise ProcessorInvalid(f"{what} {name!r} is a header a processor may not set")


def _check_format(value: str, slot: str, what: str) -> None:
    if not _PRINTABLE.fullmatch(value) or len(value) > 256 or value != value.strip(" "):
        raise ProcessorInvalid(
            f"{what} must be 1-256 printable ASCII characters, not starting or ending with a space"
        )
    if value.count(slot) != 1:
        raise ProcessorInvalid(f"{what} must contain {slot} exactly once")


def _unicode_problem(value: str, max_length: int, *, allow_empty: bool = False) -> str | None:
    """What is wrong with `value` as free text, or None."""
    if (not value and not allow_empty) or len(value) > max_length:
        return f"must be {0 if allow_empty else 1}-{max_length} characters"
    # Printable ASCII is the common case and needs no per-character lookup.
    if not (value.isascii() and value.isprintable()) and any(
        unicodedata.category(char) in _DISALLOWED_CATEGORIES for char in value
    ):
        return "contains a control or surrogate character"
    return None


# --- processors (data; behaviour lives in `inject`) -------------------------------------------


@dataclass(frozen=True)
class BearerProcessor:
    """Sets `Authorization: Bearer <secret>`."""

    kind: ClassVar[str] = "bearer"
    # The secret goes verbatim into a header value.
    header_secret: ClassVar[bool] = True


@dataclass(frozen=True)
class HeaderProcessor:
    """Sets `<header>: <format with {secret} replaced>`."""

    kind: ClassVar[str] = "header"
    header_secret: ClassVar[bool] = True
    header: str
    format: str

    def __post_init__(self) -> None:
        _check_header_name(self.header, "header processor: header")
        _check_format(self.format, "{secret}", "header processor: format")


@dataclass(frozen=True)
class BasicProcessor:
    """Sets `Authorization: Basic base64(<username>:<secret>)` (UTF-8)."""

    kind: ClassVar[str] = "basic"
    header_secret: ClassVar[bool] = False
    username: str

    def __post_init__(self) -> None:
        problem = _unicode_problem(self.username, 256, allow_empty=True)
        if problem:
            raise ProcessorInvalid(f"basic processor: username {problem}")
        if ":" in self.username:
            raise ProcessorInvalid("basic processor: username must not contain ':'")


@dataclass(frozen=True)
class QueryProcessor:
    """Sets query parameter `<param>=<secret>`, replacing any the request had
    (`set_query_param`)."""

    kind: ClassVar[str] = "query"
    header_secret: ClassVar[bool] = False
    param: str

    def __post_init__(self) -> None:
        if not _QUERY_NAME.fullmatch(self.param):
            raise ProcessorInvalid(
                "query processor: param must be 1-128 characters from A-Z a-z 0-9 . _ ~ - [ ]"
            )


@dataclass(frozen=True)
class HmacProcessor:
    """Sets `<header>: <format with {signature} replaced>`, the signature being
    HMAC-SHA256(key=secret, msg=the exact body, or `message` if given), hex or base64."""

    kind: ClassVar[str] = "hmac-sha256"
    header_secret: ClassVar[bool] = False
    header: str
    format: str
    encoding: str
    message: str | None = None

    def __post_init__(self) -> None:
        _check_header_name(self.header, "hmac-sha256 processor: header")
        _check_format(self.format, "{signature}", "hmac-sha256 processor: format")
        if self.encoding not in ("hex", "base64"):
            raise ProcessorInvalid("hmac-sha256 processor: encoding must be 'hex' or 'base64'")
        if self.message is not None:
            problem = _unicode_problem(self.message, 4096)
            if problem:
                raise ProcessorInvalid(f"hmac-sha256 processor: message {problem}")


@dataclass(frozen=True)
class PlaceholderProcessor:
    """In every value of `<header>`, replaces `placeholder` with the secret. The request must
    carry the placeholder there (RequestInapplicable otherwise)."""

    kind: ClassVar[str] = "placeholder"
    header_secret: ClassVar[bool] = True
    header: str
    placeholder: str

    def __post_init__(self) -> None:
        _check_header_name(self.header, "placeholder processor: header")
        if not _VISIBLE.fullmatch(self.placeholder) or not 8 <= len(self.placeholder) <= 256:
            raise ProcessorInvalid(
                "placeholder processor: placeholder must be 8-256 visible ASCII characters"
            )


def _aws_names(value: str, what: str) -> frozenset[str]:
    names = value.split(",")
    if not all(_AWS_NAME.fullmatch(name) for name in names) or len(names) > 32:
        raise ProcessorInvalid(
            f"aws-sigv4 processor: {what} must be 1-32 names of a-z 0-9 -, comma-separated"
        )
    return frozenset(names)


@dataclass(frozen=True)
class AwsSigV4Processor:
    """Re-signs a request the sandbox signed with AWS Signature Version 4 and the placeholder
    key id: the sandbox's signature is dropped and the request signed again with the secret's
    keys (`issuer.awskeys`), if its credential scope names one of `services` and `regions`
    (comma-separated). Behaviour in `issuer.awsresign`."""

    kind: ClassVar[str] = "aws-sigv4"
    header_secret: ClassVar[bool] = False
    services: str
    regions: str
    placeholder: str = AWS_PLACEHOLDER_KEY_ID

    def __post_init__(self) -> None:
        _aws_names(self.services, "services")
        _aws_names(self.regions, "regions")
        if not re.fullmatch(r"[A-Za-z0-9-]{8,128}", self.placeholder):
            raise ProcessorInvalid(
                "aws-sigv4 processor: placeholder must be 8-128 characters of A-Z a-z 0-9 -"
            )

    @cached_property
    def allowed_services(self) -> frozenset[str]:
        return _aws_names(self.services, "services")

    @cached_property
    def allowed_regions(self) -> frozenset[str]:
        return _aws_names(self.regions, "regions")



Processor = (
    BearerProcessor
    | HeaderProcessor
    | BasicProcessor
    | QueryProcessor
    | HmacProcessor
    | PlaceholderProcessor
    | AwsSigV4Processor
    | OAuth2Processor
    | GitHubAppProcessor
    | GcpServiceAccountProcessor
)
PROCESSOR_TYPES: Final[Mapping[str, type[Processor]]] = {
    cls.kind: cls
    for cls in (
        BearerProcessor,
        HeaderProcessor,
        BasicProcessor,
        QueryProcessor,
        HmacProcessor,
        PlaceholderProcessor,
        AwsSigV4Processor,
        OAuth2Processor,
        GitHubAppProcessor,
        GcpServiceAccountProcessor,
    )
}


# --- JSON form --------------------------------------------------------------------------------


def processor_from_object(value: object) -> Processor:
    """Build a processor from its JSON form, e.g. `{"type": "header", "header": "X-Api-Key",
    "format": "{secret}"}`. Unknown types, unknown or missing fields, non-string values and
    settings the processor refuses are ProcessorInvalid."""
    if not isinstance(value, Mapping):
        raise ProcessorInvalid("processor must be an object")
    kind = value.get("type")
    if not isinstance(kind, str):
        raise ProcessorInvalid("processor type must be a string")
    cls = PROCESSOR_TYPES.get(kind)
    if cls is None:
        raise ProcessorInvalid(f"unknown processor type {kind[:40]!r}")
    spec = {f.name: f for f in dataclass_fields(cls)}
    required = [name for name, f in spec.items() if f.default is MISSING]
    if problem := jsonfields.unknown(value, {"type", *spec}) or jsonfields.missing(value, required):
        raise ProcessorInvalid(f"{kind} processor: {problem}")
    arguments: dict[str, str] = {}
    for name in spec:
        if name in value:
            item = value[name]
            if not isinstance(item, str):
                raise ProcessorInvalid(f"{kind} processor: {name} must be a string")
            arguments[name] = item
    return cls(**arguments)


def processor_to_object(processor: Processor) -> dict[str, object]:
    """The JSON form `processor_from_object` reads; unset optional fields are left out."""
    obj: dict[str, object] = {"type": processor.kind}
    for spec in dataclass_fields(processor):
        value = getattr(processor, spec.name)
        if value is not None:
            obj[spec.name] = value
    return obj


# --- what a processor carries and writes -----------------------------------------------------


def check_secret(processor: Processor, secret: str) -> None:
    """Raise SecretInvalid unless `processor` can carry `secret`: 1-4096 characters; visible ASCII
    only where the secret goes verbatim into a header (so it cannot end or split the header),
    otherwise no control or surrogate characters; for aws-sigv4, its keys' JSON object."""
    if isinstance(processor, AwsSigV4Processor):
        # With role_arn, sealed too: the proxy dials a sealed token's STS endpoint only where the
        # sandbox's policy lets it POST (`proxy.credentials.broker`).
        try:
            awskeys.parse(secret)
            return
        except ValueError as exc:
            problem = str(exc)
        raise SecretInvalid(problem)  # outside the handler: no context that could quote it
    if isinstance(processor, EXCHANGED):
        # Sealed too: the proxy dials a sealed token's endpoint only where the sandbox's own
        # policy lets it POST (`proxy.credentials.exchanges`).
        try:
            exchanged_secret(processor, secret)
            return
        except grants.GrantError as exc:
            problem = str(exc)
        raise SecretInvalid(problem)
    if processor.header_secret:
        if not _VISIBLE.fullmatch(secret) or len(secret) > MAX_SECRET_LENGTH:
            raise SecretInvalid(
                f"secret for a {processor.kind} processor must be "
                f"1-{MAX_SECRET_LENGTH} visible ASCII characters"
            )
        return
    if unicode := _unicode_problem(secret, MAX_SECRET_LENGTH):
        raise SecretInvalid(f"secret {unicode}")


def target(processor: Processor) -> str:
    """What a processor writes: a header name, lower-case, or `?param` for a query parameter."""
    match processor:
        case (BearerProcessor() | BasicProcessor() | AwsSigV4Processor() | OAuth2Processor()
              | GitHubAppProcessor() | GcpServiceAccountProcessor()):
            # aws-sigv4 writes the query instead for a presigned URL, but never both: the
            # Authorization header is what it conflicts with.
            return "authorization"
        case HeaderProcessor(header=h) | HmacProcessor(header=h) | PlaceholderProcessor(header=h):
            return h.lower()
        case QueryProcessor(param=param):
            return f"?{param}"
