"""What a request names as its destination, and the headers it may not carry either way.

The mitmproxy-facing half of the guard (net/guard.py decides on names and addresses, with no
mitmproxy in it, for the MCP server's process too): every name a request carries must agree
before one of them is checked and dialed, and the headers upstreams or we would trust are
taken out of what crosses.
"""

from __future__ import annotations

from typing import Final

from mitmproxy import http

from sealgate.hostname import Host
from sealgate.hostport import format_hostport
from sealgate.reasons import Reason

from ..errors import Denial
from ..net.guard import parse_target

__all__ = ["request_target", "strip_downstream_headers", "strip_upstream_headers"]

# Headers a sandbox must not be able to send upstream: its proxy credentials, forwarding claims
# that upstreams (and cloud metadata services) trust, and our own control headers.
_STRIP_UP_EXACT: Final = ("proxy-authorization", "proxy-connection", "forwarded", "x-real-ip")
_STRIP_PREFIXES: Final = ("x-forwarded-", "x-sealgate-")
_STRIP_UP_EXACT_B: Final = frozenset(n.encode() for n in _STRIP_UP_EXACT)
_STRIP_PREFIXES_B: Final = tuple(p.encode() for p in _STRIP_PREFIXES)
_SCHEMES: Final = frozenset({"http", "https"})


def request_target(
    request: http.Request, tunnel: tuple[Host, int] | None, transparent: bool
) -> tuple[Host, int]:
    """The one destination a request names, after checking that all its names agree.

    Absolute-form requests name it in the URI (RFC 9112 says a proxy must ignore Host then; we
    go further and refuse a Host that disagrees, since the upstream would route on it). Inside a
    CONNECT tunnel the Host header must name the CONNECT authority, which the TLS SNI has already
    been checked against. In transparent mode the Host header (or SNI) names it and the original
    destination port stays. The caller points the request at exactly what this returns, so
    what mitmproxy dials is what was checked.
    """
    if request.scheme not in _SCHEMES:
        raise Denial(Reason.SCHEME_INVALID, f"scheme {request.scheme!r} is not proxied")
    default_port = 443 if request.scheme == "https" else 80
    header = request.host_header
    # Inside a tunnel and in transparent mode mitmproxy forwards an absolute-form target as it
    # came, and an origin routes on it (RFC 9112 3.2.2): it is a name to check like Host.
    uri = request.authority or None
    # Over HTTP/2 and 3, host_header is `:authority`; a `host` header beside it would reach an
    # HTTP/1 upstream as sent (mitmproxy adds Host only when there is none).
    also = request.headers.get("host") if request.is_http2 or request.is_http3 else None
    if tunnel is not None:
        # A missing port means the tunnel's: the dial goes there regardless.
        for name in (header, uri, also):
            if name is not None and parse_target(name, tunnel[1]) != tunnel:
                raise Denial(
                    Reason.NAME_MISMATCH, "the request names another host than the CONNECT"
                )
        return tunnel
    if transparent:
        if header is None:
            raise Denial(Reason.BAD_REQUEST, "a transparent request needs a Host header")
        host, port = parse_target(header, request.port)
        for name in (uri, also):
            if name is not None and parse_target(name, request.port) != (host, port):
                raise Denial(Reason.NAME_MISMATCH, "the request URI and Host header disagree")
        return host, request.port
    # mitmproxy has parsed the request-target before any hook and kept no raw form of it
    # (`:0` and `:0080` come out as 80), so the Host header, which HTTP/1.1 requires anyway
    # (RFC 9112 3.2), is the spelling that gets checked, and the URI must agree with it.
    uri_host, uri_port = parse_target(format_hostport(request.host, request.port), default_port)
    if header is None:
        raise Denial(Reason.BAD_REQUEST, "a Host header is required")
    if parse_target(header, default_port) != (uri_host, uri_port):
        raise Denial(Reason.NAME_MISMATCH, "Host header does not match the request URI")
    return uri_host, uri_port


def strip_upstream_headers(headers: http.Headers) -> None:
    # Scan the raw fields first: almost every request has nothing to strip, and deleting from
    # mitmproxy's Headers rebuilds them.
    doomed = {
        name.lower()
        for name, _ in headers.fields
        if name.lower() in _STRIP_UP_EXACT_B or name.lower().startswith(_STRIP_PREFIXES_B)
    }
    for name in doomed:
        del headers[name.decode("latin-1")]


def strip_downstream_headers(headers: http.Headers) -> None:
    """An upstream must not be able to forge our verdicts or control headers."""
    doomed = {name.lower() for name, _ in headers.fields if name.lower().startswith(b"x-sealgate-")}
    for name in doomed:
        del headers[name.decode("latin-1")]
