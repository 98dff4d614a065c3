"""`github-app`: an installation token obtained from GitHub with a JWT the app's key signs."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Final

from .. import grants
from ..errors import ProcessorInvalid
from .base import Exchange
from .exchange import CACHED, ExchangeProcessor, check_scheme, check_url, pem_needles

__all__ = ["GitHubAppProcessor"]

_GITHUB_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,100}")
_GITHUB_PERMISSION: Final = re.compile(r"[a-z_]{1,64}:(read|write|admin)")


@dataclass(frozen=True)
class GitHubAppProcessor(ExchangeProcessor):
    """`Authorization: token <installation token>`, the token obtained from GitHub's
    `POST {api}/app/installations/{installation_id}/access_tokens` with a JWT the secret's app
    key signs, optionally narrowed to `repositories` and `permissions` (`contents:read`)."""

    kind: ClassVar[str] = "github-app"
    list_fields: ClassVar[frozenset[str]] = frozenset({"repositories", "permissions"})
    cli_options: ClassVar[Mapping[str, str]] = {
        "installation_id": "installation_id", "api": "github_api",
        "repositories": "repositories", "permissions": "permissions", "scheme": "scheme",
    }
    installation_id: str
    api: str = "https://api.github.com"
    repositories: str | None = None
    permissions: str | None = None
    scheme: str = "token"

    def __post_init__(self) -> None:
        if not (self.installation_id.isascii() and self.installation_id.isdigit()
                and len(self.installation_id) <= 20):
            raise ProcessorInvalid("github-app processor: installation_id must be digits")
        check_url(self.api, "github-app processor: api")
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
        check_scheme(self.scheme, "github-app processor: scheme")

    @cached_property
    def narrowed(self) -> bytes:
        """The access_tokens call's body."""
        body: dict[str, object] = {}
        if self.repositories is not None:
            body["repositories"] = self.repositories.split(",")
        if self.permissions is not None:
            body["permissions"] = dict(p.split(":") for p in self.permissions.split(","))
        return json.dumps(body).encode()

    def describe(self) -> str:
        narrowed = "".join(
            f", {what} {value}" for what, value in (("repositories", self.repositories),
                                                    ("permissions", self.permissions)) if value)
        return (f"Authorization: {self.scheme} <installation token>, obtained from "
                f"{self.api}/app/installations/{self.installation_id}/access_tokens with a JWT "
                f"the secret's app key signs{narrowed} {CACHED}")

    def exchange(self, secret: str) -> GitHubAppExchange:
        return GitHubAppExchange(self, grants.parse_app(secret))


@dataclass(frozen=True)
class GitHubAppExchange(Exchange):
    processor: GitHubAppProcessor
    app: grants.AppKey

    @property
    def endpoint(self) -> str:
        processor = self.processor
        return (f"{processor.api.rstrip('/')}/app/installations/{processor.installation_id}"
                "/access_tokens")

    def token_request(self, now: float) -> tuple[dict[str, str], bytes]:
        headers = {"Authorization": f"Bearer {grants.app_jwt(self.app, now)}",
                   "Accept": "application/vnd.github+json",
                   "X-GitHub-Api-Version": "2022-11-28",
                   "Content-Type": "application/json"}
        return headers, self.processor.narrowed

    def needles(self) -> tuple[str, ...]:
        return pem_needles(self.app.pem)
