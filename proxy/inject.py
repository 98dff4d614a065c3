"""Putting credentials into a request: the one step both the broker and the tokenizer end in.

The processors themselves (bearer, header, basic, query, hmac-sha256, placeholder) live in
`issuer.processors`, shared with the sealed-token format. This module adapts mitmproxy's request
to them, refuses to send a credential anywhere it could be read on the way, and remembers what
was injected so the response can be scrubbed of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mitmproxy import http

from issuer.processors import (
    BasicProcessor,
    BearerProcessor,
    HeaderProcessor,
    HmacProcessor,
    InjectionError,
    PlaceholderProcessor,
    Processor,
    QueryProcessor,
    inject,
)
from proxy.errors import Denial
from proxy.guard import Pin
from proxy.policy import Policy, Rule
from proxy.scrub import Scrubber


class FlowRequest:
    """`issuer.processors.MutableRequest` over a mitmproxy request."""

    def __init__(self, request: http.Request) -> None:
        self.request = request

    def get_header_values(self, name: str) -> list[str]:
        return self.request.headers.get_all(name)

    def set_header_values(self, name: str, values: Sequence[str]) -> None:
        self.request.headers.set_all(name, list(values))

    def set_query_values(self, name: str, values: Sequence[str]) -> None:
        self.request.query.set_all(name, list(values))

    def get_body(self) -> bytes:
        return self.request.raw_content or b""


@dataclass
class Injected:
    """What went into a request: for the audit line and the response scrubber."""

    labels: list[str] = field(default_factory=list)
    overwrote: list[str] = field(default_factory=list)
    needles: list[str] = field(default_factory=list)

    def scrubber(self) -> Scrubber:
        return Scrubber(self.needles)


def target(processor: Processor) -> str:
    """The header (or query parameter) a processor writes."""
    match processor:
        case BearerProcessor() | BasicProcessor():
            return "authorization"
        case HeaderProcessor(header=h) | HmacProcessor(header=h) | PlaceholderProcessor(header=h):
            return h.lower()
        case QueryProcessor(param=param):
            return f"?{param}"


def require_secure_upstream(
    request: http.Request, rule: Rule | None, policy: Policy, pin: Pin, ssl_insecure: bool
) -> None:
    """Credentials travel only over TLS whose certificate was verified, or, where a rule says
    `plain_http`, to an address inside the policy's allow_networks (an internal API)."""
    if request.scheme == "https" and not ssl_insecure:
        return
    if (
        request.scheme == "http"
        and rule is not None
        and rule.plain_http
        and any(pin.address in net for net in policy.allow_networks)
    ):
        return
    raise Denial("insecure_upstream", "credentials are only injected over verified TLS")


def put(
    request: http.Request, processor: Processor, secret: str, label: str, into: Injected
) -> None:
    name = target(processor)
    present = (
        name[1:] in request.query if name.startswith("?") else name in request.headers
    )
    if present and not isinstance(processor, PlaceholderProcessor):
        into.overwrote.append(name)
    try:
        inject(processor, secret, FlowRequest(request))
    except InjectionError as exc:
        raise Denial(exc.reason, str(exc)) from None
    into.labels.append(label)
    into.needles.append(secret)
    if isinstance(processor, BasicProcessor):
        # The base64 form decodes to the secret: an echo of it is an echo of the secret.
        into.needles.extend(request.headers.get_all("authorization"))
