"""`basic`: `Authorization: Basic base64(<username>:<secret>)`."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ProcessorInvalid
from .base import FixedHeaderProcessor, unicode_problem

__all__ = ["BasicProcessor"]


@dataclass(frozen=True)
class BasicProcessor(FixedHeaderProcessor):
    """Sets `Authorization: Basic base64(<username>:<secret>)` (UTF-8). The secret may be any
    text: base64 keeps it inside the header."""

    kind: ClassVar[str] = "basic"
    cli_options: ClassVar[Mapping[str, str]] = {"username": "username"}
    username: str

    def __post_init__(self) -> None:
        problem = unicode_problem(self.username, 256, allow_empty=True)
        if problem:
            raise ProcessorInvalid(f"basic processor: username {problem}")
        if ":" in self.username:
            raise ProcessorInvalid("basic processor: username must not contain ':'")

    @property
    def target(self) -> str:
        return "authorization"

    def describe(self) -> str:
        return f"Authorization: Basic base64({self.username}:<secret>)"

    def _encoded(self, secret: str) -> str:
        return base64.b64encode(f"{self.username}:{secret}".encode()).decode("ascii")

    def fixed_header(self, secret: str) -> tuple[str, str]:
        return "Authorization", f"Basic {self._encoded(secret)}"

    def needles(self, secret: str) -> tuple[str, ...]:
        # The base64 form decodes to the secret: an echo of it is an echo of the secret, with
        # the scheme or alone (an origin that returns the credential it decoded from, or the
        # token part of the header).
        encoded = self._encoded(secret)
        return f"Basic {encoded}", encoded
