"""`aws-sigv4`: a request the sandbox signed with placeholder keys, re-signed with the real ones.
The re-signing itself is `awsresign`; the keys `awskeys`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Final
from urllib.parse import quote

from .. import awskeys, awsresign
from ..awskeys import AssumeRole
from ..errors import ProcessorInvalid, SecretInvalid
from ..httprequest import MutableRequest
from .base import Processor

__all__ = ["AWS_PLACEHOLDER_KEY_ID", "AWS_PLACEHOLDER_SECRET", "AwsSigV4Processor"]

_AWS_NAME: Final = re.compile(r"[a-z0-9-]{1,64}")  # a region or a service, as scopes spell them
# The key pair a sandbox signs with (docs/rules.md, aws-sigv4). Public on purpose: the proxy
# never checks the sandbox's signature, which proves nothing when everyone knows the key.
AWS_PLACEHOLDER_KEY_ID: Final = "SEALGATEPLACEHOLDER"
AWS_PLACEHOLDER_SECRET: Final = "sealgate-placeholder-secret-access-key"  # noqa: S105 (public)


def _aws_names(value: str, what: str) -> frozenset[str]:
    names = value.split(",")
    if not all(_AWS_NAME.fullmatch(name) for name in names) or len(names) > 32:
        raise ProcessorInvalid(
            f"aws-sigv4 processor: {what} must be 1-32 names of a-z 0-9 -, comma-separated"
        )
    return frozenset(names)


@dataclass(frozen=True)
class AwsSigV4Processor(Processor):
    """Re-signs a request the sandbox signed with AWS Signature Version 4 and the placeholder
    key id: the sandbox's signature is dropped and the request signed again with the secret's
    keys (`awskeys`), if its credential scope names one of `services` and `regions`
    (comma-separated)."""

    kind: ClassVar[str] = "aws-sigv4"
    list_fields: ClassVar[frozenset[str]] = frozenset({"services", "regions"})
    cli_options: ClassVar[Mapping[str, str]] = {
        "services": "aws_services", "regions": "aws_regions", "placeholder": "placeholder",
    }
    cli_defaults: ClassVar[Mapping[str, str]] = {"placeholder": AWS_PLACEHOLDER_KEY_ID}
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

    def check_secret(self, secret: str) -> None:
        """Its keys' JSON object. With role_arn, sealed too: the proxy dials a sealed token's
        STS endpoint only where the sandbox's policy lets it POST (`proxy.credentials.broker`)."""
        try:
            awskeys.parse(secret)
            return
        except ValueError as exc:
            problem = str(exc)
        raise SecretInvalid(problem)  # outside the handler: no context that could quote it

    def needles(self, secret: str) -> tuple[str, ...]:
        # The JSON as stored, and each key alone; a session token also as a presigned URL
        # carries it. The key id too: it names the account's key to anyone who reads it.
        keys = awskeys.parse(secret)
        found = [keys.access_key_id, keys.secret_access_key]
        if keys.session_token is not None:
            found += [keys.session_token, quote(keys.session_token, safe="")]
        return tuple(found)

    def role(self, secret: str) -> AssumeRole | None:
        try:
            return awskeys.parse(secret).role
        except ValueError:
            return None  # not keys at all: `check_secret` says what is wrong with it

    @property
    def target(self) -> str:
        # It writes the query instead for a presigned URL, but never both: the Authorization
        # header is what it conflicts with.
        return "authorization"

    def describe(self) -> str:
        return (f"a SigV4 request signed with key id {self.placeholder} (header or presigned "
                f"URL) re-signed with the secret's keys, for services {self.services} in "
                f"regions {self.regions}")

    def needs_body(self, request: MutableRequest, now: float) -> bool:
        return awsresign.needs_body(self, request, now)

    def write(self, secret: str, request: MutableRequest, now: float) -> str | None:
        # The new signature: a presigned URL's is a capability for days.
        return awsresign.resign(self, awskeys.parse(secret), request, now)
