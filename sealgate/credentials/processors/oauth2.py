"""`oauth2`: an access token obtained from a token endpoint with the secret's refresh token or
client credentials (RFC 6749)."""

from __future__ import annotations

import base64
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Final
from urllib.parse import quote_plus, urlencode

from .. import grants
from ..errors import ProcessorInvalid
from .base import Exchange
from .exchange import CACHED, ExchangeProcessor, check_scheme, check_scopes, check_url

__all__ = ["OAuth2Processor"]

_VISIBLE: Final = re.compile(r"[\x21-\x7e]{1,512}")
FORM: Final = "application/x-www-form-urlencoded"


@dataclass(frozen=True)
class OAuth2Processor(ExchangeProcessor):
    """`Authorization: Bearer <access token>`, the token obtained from `token_url` with the
    secret's refresh token (grant `refresh_token`) or client id and secret
    (`client_credentials`, optionally for `scopes` and an `audience`)."""

    kind: ClassVar[str] = "oauth2"
    list_fields: ClassVar[frozenset[str]] = frozenset({"scopes"})
    cli_options: ClassVar[Mapping[str, str]] = {
        "token_url": "token_url", "grant": "grant", "scopes": "scopes", "audience": "audience",
        "client_auth": "client_auth", "scheme": "scheme",
    }
    token_url: str
    grant: str = "refresh_token"
    scopes: str | None = None
    audience: str | None = None
    client_auth: str = "basic"  # client id and secret in HTTP Basic (RFC 6749 2.3.1) or the body
    scheme: str = "Bearer"

    def __post_init__(self) -> None:
        check_url(self.token_url, "oauth2 processor: token_url")
        if self.grant not in ("refresh_token", "client_credentials"):
            raise ProcessorInvalid(
                "oauth2 processor: grant must be 'refresh_token' or 'client_credentials'")
        if self.scopes is not None:
            check_scopes(self.scopes, "oauth2 processor: scopes")
        if self.audience is not None and not _VISIBLE.fullmatch(self.audience):
            raise ProcessorInvalid("oauth2 processor: audience must be visible ASCII")
        if self.client_auth not in ("basic", "body"):
            raise ProcessorInvalid("oauth2 processor: client_auth must be 'basic' or 'body'")
        check_scheme(self.scheme, "oauth2 processor: scheme")

    def describe(self) -> str:
        scoped = f" for scopes {self.scopes}" if self.scopes else ""
        return (f"Authorization: {self.scheme} <access token>, obtained from {self.token_url} "
                f"with the secret's {self.grant.replace('_', ' ')} grant{scoped} {CACHED}")

    def exchange(self, secret: str) -> OAuth2Exchange:
        return OAuth2Exchange(self, grants.parse_oauth(secret, self.grant))


@dataclass(frozen=True)
class OAuth2Exchange(Exchange):
    processor: OAuth2Processor
    client: grants.OAuthClient

    @property
    def endpoint(self) -> str:
        return self.processor.token_url

    def token_request(self, now: float) -> tuple[dict[str, str], bytes]:
        processor, client = self.processor, self.client
        form = {"grant_type": processor.grant}
        if client.refresh_token is not None:
            form["refresh_token"] = client.refresh_token
        if processor.scopes is not None:
            form["scope"] = processor.scopes.replace(",", " ")
        if processor.audience is not None:
            form["audience"] = processor.audience
        headers = {"Content-Type": FORM, "Accept": "application/json"}
        if client.client_id is not None:
            if processor.client_auth == "basic" and client.client_secret is not None:
                # RFC 6749 2.3.1: each form-encoded, then joined for Basic.
                pair = f"{quote_plus(client.client_id)}:{quote_plus(client.client_secret)}"
                headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
            else:
                form["client_id"] = client.client_id
                if client.client_secret is not None:
                    form["client_secret"] = client.client_secret
        return headers, urlencode(form).encode()

    def needles(self) -> tuple[str, ...]:
        return tuple(v for v in (self.client.refresh_token, self.client.client_secret)
                     if v is not None)

    def rotated(self, refresh_token: str) -> str | None:
        if refresh_token == self.client.refresh_token:
            return None
        return dataclasses.replace(self.client, refresh_token=refresh_token).to_json()
