"""How big and how slow a client's request head may be, how long a connection may idle, how long
an upstream may take to answer (deadline.py), and how much of a refused body is read
after its refusal (linger.py).

mitmproxy buffers an HTTP/1 request head until its blank line however long that takes and
however large it grows (a 16 MB header, 100,000 fields and a 4 MB URI all went upstream; one
connection fed 256 MiB of header and held it), and keeps an idle connection for ten minutes.
These are the bounds `sealgate proxy` puts in (mitm.py wires them into mitmproxy's HTTP/1
server and its connection watchdog): a head is refused while it is being read, never buffered
whole, and the answer says which bound it broke.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from mitmproxy import http

from sealgate.reasons import Reason

from ..errors import Denial


@dataclass(frozen=True, slots=True)
class HttpLimits:
    header_bytes: int = 64 * 1024  # the request line and every field, as received
    header_fields: int = 100
    uri_bytes: int = 8 * 1024
    header_seconds: float = 10.0  # from a head's first byte to its blank line
    idle_seconds: float = 60.0  # a connection with nothing sent either way is closed
    response_seconds: float = 60.0  # from a request sent in full to its response head
    # A refused request's body read and dropped after its refusal (linger.py): the most
    # bytes per connection, and for how long from the refusal.
    linger_bytes: int = 64 * 1024 * 1024
    linger_seconds: float = 5.0

    def __post_init__(self) -> None:
        for name in ("header_bytes", "header_fields", "uri_bytes", "header_seconds",
                     "idle_seconds", "response_seconds", "linger_bytes", "linger_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


# A flow's metadata key for its request's record (request/flowstate.py), where the request path
# leaves the bounds of that one request before any of it is streamed or sent.
META: Final = "sealgate"


class Bounds(Protocol):
    """What the engine reads of a request's record."""

    @property
    def response_timeout(self) -> float | None: ...  # its rule's, over the proxy's (deadline.py)

    @property
    def max_request_bytes(self) -> int | None: ...  # its policy's, as it streams (bodycap.py)


class _InForce:
    bounds = HttpLimits()


def enforce(bounds: HttpLimits) -> None:
    """The bounds of this process (mitm.py's install; the defaults under plain mitmdump)."""
    _InForce.bounds = bounds


def in_force() -> HttpLimits:
    return _InForce.bounds


def while_read(size: int, waited: float, limits: HttpLimits) -> Denial | None:
    """The refusal of a head as it is read: `size` bytes (all of it once its blank line has
    come, else what has come so far) `waited` seconds after its first: over the size (431) or
    too slow (408); None while within both."""
    if size > limits.header_bytes:
        return Denial(Reason.HEADERS_TOO_LARGE,
                      f"the request head is over {limits.header_bytes} bytes")
    if waited > limits.header_seconds:
        return Denial(Reason.REQUEST_TIMEOUT,
                      f"the request head took over {limits.header_seconds:g} s")
    return None


def parsed(request: http.Request, limits: HttpLimits) -> Denial | None:
    """The refusal of a complete head: a target over the URI bound (414) or too many fields
    (431); None when it is within them."""
    if len(request.data.path) > limits.uri_bytes:
        return Denial(Reason.URI_TOO_LONG, f"the request target is over {limits.uri_bytes} bytes")
    if len(request.headers.fields) > limits.header_fields:
        return Denial(Reason.HEADERS_TOO_LARGE,
                      f"more than {limits.header_fields} header fields")
    return None
