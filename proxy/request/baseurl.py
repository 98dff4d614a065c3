"""Base-URL mode: a client that speaks plain HTTP to the proxy and names the upstream in the path.

    GET /_/api.openai.com/v1/models HTTP/1.1          ->  GET https://api.openai.com/v1/models
    GET /_/sg1.…,sg1.…@api.stripe.com/v1/charges       ->  the same, with these sealed tokens

An SDK pointed at `http://<proxy>/_/<host>` needs no proxy support, no CA and no code (stripe
pins its own CA bundle; Node's fetch ignores HTTPS_PROXY), and the client side costs no TLS. The
proxy speaks verified TLS upstream. Here the request is only rewritten into the absolute-form
request it stands for, before any decision: identity, guard, rules, budgets, injection and
scrubbing are then the intercepting path's, by construction.

Only an origin-form request on the explicit listener, outside any tunnel, is read this way
(`mitm.origin_form`): inside a tunnel, or in absolute form, `/_/` is an ordinary path.

Some SDKs percent-encode the base URL's path as they join it (botocore writes
`/_/s3.amazonaws.com%3A443`, `%40` for the `@`): in the `/_/` segment, and only there, the
escapes of the characters an authority and a token list are written with (`: @ , [ ]`) are read
as those characters, once; any other escape stays, and no host has one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from mitmproxy import http

from sealgate.hostname import Host
from sealgate.hostport import format_hostport
from sealgate.reasons import Reason

from ..errors import Denial
from ..net.guard import parse_target

PREFIX: Final = "/_/"
_DEFAULT_PORT: Final = 443
_DELIMITER: Final = re.compile(r"%(3A|40|2C|5B|5D)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class BaseUrl:
    """What the prefix named: the upstream, the sealed tokens it carried, and the prefix itself
    (a redirect from the upstream is pointed back through it)."""

    host: Host
    port: int
    tokens: str  # the comma-separated list as written, "" for none
    prefix: str  # "/_/<segment>", as the client wrote it
    here: str = ""  # the proxy as the client named it (`http://<its Host>`), "" if unreadable

    @property
    def authority(self) -> str:
        if self.port != _DEFAULT_PORT:
            return format_hostport(self.host.name, self.port)
        return f"[{self.host.name}]" if ":" in self.host.name else self.host.name


def applies(path: str) -> bool:
    return path.startswith(PREFIX)


def rewrite(request: http.Request) -> BaseUrl:
    """Point `request` at the upstream its `/_/` prefix names. Raises Denial (`bad_request`, or
    the host's own reason) for a prefix that names none."""
    rest = request.path[len(PREFIX):]
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    segment, path = rest[:end], rest[end:]
    tokens, at, authority = _DELIMITER.sub(_unescaped, segment).rpartition("@")
    if not authority:
        raise Denial(Reason.BAD_REQUEST, "a base-URL request is /_/<host>[:<port>]/<path>")
    if at and not tokens:
        raise Denial(Reason.BAD_REQUEST, "an empty token list before '@' in a base-URL request")
    host, port = parse_target(authority, _DEFAULT_PORT)
    named = BaseUrl(host, port, tokens, PREFIX + segment, _here(request.host_header))
    request.scheme = "https"
    request.data.host, request.data.port = host.name, port
    request.path = path if path.startswith("/") else "/" + path
    # The Host the client sent names the proxy; the upstream is told its own name.
    request.host_header = named.authority
    return named


def _unescaped(escape: re.Match[str]) -> str:
    return chr(int(escape.group(1), 16))


def redirected(location: str, named: BaseUrl) -> str | None:
    """A `Location` from the upstream, pointed back through the proxy, absolute (clients such
    as PyGithub follow a redirect only to the scheme, host and port they started from): one to
    the same upstream keeps the prefix (tokens included), one to another https host gets its
    own (a scheme-relative `//host/...` is read as https, the upstream's scheme). None when it
    needs no change (a relative path, or plain http, which is refused)."""
    if location.startswith("/") and not location.startswith("//"):
        return named.here + named.prefix + location
    if location.startswith("//"):
        # Scheme-relative: against the client's http base it would be plain http, around the
        # proxy; the upstream meant its own scheme, https.
        location = "https:" + location
    scheme, sep, rest = location.partition("://")
    if not sep or scheme.lower() != "https":
        return None
    authority, slash, path = rest.partition("/")
    try:
        host, port = parse_target(authority, _DEFAULT_PORT)
    except Denial:
        return None
    prefix = named.prefix if (host, port) == (named.host, named.port) else (
        PREFIX + BaseUrl(host, port, "", "").authority
    )
    return named.here + (f"{prefix}{slash}{path}" if slash else prefix + "/")


def _here(host_header: str | None) -> str:
    """`http://<host>[:<port>]` for the Host the client sent the proxy, read as every host is;
    "" (a relative Location) when it does not read as one."""
    if not host_header:
        return ""
    try:
        host, port = parse_target(host_header, 80)
    except Denial:
        return ""
    return "http://" + (format_hostport(host.name, port) if port != 80 else (
        f"[{host.name}]" if ":" in host.name else host.name))
