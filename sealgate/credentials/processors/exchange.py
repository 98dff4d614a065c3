"""What the token-exchange processors (`oauth2`, `github-app`, `gcp-service-account`) share:
the proxy obtains the token it injects with the secret, and puts it in as
`Authorization: <scheme> <token>`.

A processor says, without I/O, what one secret's exchange is (`base.Exchange`): where the token is
asked for, what is sent, what of the secret an echo must not give away, and the secret as it
is after an answer rotated it. The proxy makes the call and caches the token
(`proxy.credentials.exchanges`). Their secrets, JWTs and answers are `grants`. Brokered or
sealed: the proxy dials a sealed token's endpoint only where the sandbox's policy would let the
sandbox POST to it itself.
"""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from dataclasses import dataclass
from functools import cached_property
from typing import Final

from .. import grants
from ..errors import ProcessorInvalid, SecretInvalid
from ..httprequest import MutableRequest
from .base import Exchange, Processor
from .header import HeaderProcessor

__all__ = ["SCHEMES", "ExchangeProcessor", "check_scheme", "check_scopes",
           "check_url", "pem_needles"]

_SCOPE: Final = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]{1,256}")  # RFC 6749 3.3 scope-token
SCHEMES: Final = ("Bearer", "token")
# How long a token obtained is used: said by `describe`, done by `proxy.credentials.exchanged`.
CACHED: Final = "(cached until shortly before it expires)"


def check_scopes(value: str, what: str) -> None:
    names = value.split(",")
    if len(names) > 32 or not all(_SCOPE.fullmatch(name) for name in names):
        raise ProcessorInvalid(f"{what} must be 1-32 scope tokens, comma-separated")


def check_scheme(value: str, what: str) -> None:
    if value not in SCHEMES:
        raise ProcessorInvalid(f"{what} must be one of {', '.join(SCHEMES)}")


def check_url(value: str, what: str) -> None:
    try:
        grants.https_url(value, what)
    except grants.GrantError as exc:
        raise ProcessorInvalid(str(exc)) from None


def pem_needles(pem: str) -> tuple[str, ...]:
    """A private key as written, and as JSON escapes it."""
    return pem, json.dumps(pem)[1:-1]


@dataclass(frozen=True)
class ExchangeProcessor(Processor):
    """A processor whose secret is exchanged for the token that goes in."""

    @property
    @abstractmethod
    def scheme(self) -> str:
        """Authorization's scheme for the token."""

    @abstractmethod
    def exchange(self, secret: str) -> Exchange:
        """`secret`'s exchange; GrantError naming what is wrong with the secret."""

    @property
    def token_exchange(self) -> ExchangeProcessor:
        return self

    @cached_property
    def carrier(self) -> HeaderProcessor:
        """What puts the token obtained in."""
        return HeaderProcessor("Authorization", f"{self.scheme} {{secret}}")

    @property
    def target(self) -> str:
        return "authorization"

    def check_secret(self, secret: str) -> None:
        # Sealed too: the proxy dials a sealed token's endpoint only where the sandbox's own
        # policy lets it POST (`proxy.credentials.exchanges`).
        try:
            self.exchange(secret)
            return
        except grants.GrantError as exc:
            problem = str(exc)
        raise SecretInvalid(problem)  # outside the handler: no context that could quote it

    def write(self, secret: str, request: MutableRequest, now: float) -> str | None:
        # What goes in is a token the proxy obtains with the secret: the proxy exchanges it
        # first and injects the token with `carrier`.
        raise ProcessorInvalid(f"a {self.kind} secret is exchanged by the proxy first")
