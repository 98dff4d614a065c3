"""`hmac-sha256`: a header carrying an HMAC-SHA256 signature keyed by the secret."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ProcessorInvalid
from ..httprequest import MutableRequest
from .base import Processor, check_format, check_header_name, unicode_problem

__all__ = ["HmacProcessor"]


@dataclass(frozen=True)
class HmacProcessor(Processor):
    """Sets `<header>: <format with {signature} replaced>`, the signature being
    HMAC-SHA256(key=secret, msg=the exact body, or `message` if given), hex or base64."""

    kind: ClassVar[str] = "hmac-sha256"
    cli_options: ClassVar[Mapping[str, str]] = {
        "header": "header_name", "format": "format", "encoding": "hmac_encoding",
        "message": "hmac_message",
    }
    cli_defaults: ClassVar[Mapping[str, str]] = {"format": "{signature}", "encoding": "hex"}
    header: str
    format: str
    encoding: str
    message: str | None = None

    def __post_init__(self) -> None:
        check_header_name(self.header, "hmac-sha256 processor: header")
        check_format(self.format, "{signature}", "hmac-sha256 processor: format")
        if self.encoding not in ("hex", "base64"):
            raise ProcessorInvalid("hmac-sha256 processor: encoding must be 'hex' or 'base64'")
        if self.message is not None:
            problem = unicode_problem(self.message, 4096)
            if problem:
                raise ProcessorInvalid(f"hmac-sha256 processor: message {problem}")

    @property
    def target(self) -> str:
        return self.header.lower()

    def describe(self) -> str:
        signed = "the body" if self.message is None else "a fixed message"
        return (f"{self.header}: {self.format.replace('{signature}', '<signature>')}, "
                f"HMAC-SHA256 of {signed}, {self.encoding}")

    def needs_body(self, request: MutableRequest, now: float) -> bool:
        return self.message is None

    def write(self, secret: str, request: MutableRequest, now: float) -> str | None:
        signed = request.get_body() if self.message is None else self.message.encode("utf-8")
        digest = hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).digest()
        signature = (digest.hex() if self.encoding == "hex"
                     else base64.b64encode(digest).decode("ascii"))
        request.set_header_values(self.header, [self.format.replace("{signature}", signature)])
        return None
