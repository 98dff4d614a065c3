"""The request a processor writes into (`MutableRequest`, with `InMemoryRequest` as the
reference for tests and vectors), and the query-string edits processors make in it.

Its own module so that every processor's behaviour (`processors`, `awsresign`) can
use it without importing the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote, unquote_to_bytes

from .errors import RequestInapplicable

__all__ = [
    "InMemoryRequest",
    "MutableRequest",
    "has_query_param",
    "query_elements",
    "set_query_param",
    "without_query_params",
]


class MutableRequest(Protocol):
    """The part of an HTTP request a processor touches. Header names are case-insensitive; the
    path is the raw request target (path, then `?` and the query if there is one), exactly as
    it goes on the request line, nothing decoded; the body is the exact bytes that will be
    forwarded."""

    def get_method(self) -> str: ...

    def get_header_values(self, name: str) -> list[str]: ...

    def set_header_values(self, name: str, values: Sequence[str]) -> None:
        """Replace every value of `name` with `values` (an empty sequence removes the header)."""

    def get_path(self) -> str: ...

    def set_path(self, path: str) -> None: ...

    def get_body(self) -> bytes: ...

    def body_length(self) -> int | None:
        """The body's length if it is known (here, declared, or none sent); None while a body
        of unknown length (chunked, HTTP/2 frames without a Content-Length) is still coming."""

    def set_body(self, body: bytes) -> None:
        """Replace the body with as many bytes (framing headers stay as they are)."""

    def pass_body_through(self, transform: Callable[[bytes], bytes]) -> None:
        """Forward the body through `transform` as it comes, piece by piece, with b"" at its
        end for what `transform` still holds; it returns as many bytes as it takes, in all (the
        framing headers stay as they are), and raises InjectionError for a body it refuses."""


@dataclass
class InMemoryRequest:
    """A plain `MutableRequest`, the reference for tests and vectors. Not for logging: after
    `inject` it holds the secret, so headers and path are kept out of repr."""

    headers: list[tuple[str, str]] = field(default_factory=list, repr=False)
    path: str = field(default="/", repr=False)
    body: bytes = field(default=b"", repr=False)
    method: str = "GET"

    def get_method(self) -> str:
        return self.method

    def get_header_values(self, name: str) -> list[str]:
        wanted = name.lower()
        return [value for key, value in self.headers if key.lower() == wanted]

    def set_header_values(self, name: str, values: Sequence[str]) -> None:
        wanted = name.lower()
        self.headers = [(k, v) for k, v in self.headers if k.lower() != wanted]
        self.headers.extend((name, value) for value in values)

    def get_path(self) -> str:
        return self.path

    def set_path(self, path: str) -> None:
        self.path = path

    def get_body(self) -> bytes:
        return self.body

    def body_length(self) -> int | None:
        return len(self.body)

    def set_body(self, body: bytes) -> None:
        self.body = body

    def pass_body_through(self, transform: Callable[[bytes], bytes]) -> None:
        self.body = transform(self.body) + transform(b"")


def query_elements(path: str) -> tuple[str, list[str]]:
    """The part of request target `path` before its query, and the query's `&`-separated
    elements, raw ([] when there is no query or an empty one)."""
    if "#" in path:
        # Not allowed in a request target; servers disagree on whether it ends the query, so
        # where the parameter would land is anyone's guess.
        raise RequestInapplicable("the request target contains '#'")
    before, _, query = path.partition("?")
    return before, query.split("&") if query else []


def _named(element: str, params: frozenset[bytes]) -> bool:
    """Whether a raw query element is one of `params`: its name, percent-decoded, is exactly
    one of them. Decoded, because a server that decodes names would read `api%5Fkey` as a
    second `api_key` the sandbox chose."""
    name = element.partition("=")[0]
    return unquote_to_bytes(name.encode("utf-8", "surrogateescape")) in params


def has_query_param(path: str, param: str) -> bool:
    """Whether request target `path` carries query parameter `param` (as `_named` compares)."""
    wanted = frozenset({param.encode("ascii")})
    return any(_named(element, wanted) for element in query_elements(path)[1])


def without_query_params(path: str, params: Sequence[str]) -> tuple[str, list[str]]:
    """The part of `path` before its query, and the query's raw elements but those naming one
    of `params`. Every other element keeps its exact text, empty ones included: pre-signed URLs
    sign those bytes."""
    before, elements = query_elements(path)
    names = frozenset(param.encode("ascii") for param in params)
    return before, [element for element in elements if not _named(element, names)]


def set_query_param(path: str, param: str, value: str) -> str:
    """Request target `path` with every `param` element of its query removed and
    `param=<value, percent-encoded as UTF-8>` appended last. Raises RequestInapplicable for a
    target with a `#`."""
    before, kept = without_query_params(path, [param])
    # safe="": `&`, `=`, `+`, `/` and `#` in a secret stay data; a space is %20, never `+`,
    # which only form decoders read as a space.
    kept.append(f"{param}={quote(value, safe='')}")
    return f"{before}?{'&'.join(kept)}"
