"""`placeholder`: the secret replaces a placeholder the sandbox's SDK put in a header."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ProcessorInvalid, RequestInapplicable
from ..httprequest import MutableRequest
from .base import VISIBLE, Processor, check_header_name, check_verbatim_secret

__all__ = ["PlaceholderProcessor"]


@dataclass(frozen=True)
class PlaceholderProcessor(Processor):
    """In every value of `<header>`, replaces `placeholder` with the secret. The request must
    carry the placeholder there (RequestInapplicable otherwise)."""

    kind: ClassVar[str] = "placeholder"
    cli_options: ClassVar[Mapping[str, str]] = {"header": "header_name",
                                                "placeholder": "placeholder"}
    cli_defaults: ClassVar[Mapping[str, str]] = {"header": "Authorization"}
    header: str
    placeholder: str

    def __post_init__(self) -> None:
        check_header_name(self.header, "placeholder processor: header")
        if not VISIBLE.fullmatch(self.placeholder) or not 8 <= len(self.placeholder) <= 256:
            raise ProcessorInvalid(
                "placeholder processor: placeholder must be 8-256 visible ASCII characters"
            )

    def check_secret(self, secret: str) -> None:
        check_verbatim_secret(secret, self.kind)

    @property
    def target(self) -> str:
        return self.header.lower()

    def describe(self) -> str:
        return f"{self.header}: {self.placeholder} replaced by <secret>"

    def sent(self, request: MutableRequest) -> bool:
        return False  # it replaces only the placeholder: nothing the sandbox sent is lost

    def write(self, secret: str, request: MutableRequest, now: float) -> str | None:
        values = request.get_header_values(self.header)
        if not any(self.placeholder in value for value in values):
            raise RequestInapplicable(
                f"request has no {self.header} header containing the placeholder"
            )
        request.set_header_values(
            self.header, [value.replace(self.placeholder, secret) for value in values]
        )
        return None
