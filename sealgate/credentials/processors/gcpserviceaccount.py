"""`gcp-service-account`: a Google access or ID token obtained with a JWT-bearer assertion the
service account's key signs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlencode

from .. import grants
from ..errors import ProcessorInvalid
from .base import Exchange
from .exchange import CACHED, ExchangeProcessor, check_scopes, check_url, pem_needles
from .oauth2 import FORM

__all__ = ["GcpServiceAccountProcessor"]


@dataclass(frozen=True)
class GcpServiceAccountProcessor(ExchangeProcessor):
    """`Authorization: Bearer <token>` for a Google service account: an access token for
    `scopes`, or with `audience` an ID token for it, obtained from the key's `token_uri` with a
    JWT-bearer assertion the key signs."""

    kind: ClassVar[str] = "gcp-service-account"
    list_fields: ClassVar[frozenset[str]] = frozenset({"scopes"})
    cli_options: ClassVar[Mapping[str, str]] = {"scopes": "scopes", "audience": "audience"}
    scopes: str | None = None
    audience: str | None = None

    def __post_init__(self) -> None:
        if (self.scopes is None) == (self.audience is None):
            raise ProcessorInvalid(
                "gcp-service-account processor: give scopes (an access token) or audience "
                "(an ID token), one of them")
        if self.scopes is not None:
            check_scopes(self.scopes, "gcp-service-account processor: scopes")
        if self.audience is not None:
            check_url(self.audience, "gcp-service-account processor: audience")

    @property
    def scheme(self) -> str:
        return "Bearer"  # Google's tokens are bearer tokens; there is nothing to choose

    def describe(self) -> str:
        what = (f"an ID token for {self.audience}" if self.audience
                else f"an access token for {self.scopes}")
        return (f"Authorization: Bearer <{what}>, obtained from the key's token_uri with a "
                f"JWT-bearer assertion the key signs {CACHED}")

    def exchange(self, secret: str) -> GcpServiceAccountExchange:
        return GcpServiceAccountExchange(self, grants.parse_service_account(secret))


@dataclass(frozen=True)
class GcpServiceAccountExchange(Exchange):
    processor: GcpServiceAccountProcessor
    account: grants.ServiceAccount

    @property
    def endpoint(self) -> str:
        return self.account.token_uri

    def token_request(self, now: float) -> tuple[dict[str, str], bytes]:
        scopes = self.processor.scopes
        assertion = grants.service_account_assertion(
            self.account, scopes=None if scopes is None else scopes.replace(",", " "),
            audience=self.processor.audience, now=now)
        body = urlencode({"grant_type": grants.JWT_BEARER, "assertion": assertion}).encode()
        return {"Content-Type": FORM}, body

    def needles(self) -> tuple[str, ...]:
        return pem_needles(self.account.pem)
