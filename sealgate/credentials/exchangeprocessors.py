"""The token-exchange processors, as data: the proxy obtains the token it injects with the
secret (`oauth2`, `github-app`, `gcp-service-account`). Their secrets and calls are
`issuer.grants`; the proxy's side is `proxy.credentials.exchanges`. Part of the one processor
table (`issuer.processors`), brokered or sealed: the proxy dials a sealed token's endpoint
only where the sandbox's policy would let the sandbox POST to it itself."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Final

from . import grants
from .injectionerrors import ProcessorInvalid

__all__ = ["EXCHANGED", "SCHEMES", "GcpServiceAccountProcessor", "GitHubAppProcessor",
           "OAuth2Processor", "exchanged_secret"]

_VISIBLE: Final = re.compile(r"[\x21-\x7e]{1,512}")
_SCOPE: Final = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]{1,256}")  # RFC 6749 3.3 scope-token
SCHEMES: Final = ("Bearer", "token")


def _scopes(value: str, what: str) -> None:
    names = value.split(",")
    if len(names) > 32 or not all(_SCOPE.fullmatch(name) for name in names):
        raise ProcessorInvalid(f"{what} must be 1-32 scope tokens, comma-separated")


def _scheme(value: str, what: str) -> None:
    if value not in SCHEMES:
        raise ProcessorInvalid(f"{what} must be one of {', '.join(SCHEMES)}")


def _url(value: str, what: str) -> None:
    try:
        grants.https_url(value, what)
    except grants.GrantError as exc:
        raise ProcessorInvalid(str(exc)) from None


@dataclass(frozen=True)
class OAuth2Processor:
    """`Authorization: Bearer <access token>`, the token obtained from `token_url` with the
    secret's refresh token (grant `refresh_token`) or client id and secret
    (`client_credentials`, optionally for `scopes` and an `audience`). Behaviour in
    `proxy.credentials.exchanges`."""

    kind: ClassVar[str] = "oauth2"
    header_secret: ClassVar[bool] = False
    token_url: str
    grant: str = "refresh_token"
    scopes: str | None = None
    audience: str | None = None
    client_auth: str = "basic"  # client id and secret in HTTP Basic (RFC 6749 2.3.1) or the body
    scheme: str = "Bearer"

    def __post_init__(self) -> None:
        _url(self.token_url, "oauth2 processor: token_url")
        if self.grant not in ("refresh_token", "client_credentials"):
            raise ProcessorInvalid(
                "oauth2 processor: grant must be 'refresh_token' or 'client_credentials'")
        if self.scopes is not None:
            _scopes(self.scopes, "oauth2 processor: scopes")
        if self.audience is not None and not _VISIBLE.fullmatch(self.audience):
            raise ProcessorInvalid("oauth2 processor: audience must be visible ASCII")
        if self.client_auth not in ("basic", "body"):
            raise ProcessorInvalid("oauth2 processor: client_auth must be 'basic' or 'body'")
        _scheme(self.scheme, "oauth2 processor: scheme")


_GITHUB_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,100}")
_GITHUB_PERMISSION: Final = re.compile(r"[a-z_]{1,64}:(read|write|admin)")


@dataclass(frozen=True)
class GitHubAppProcessor:
    """`Authorization: token <installation token>`, the token obtained from GitHub's
    `POST {api}/app/installations/{installation_id}/access_tokens` with a JWT the secret's app
    key signs, optionally narrowed to `repositories` and `permissions` (`contents:read`)."""

    kind: ClassVar[str] = "github-app"
    header_secret: ClassVar[bool] = False
    installation_id: str
    api: str = "https://api.github.com"
    repositories: str | None = None
    permissions: str | None = None
    scheme: str = "token"

    def __post_init__(self) -> None:
        if not (self.installation_id.isascii() and self.installation_id.isdigit()
                and len(self.installation_id) <= 20):
            raise ProcessorInvalid("github-app processor: installation_id must be digits")
        _url(self.api, "github-app processor: api")
        if self.repositories is not None:
            names = self.repositories.split(",")
            if len(names) > 500 or not all(_GITHUB_NAME.fullmatch(n) for n in names):
                raise ProcessorInvalid("github-app processor: repositories must be repository "
                                       "names (without the owner), comma-separated")
        if self.permissions is not None and not all(
            _GITHUB_PERMISSION.fullmatch(p) for p in self.permissions.split(",")
        ):
            raise ProcessorInvalid("github-app processor: permissions must be name:level "
                                   "(read, write or admin), comma-separated")
        _scheme(self.scheme, "github-app processor: scheme")

    @cached_property
    def narrowed(self) -> dict[str, object]:
        """The access_tokens call's body."""
        body: dict[str, object] = {}
        if self.repositories is not None:
            body["repositories"] = self.repositories.split(",")
        if self.permissions is not None:
            body["permissions"] = dict(p.split(":") for p in self.permissions.split(","))
        return body


@dataclass(frozen=True)
class GcpServiceAccountProcessor:
    """`Authorization: Bearer <token>` for a Google service account: an access token for
    `scopes`, or with `audience` an ID token for it, obtained from the key's `token_uri` with a
    JWT-bearer assertion the key signs."""

    kind: ClassVar[str] = "gcp-service-account"
    header_secret: ClassVar[bool] = False
    scopes: str | None = None
    audience: str | None = None

    def __post_init__(self) -> None:
        if (self.scopes is None) == (self.audience is None):
            raise ProcessorInvalid(
                "gcp-service-account processor: give scopes (an access token) or audience "
                "(an ID token), one of them")
        if self.scopes is not None:
            _scopes(self.scopes, "gcp-service-account processor: scopes")
        if self.audience is not None:
            _url(self.audience, "gcp-service-account processor: audience")


EXCHANGED: Final = (OAuth2Processor, GitHubAppProcessor, GcpServiceAccountProcessor)


def exchanged_secret(
    processor: OAuth2Processor | GitHubAppProcessor | GcpServiceAccountProcessor, secret: str
) -> grants.OAuthClient | grants.AppKey | grants.ServiceAccount:
    """The parsed secret of a token-exchange processor; GrantError naming what is wrong."""
    if isinstance(processor, OAuth2Processor):
        return grants.parse_oauth(secret, processor.grant)
    if isinstance(processor, GitHubAppProcessor):
        return grants.parse_app(secret)
    return grants.parse_service_account(secret)
