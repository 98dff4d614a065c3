"""`query`: a query parameter `<param>=<secret>`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Final
from urllib.parse import quote, quote_plus

from ..errors import ProcessorInvalid
from ..httprequest import MutableRequest, has_query_param, set_query_param
from .base import Processor

__all__ = ["QueryProcessor"]

_QUERY_NAME: Final = re.compile(r"[A-Za-z0-9._~\[\]-]{1,128}")


@dataclass(frozen=True)
class QueryProcessor(Processor):
    """Sets query parameter `<param>=<secret>`, replacing any the request had
    (`set_query_param`)."""

    kind: ClassVar[str] = "query"
    cli_options: ClassVar[Mapping[str, str]] = {"param": "param"}
    param: str

    def __post_init__(self) -> None:
        if not _QUERY_NAME.fullmatch(self.param):
            raise ProcessorInvalid(
                "query processor: param must be 1-128 characters from A-Z a-z 0-9 . _ ~ - [ ]"
            )

    @property
    def target(self) -> str:
        return f"?{self.param}"

    def describe(self) -> str:
        return f"query {self.param}=<secret>"

    def needles(self, secret: str) -> tuple[str, ...]:
        # In the URL the secret is percent-encoded as `set_query_param` writes it (quote); an
        # echoed URL (a redirect, a 404 page) carries that form, or the one a server that
        # re-encodes it as a form writes (quote_plus).
        return quote(secret, safe=""), quote_plus(secret, safe="")

    def sent(self, request: MutableRequest) -> bool:
        return has_query_param(request.get_path(), self.param)

    def write(self, secret: str, request: MutableRequest, now: float) -> str | None:
        request.set_path(set_query_param(request.get_path(), self.param, secret))
        return None
