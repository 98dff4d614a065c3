"""Putting a secret into a request as its processor says (`inject`): the one injection that
the token path and the proxy's broker both end in, over any `MutableRequest` (the proxy's wraps
mitmproxy's request; `InMemoryRequest` is the reference for tests and vectors).

No error raised here quotes or chains the secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, assert_never
from urllib.parse import quote, unquote_to_bytes

from sealgate.issuer.processors import (
    BasicProcessor,
    BearerProcessor,
    HeaderProcessor,
    HmacProcessor,
    PlaceholderProcessor,
    Processor,
    QueryProcessor,
    RequestInapplicable,
    check_secret,
)

__all__ = ["InMemoryRequest", "MutableRequest", "has_query_param", "inject", "set_query_param"]


class MutableRequest(Protocol):
    """The part of an HTTP request `inject` touches. Header names are case-insensitive; the
    path is the raw request target (path, then `?` and the query if there is one), exactly as
    it goes on the request line, nothing decoded; the body is the exact bytes that will be
    forwarded."""

    def get_header_values(self, name: str) -> list[str]: ...

    def set_header_values(self, name: str, values: Sequence[str]) -> None:
        """Replace every value of `name` with `values` (an empty sequence removes the header)."""

    def get_path(self) -> str: ...

    def set_path(self, path: str) -> None: ...

    def get_body(self) -> bytes: ...


@dataclass
class InMemoryRequest:
    """A plain `MutableRequest`, the reference for tests and vectors. Not for logging: after
    `inject` it holds the secret, so headers and path are kept out of repr."""

    headers: list[tuple[str, str]] = field(default_factory=list, repr=False)
    path: str = field(default="/", repr=False)
    body: bytes = field(default=b"", repr=False)

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


def _query_elements(path: str) -> tuple[str, list[str]]:
    """The part of request target `path` before its query, and the query's `&`-separated
    elements, raw ([] when there is no query or an empty one)."""
    if "#" in path:
        # Not allowed in a request target; servers disagree on whether it ends the query, so
        # where the parameter would land is anyone's guess.
        raise RequestInapplicable("the request target contains '#'")
    before, _, query = path.partition("?")
    return before, query.split("&") if query else []


def _named(element: str, param: str) -> bool:
    """Whether a raw query element is parameter `param`: its name, percent-decoded, is exactly
    `param`. Decoded, because a server that decodes names would read `api%5Fkey` as a second
    `api_key` the sandbox chose."""
    name = element.partition("=")[0]
    return unquote_to_bytes(name.encode("utf-8", "surrogateescape")) == param.encode("ascii")


def has_query_param(path: str, param: str) -> bool:
    """Whether request target `path` carries query parameter `param` (as `_named` compares)."""
    return any(_named(element, param) for element in _query_elements(path)[1])


def set_query_param(path: str, param: str, value: str) -> str:
    """Request target `path` with every `param` element of its query removed and
    `param=<value, percent-encoded as UTF-8>` appended last. Every other element keeps its
    exact text, empty ones included: pre-signed URLs sign those bytes. Raises
    RequestInapplicable for a target with a `#`."""
    before, elements = _query_elements(path)
    kept = [element for element in elements if not _named(element, param)]
    # safe="": `&`, `=`, `+`, `/` and `#` in a secret stay data; a space is %20, never `+`,
    # which only form decoders read as a space.
    kept.append(f"{param}={quote(value, safe='')}")
    return f"{before}?{'&'.join(kept)}"


def _signature(key: str, message: bytes, encoding: str) -> str:
    digest = hmac.new(key.encode("utf-8"), message, hashlib.sha256).digest()
    return digest.hex() if encoding == "hex" else base64.b64encode(digest).decode("ascii")


def inject(processor: Processor, secret: str, request: MutableRequest) -> None:
    """Put `secret` into `request` as `processor` says. Raises SecretInvalid (checked first, so
    the request is untouched) or RequestInapplicable."""
    check_secret(processor, secret)
    match processor:
        case BearerProcessor():
            request.set_header_values("Authorization", [f"Bearer {secret}"])
        case HeaderProcessor(header=header, format=fmt):
            request.set_header_values(header, [fmt.replace("{secret}", secret)])
        case BasicProcessor(username=username):
            pair = f"{username}:{secret}".encode()
            request.set_header_values(
                "Authorization", [f"Basic {base64.b64encode(pair).decode('ascii')}"]
            )
        case QueryProcessor(param=param):
            request.set_path(set_query_param(request.get_path(), param, secret))
        case HmacProcessor(header=header, format=fmt, encoding=encoding, message=message):
            signed = request.get_body() if message is None else message.encode("utf-8")
            value = fmt.replace("{signature}", _signature(secret, signed, encoding))
            request.set_header_values(header, [value])
        case PlaceholderProcessor(header=header, placeholder=placeholder):
            values = request.get_header_values(header)
            if not any(placeholder in value for value in values):
                raise RequestInapplicable(
                    f"request has no {header} header containing the placeholder"
                )
            request.set_header_values(
                header, [value.replace(placeholder, secret) for value in values]
            )
        case _:
            assert_never(processor)
