"""Putting credentials into a request: the one step both the broker and the tokenizer end in.

The processors themselves (bearer, header, basic, query, hmac-sha256, placeholder, aws-sigv4)
are types of the shared library (`sealgate.credentials.processors`), shared with the
sealed-token format; this module asks them, never which one it has. It works a secret and its
processor out once into a `Credential` (checked, labelled, and for the processors that write
one fixed header, that header ready to send), writes credentials
into mitmproxy's request, refuses to send them anywhere they could be read on the way, and
remembers what was injected so the response can be scrubbed of it.

Fixed headers (bearer, header, basic) go in with one pass over the request's header fields,
together with the headers that must not be forwarded and the identity encoding that keeps the
response scrubbable: each `Headers` edit in mitmproxy rebuilds the whole field tuple, and on the
injection path those rebuilds were most of its cost.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sealgate.credentials.errors import InjectionError, RequestInapplicable
from sealgate.credentials.processors import Processor
from sealgate.reasons import Reason

from ..errors import Denial
from .scrub import Scrubber

if TYPE_CHECKING:
    # Annotations only: `Credential` and `credential` are used without mitmproxy, by the MCP
    # server's own process (proxy/calls.py), which has none.
    from mitmproxy import http

_IDENTITY = (b"accept-encoding", b"identity")
_TRAILERS = b"trailers"

# What one request's credentials may give the response scrubber to look for: the forms of its
# secrets (each secret, its percent-encoded or base64 forms), the distinct ones of 4 bytes or
# more. A real request carries a few credentials of up to a few hundred characters, each with
# at most three forms: some ten needles, a few KiB. The count leaves room for the 8 tokens a
# request may carry, three forms each, with brokered credentials besides; the bytes for any one
# secret of the longest a processor takes, 4096 ASCII characters (as a query parameter that
# needs escaping throughout, its three forms are 28 KiB), not for several such, nor for a
# 4096-character non-ASCII query secret. Past either the request is refused, since scrubbing a
# response costs the proxy's one event loop time in proportion to the needles.
MAX_NEEDLES = 32
MAX_NEEDLE_BYTES = 32 << 10
# What aws-sigv4 checks a request's X-Amz-Date against; tests of fixed vectors set it.
clock: Callable[[], float] = time.time


class FlowRequest:
    """`sealgate.credentials.httprequest.MutableRequest` over a mitmproxy request, for
    credential `cred`: a streamed body its processor refuses gets the reason `cred`'s other
    refusals get (`_denial`: a sealed token's is `token_inapplicable`)."""

    def __init__(self, request: http.Request, cred: Credential) -> None:
        self.request = request
        self._cred = cred
        # Lower-case name -> values, read in one pass when first asked: aws-sigv4 reads a
        # dozen headers, and each `Headers.get_all` walks and decodes every field.
        self._headers: dict[str, list[str]] | None = None

    def get_method(self) -> str:
        return self.request.method

    def get_header_values(self, name: str) -> list[str]:
        if self._headers is None:
            self._headers = {}
            for key, value in self.request.headers.fields:
                # Decoded as mitmproxy's own accessors decode them.
                self._headers.setdefault(key.decode("utf-8", "surrogateescape").lower(), []
                                         ).append(value.decode("utf-8", "surrogateescape"))
        values = self._headers.get(name.lower(), [])
        if not values and name.lower() == "host" and self.request.authority:
            # HTTP/2 carries it as :authority, which becomes Host on an HTTP/1 upstream.
            return [self.request.authority]
        return list(values)

    def set_header_values(self, name: str, values: Sequence[str]) -> None:
        self.request.headers.set_all(name, list(values))
        self._headers = None

    def get_path(self) -> str:
        return self.request.path

    def set_path(self, path: str) -> None:
        # Raw: mitmproxy's `query` view would decode and re-encode every other parameter.
        self.request.path = path

    def get_body(self) -> bytes:
        return self.request.raw_content or b""

    def body_length(self) -> int | None:
        if self.request.raw_content is not None:
            return len(self.request.raw_content)
        declared = self.get_header_values("content-length")
        if len(declared) == 1 and declared[0].isdigit():
            return int(declared[0])
        if self.get_header_values("transfer-encoding") or self.request.http_version in (
            "HTTP/2.0", "HTTP/3",
        ):
            return None
        return 0  # RFC 9112 6.3: neither header, no body

    def set_body(self, body: bytes) -> None:
        # Raw: `aws-chunked` is a Content-Encoding mitmproxy's `content` would try to apply.
        self.request.raw_content = body

    def pass_body_through(self, transform: Callable[[bytes], bytes]) -> None:
        request = self.request
        if request.raw_content is not None:
            self.set_body(transform(request.raw_content) + transform(b""))
            return
        # Streamed (whatever its size): after what already stands on the stream, the meter
        # `flowstate.stream_request` puts before it. A body `transform` refuses halfway has
        # part of it upstream already: nothing more goes, and the request hook refuses it and
        # kills the flow before its end is sent (`refused_body`).
        before = request.stream if callable(request.stream) else None

        def passing(data: bytes) -> bytes:
            if request in _REFUSED:
                return b""
            came = before(data) if before is not None else data
            try:
                return transform(came if isinstance(came, bytes) else b"".join(came))
            except InjectionError as exc:
                _REFUSED[request] = _denial(self._cred, exc)
                return b""

        request.stream = passing


_REFUSED: weakref.WeakKeyDictionary[http.Request, Denial] = weakref.WeakKeyDictionary()


def refused_body(request: http.Request) -> Denial | None:
    """The refusal of a body a processor refused as it streamed, if it did."""
    return _REFUSED.get(request)


@dataclass(frozen=True, slots=True)
class Credential:
    """A secret and the processor that puts it in, checked once.

    `header` is the (name, value) a fixed-header processor writes; None for the
    processors whose output depends on the request (query, placeholder, hmac-sha256)."""

    processor: Processor
    secret: str = field(repr=False)
    label: str
    target: str  # the header (lower-case) or "?param" it writes
    key: bytes = field(init=False, repr=False)  # target, encoded: compared with header names
    header: tuple[bytes, bytes] | None = field(repr=False)
    needles: tuple[str, ...] = field(repr=False)  # what an echo of it would look like
    # The reason a request it cannot apply to (no placeholder there) is refused with: a token's
    # own (`token_inapplicable`, as docs/token-format.md says) or the broker's.
    inapplicable: Reason = Reason.REQUEST_INAPPLICABLE
    # For a token the proxy obtained (`credentials.exchanges`): forgets it, when the upstream
    # answered 401 to it.
    rejected: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.target.encode())


def credential(
    processor: Processor, secret: str, label: str, *,
    inapplicable: Reason = Reason.REQUEST_INAPPLICABLE,
) -> Credential:
    """Check `secret` for `processor` and work out what it writes. Raises InjectionError."""
    processor.check_secret(secret)
    fixed = processor.fixed_header(secret)
    header = None
    if fixed is not None:
        name, value = fixed
        header = (name.encode("ascii"), value.encode("utf-8", "surrogateescape"))
    needles = (secret, *processor.needles(secret))
    return Credential(processor, secret, label, processor.target, header, needles, inapplicable)


@dataclass
class Injected:
    """What went into a request: for the audit line and the response scrubber."""

    labels: list[str] = field(default_factory=list)
    overwrote: list[str] = field(default_factory=list)
    needles: list[str] = field(default_factory=list)
    rejected: list[Callable[[], None]] = field(default_factory=list)  # see Credential

    def record(self, cred: Credential) -> None:
        self.labels.append(cred.label)
        self.needles.extend(cred.needles)
        if cred.rejected is not None:
            self.rejected.append(cred.rejected)

    def scrubber(self) -> Scrubber:
        """The response scrubber for what went in; a Denial (`credentials_too_large`) past
        `MAX_NEEDLES` or `MAX_NEEDLE_BYTES`. A sandbox that may send sealed tokens chooses
        needles (anyone with the proxy's public key can mint a token)."""
        scrubber = Scrubber(self.needles)
        size = sum(map(len, scrubber.needles))
        if len(scrubber.needles) > MAX_NEEDLES or size > MAX_NEEDLE_BYTES:
            raise Denial(
                Reason.CREDENTIALS_TOO_LARGE,
                f"the request's credentials make {len(scrubber.needles)} forms to scrub, "
                f"{size} bytes (at most {MAX_NEEDLES}, {MAX_NEEDLE_BYTES} bytes)",
            )
        return scrubber


def write(
    request: http.Request,
    credentials: Sequence[Credential],
    into: Injected,
    *,
    strip: Collection[bytes] = (),
) -> list[Credential]:
    """Remove the `strip` headers (names lower case, encoded), then put `credentials` in, in
    order, overwriting what the sandbox sent under the same name (except a placeholder, which
    replaces only itself). Any credential makes the request ask for an identity encoding and no
    transfer coding, so its response can be scrubbed.
    Returns the credentials that need the body (`Processor.needs_body`: a signature over it):
    recorded, but for `put` to write once the body is here."""
    fixed: dict[bytes, tuple[bytes, bytes]] = {}
    dynamic: list[Credential] = []
    for cred in credentials:
        into.record(cred)
        if cred.header is None:
            dynamic.append(cred)
        else:
            fixed[cred.key] = cred.header
    for cred in dynamic:
        if cred.key in fixed:
            # One would silently undo the other, whichever went second.
            raise Denial(Reason.INJECTION_CONFLICT, f"two credentials write {cred.target}")
    drop = set(strip)
    if credentials:
        drop.add(_IDENTITY[0])
    if drop:
        _rewrite_headers(request, drop, fixed, bool(credentials), into)
    signed = []
    for cred in dynamic:
        if cred.processor.needs_body(FlowRequest(request, cred), clock()):
            signed.append(cred)
        else:
            put(request, cred, into)
    return signed


def _rewrite_headers(
    request: http.Request,
    drop: set[bytes],
    fixed: dict[bytes, tuple[bytes, bytes]],
    identity: bool,
    into: Injected,
) -> None:
    kept = []
    overwrote = set()
    for name, value in request.headers.fields:
        lower = name.lower()
        if lower in fixed:
            overwrote.add(lower.decode())
        elif lower == b"te" and identity:
            # Transfer codings (TE: gzip) would compress the response past the scrubber; only
            # `trailers` (which gRPC needs) stays.
            if _TRAILERS in (t.split(b";")[0].strip() for t in value.lower().split(b",")):
                kept.append((name, _TRAILERS))
        elif lower not in drop:
            kept.append((name, value))
    kept.extend(fixed.values())
    if identity:
        kept.append(_IDENTITY)
    into.overwrote.extend(sorted(overwrote))
    request.headers.fields = tuple(kept)


def put(request: http.Request, cred: Credential, into: Injected | None = None) -> None:
    """Write one credential whose value depends on the request (a query parameter, a
    placeholder's replacement, a signature) through its processor."""
    flow = FlowRequest(request, cred)
    try:
        if into is not None and cred.processor.sent(flow):
            into.overwrote.append(cred.target)
        written = cred.processor.inject(cred.secret, flow, now=clock())
        if into is not None and written is not None:
            # Recorded only for what goes in with the headers: the scrubber is armed then.
            into.needles.append(written)
    except InjectionError as exc:
        raise _denial(cred, exc) from None


def _denial(cred: Credential, exc: InjectionError) -> Denial:
    """An injection error as the Denial the sandbox reads."""
    reason = cred.inapplicable if isinstance(exc, RequestInapplicable) else exc.reason
    return Denial(reason, str(exc))
