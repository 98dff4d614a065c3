"""`header`: any header, the secret in a format (`X-Api-Key: {secret}`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from .base import FixedHeaderProcessor, check_format, check_header_name, check_verbatim_secret

__all__ = ["HeaderProcessor"]


@dataclass(frozen=True)
class HeaderProcessor(FixedHeaderProcessor):
    """Sets `<header>: <format with {secret} replaced>`."""

    kind: ClassVar[str] = "header"
    cli_options: ClassVar[Mapping[str, str]] = {"header": "header_name", "format": "format"}
    cli_defaults: ClassVar[Mapping[str, str]] = {"format": "{secret}"}
    header: str
    format: str

    def __post_init__(self) -> None:
        check_header_name(self.header, "header processor: header")
        check_format(self.format, "{secret}", "header processor: format")

    def check_secret(self, secret: str) -> None:
        check_verbatim_secret(secret, self.kind)

    @property
    def target(self) -> str:
        return self.header.lower()

    def describe(self) -> str:
        return f"{self.header}: {self.format.replace('{secret}', '<secret>')}"

    def fixed_header(self, secret: str) -> tuple[str, str]:
        return self.header, self.format.replace("{secret}", secret)
