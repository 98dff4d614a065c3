"""`bearer`: `Authorization: Bearer <secret>`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import FixedHeaderProcessor, check_verbatim_secret

__all__ = ["BearerProcessor"]


@dataclass(frozen=True)
class BearerProcessor(FixedHeaderProcessor):
    """Sets `Authorization: Bearer <secret>`."""

    kind: ClassVar[str] = "bearer"

    def check_secret(self, secret: str) -> None:
        check_verbatim_secret(secret, self.kind)

    @property
    def target(self) -> str:
        return "authorization"

    def describe(self) -> str:
        return "Authorization: Bearer <secret>"

    def fixed_header(self, secret: str) -> tuple[str, str]:
        return "Authorization", f"Bearer {secret}"
