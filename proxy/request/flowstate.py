"""What the pipeline keeps per connection and per request, and how it reads a request's headers.

A `Conn` lives for one client connection, a `RequestRecord` for one request (on the flow's
metadata under `META`, until its audit line is written). Both are plain records: the decisions
are made in `policy.decide`, the hooks only write down what was decided.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from mitmproxy import http

from sealgate.hostname import Host
from sealgate.reasons import Reason

from ..engine import limits
from ..errors import Denial
from ..net.guard import Pin
from ..policy import reshaping
from ..policy.decide import Identity
from ..policy.model import Policy
from .baseurl import BaseUrl

# Keys of a flow's metadata.
META: Final = limits.META  # the RequestRecord (the engine reads its bounds there)
SCRUB: Final = "sealgate_scrub"  # the Scrubber of a request that carried a credential
PENDING: Final = "sealgate_pending"  # body signatures to write once the body is here
REJECTED: Final = "sealgate_rejected"  # obtained tokens to forget if the upstream answers 401

STREAM_OVER: Final = 1024 * 1024  # bodies larger than this (or of unknown length) are streamed


@dataclass(slots=True)
class Conn:
    """What a client connection has established so far."""

    opened: float = field(default_factory=time.monotonic)
    source: str = ""  # the client's address, as the connection caps counted it ("": not)
    identity: Identity | None = None
    policy: Policy | None = None
    budget_key: str | None = None
    target: tuple[Host, int] | None = None  # the CONNECT authority, or a transparent SNI
    tunnel: bool = False  # forwarded without interception
    # A refusal every request on the connection gets: the CONNECT's (accepted, so that the
    # refusal reaches the client inside TLS), or the ClientHello's.
    blocked: Denial | None = None
    # Refused at the ClientHello: no handshake (mitmproxy closes a connection it has no TLS
    # context for; it cannot drop one from tls_clienthello).
    handshake_refused: bool = False
    alpn_offered: list[bytes] = field(default_factory=list)  # by the client's ClientHello
    proxy_auth: list[str] = field(default_factory=list)  # the CONNECT's, for token bindings
    tunnel_tokens: list[str] = field(default_factory=list)  # the CONNECT's Proxy-Tokenizer
    requests: int = 0
    denied: int = 0
    # The source registry's version when `identity` came from it (or from no entry in it).
    source_version: int = -1


@dataclass(slots=True)
class RequestRecord:
    """One request's decision, carried on the flow until the audit line is written."""

    started: float
    identity: Identity | None = None
    policy: str | None = None
    host: str | None = None
    port: int | None = None
    path: str | None = None
    decision: str = "deny"
    reason: Reason | None = None
    rule: str | None = None
    pin: Pin | None = None
    tenant: str = ""  # whose upstream connections it may ride (pipeline.py's `_tenant`)
    injected: list[str] = field(default_factory=list)
    overwrote: list[str] = field(default_factory=list)
    base_url: BaseUrl | None = None  # the upstream a base-URL request named
    response_timeout: float | None = None  # the rule's, over the proxy's (engine/deadline.py)
    max_request_bytes: int | None = None  # the policy's, held to as it streams (engine/bodycap.py)


@dataclass(slots=True)
class RequestFacts:
    """The few request headers the path needs, found in one pass over the raw fields: mitmproxy's
    Headers lookups re-scan and re-decode on every call."""

    proxy_auth: list[str]
    tokens: list[str]
    length: int | None  # a declared Content-Length
    chunked: bool  # a body of unknown length: chunked, or HTTP/2 and 3 without Content-Length
    # A method that is not a token, a control character in the target or a field value (HTAB
    # aside), a field name that is not a token, or Transfer-Encoding over HTTP/2 or 3. HTTP/2
    # does not refuse CR or LF in values, mitmproxy writes them verbatim into the HTTP/1
    # request it makes of an HTTP/2 one, and HTTP/1 parsers split on a bare CR: a second
    # request, carrying the injected credential, would reach the origin past every rule.
    # HTTP/2 forbids Transfer-Encoding (RFC 9113 8.2.2); passed on to HTTP/1 it would frame
    # the body.
    malformed: bool
    # Methods an override header names, upper-cased, for `decide`; `rerouted`: a reroute
    # header came (policy/reshaping.py says what both are and why).
    overrides: tuple[str, ...] = ()
    rerouted: bool = False

    @classmethod
    def of(cls, request: http.Request) -> RequestFacts:
        framed = request.is_http2 or request.is_http3
        fields = request.headers.fields
        facts = cls([], [], None, False, not _METHOD.fullmatch(request.data.method)
                    or _unsafe(request.data.path) or unsafe_fields(fields))
        for raw_name, raw_value in fields:
            name = raw_name.lower()
            if name == b"proxy-authorization":
                facts.proxy_auth.append(raw_value.decode("latin-1"))
            elif name == b"proxy-tokenizer":
                facts.tokens.append(raw_value.decode("latin-1"))
            elif name == b"content-length" and raw_value.isdigit():
                facts.length = int(raw_value)
            elif name == b"transfer-encoding":
                facts.chunked = True
                facts.malformed = facts.malformed or framed
            else:
                if b"_" in name:  # as a CGI-style server reads it (policy/reshaping.py)
                    name = name.replace(b"_", b"-")
                if name in _OVERRIDES:
                    method = raw_value.strip().upper()
                    facts.overrides = (*facts.overrides, method.decode("latin-1"))
                    facts.malformed = facts.malformed or not _METHOD.fullmatch(method)
                elif name in _REROUTES:
                    facts.rerouted = True
        if facts.length is None and framed:
            # Frames carry the body, with no length unless the client declared one.
            facts.chunked = True
        return facts


def unsafe_fields(fields: tuple[tuple[bytes, bytes], ...]) -> bool:
    """Whether any field name is not a token or any value holds a control character. Two
    searches for all the fields, not two per field: names are joined by ':', which no token
    holds (a name holding one shows as one ':' too many), values by HTAB, which any may."""
    if not fields:
        return False
    names = b":".join(name for name, _ in fields)
    return (
        names.count(b":") != len(fields) - 1
        or not _TOKENS.fullmatch(names)
        or _unsafe(b"\t".join(value for _, value in fields))
    )


_CONTROL: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # RFC 9110 5.5: HTAB is allowed
_TCHAR = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"  # RFC 9110 5.6.2
_TOKENS: Final = re.compile(_TCHAR + rb"(?::" + _TCHAR + rb")*")
_METHOD: Final = re.compile(_TCHAR)  # RFC 9110 9.1: a method is a token
_OVERRIDES: Final = frozenset(name.encode() for name in reshaping.METHOD_OVERRIDES)
_REROUTES: Final = frozenset(name.encode() for name in reshaping.REROUTES)


def _unsafe(raw: bytes) -> bool:
    return _CONTROL.search(raw) is not None


def stream_request(
    request: http.Request, facts: RequestFacts, meter: Callable[[bytes], bytes]
) -> None:
    """Large or unknown-length bodies stream instead of buffering (a sandbox must not fill the
    proxy's memory); unknown lengths count against the byte budget as they pass. Deciding here
    costs one comparison, where mitmproxy's stream_large_bodies re-derives each body's size."""
    passing = request.stream if callable(request.stream) else None  # a processor's (aws-chunked)
    if facts.length is None and facts.chunked:
        request.stream = meter if passing is None else (lambda chunk: passing(meter(chunk)))
    elif facts.length is not None and facts.length > STREAM_OVER and passing is None:
        request.stream = True


def header(headers: http.Headers, name: bytes) -> str:
    """Header `name` (lower case), repeated values joined as one list, as `Headers.get` does
    (`Content-Encoding: gzip` twice is "gzip, gzip", never just the first); "" if absent. A
    scan of the raw fields: `Headers.get` raises and catches a KeyError for an absent header,
    which on the per-request path cost more than the scan."""
    values = [value for key, value in headers.fields if key.lower() == name]
    return b", ".join(values).decode("latin-1")
