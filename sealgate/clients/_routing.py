"""The pure part of the client helpers: the proxy's address, the credentials a client shows it,
and the base-URL rewriting. No I/O and no HTTP library, so every rule here is unit-tested on
strings; `_requests`, `_httpx` and `sealgate.mjs` only apply them.

Formats (docs/clients.md):
- proxy credentials: `Proxy-Authorization: Basic base64(user:password)`, where a sandbox sends
  `<id>:<key>` or `<id>:<key>,<token>,...`, and a client without identity `:<token>,...`;
- base-URL mode: `https://<host>[:<port>]/<path>?<query>` is sent as plain HTTP to
  `http://<proxy>/_/[<token>,...@]<host>[:<port>]/<path>?<query>`.

Nothing a caller passes is trusted to be well formed: a host is read by the grammar the proxy
reads it with (`sealgate.hostname.split_authority`), and a token, a key or a URL with a
character that could end a header or split a list is refused here, before anything is sent.
Error messages never repeat a key.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, unquote

from ..hostname import HostError, split_authority
from ..reasons import SealgateError

MAX_TOKENS: Final = 8  # the proxy reads at most 8 tokens per request (token-format.md §10)
MAX_TOKEN_LENGTH: Final = 8192  # token-format.md §1
PREFIX: Final = "/_/"
TOKENIZER_HEADER: Final = "Proxy-Tokenizer"
PROXY_VARIABLES: Final = ("HTTPS_PROXY", "https_proxy")
# What `sealgate env` sets, in the order a missing `ca_bundle=` is looked up.
CA_VARIABLES: Final = ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE")

_TOKEN = re.compile(r"sg1\.[0-9a-f]{16}\.[A-Za-z0-9_-]+")
_SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # docs/rules.md, names and ids
_KEY = re.compile(r"[\x21-\x2b\x2d-\x7e]{1,4096}")  # visible ASCII but ','
_URL_TEXT = re.compile(r"[\x21-\x7e]*")  # a request target: visible ASCII only
_DEFAULT_HTTPS_PORT: Final = 443


class ClientConfigError(SealgateError, ValueError):
    """A proxy URL, credential, token or URL the helpers will not send."""


@dataclass(frozen=True, slots=True)
class ProxyAddress:
    """Where the proxy's explicit listener is: a canonical host and a port."""

    host: str  # canonical; IPv6 without brackets
    port: int

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def origin(self) -> str:
        return f"http://{self.authority}"


# The user that claims no sandbox (sandbox ids start with a letter or digit): requests, httpx and
# curl send no credentials at all for an empty user.
NO_ONE = "_"


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a client shows the proxy: a sandbox and its key, connection-scoped tokens, both or
    neither. Built by `credentials()`, which checks every part."""

    sandbox: str | None = None
    key: str | None = None
    tokens: tuple[str, ...] = ()

    def __repr__(self) -> str:  # the key is a secret: never in a repr, a log or a traceback
        key = "<hidden>" if self.key is not None else None
        return f"Credentials(sandbox={self.sandbox!r}, key={key}, tokens={len(self.tokens)})"

    @property
    def user_password(self) -> tuple[str, str] | None:
        """(user, password) of the Basic credential, None when there is nothing to show."""
        if self.sandbox is not None and self.key is not None:
            return self.sandbox, ",".join((self.key, *self.tokens))
        if self.tokens:
            return NO_ONE, ",".join(self.tokens)
        return None

    @property
    def proxy_authorization(self) -> str | None:
        """The `Proxy-Authorization` value, or None."""
        pair = self.user_password
        if pair is None:
            return None
        raw = f"{pair[0]}:{pair[1]}".encode("ascii")  # every part was checked to be ASCII
        return "Basic " + base64.b64encode(raw).decode("ascii")

    @property
    def userinfo(self) -> str | None:
        """`user:password` percent-encoded for a URL (`http://<userinfo>@host:port`)."""
        pair = self.user_password
        if pair is None:
            return None
        user, password = pair
        parts = password.split(",")
        if self.sandbox is not None:  # the key may hold anything but ','; tokens need no escape
            parts[0] = quote(parts[0], safe="")
        return f"{quote(user, safe='')}:{','.join(parts)}"


# -- checking what the caller passed -------------------------------------------------------------


def check_tokens(tokens: str | Iterable[str]) -> tuple[str, ...]:
    """The tokens as a tuple, each checked to be one `sg1.<16 hex>.<base64url>` token (a str
    is one token). The proxy checks them fully; this refuses what would change the meaning of a
    list or a header before it is sent: a ',', '@', whitespace, CR or LF, an empty token, more
    than `MAX_TOKENS`. Duplicates are dropped."""
    items = (tokens,) if isinstance(tokens, str) else tuple(tokens)
    seen: dict[str, None] = {}
    for number, token in enumerate(items, 1):
        if not isinstance(token, str):
            raise ClientConfigError(f"token {number} is a {type(token).__name__}, not a str")
        problem = _token_problem(token)
        if problem:
            raise ClientConfigError(f"token {number} {problem}")
        seen[token] = None
    if len(seen) > MAX_TOKENS:
        raise ClientConfigError(f"{len(seen)} tokens: the proxy takes at most {MAX_TOKENS}")
    return tuple(seen)


def _token_problem(token: str) -> str | None:
    if not token:
        return "is empty"
    if len(token) > MAX_TOKEN_LENGTH:
        return f"is {len(token)} characters long (at most {MAX_TOKEN_LENGTH})"
    if "," in token:
        return "has a ',': pass each token on its own, not a comma-separated list"
    if "\r" in token or "\n" in token:
        return "has a CR or LF"
    if any(c.isspace() for c in token):
        return "has whitespace"
    if not _TOKEN.fullmatch(token):
        return "is not a sealed token (sg1.<16 hex digits>.<base64url>)"
    return None


def credentials(
    sandbox: str | None = None, key: str | None = None, tokens: str | Iterable[str] = ()
) -> Credentials:
    """Checked credentials. A sandbox needs its key and a key its sandbox; the key is visible
    ASCII without ',' (the proxy splits the password on ','), never echoed in an error."""
    checked = check_tokens(tokens)
    if (sandbox is None) != (key is None):
        raise ClientConfigError("sandbox= and key= go together: the key proves the sandbox")
    if sandbox is not None and not _SANDBOX_ID.fullmatch(sandbox):
        raise ClientConfigError(
            f"sandbox id {sandbox[:70]!r} is not 1-64 of A-Z a-z 0-9 . _ - starting with a "
            "letter or digit"
        )
    if key is not None and not _KEY.fullmatch(key):
        raise ClientConfigError(
            "the sandbox key must be 1-4096 visible ASCII characters without ',' "
            "(not shown here)"
        )
    return Credentials(sandbox, key, checked)


# -- the proxy's address ----------------------------------------------------------------------


def parse_proxy(
    proxy: str | None, environ: Mapping[str, str] | None = None
) -> tuple[ProxyAddress, Credentials]:
    """The proxy's address and whatever credentials its URL carries (`http://id:key@host:port`,
    as `sealgate env` writes it, or `http://_:<token>,...@host:port`). `None` reads
    HTTPS_PROXY (then https_proxy) from `environ` (default os.environ). A port is required:
    clients disagree on the default (80 or 1080), and the proxy has its own."""
    if proxy is None:
        env = os.environ if environ is None else environ
        proxy = next((env[name] for name in PROXY_VARIABLES if env.get(name)), None)
        if proxy is None:
            raise ClientConfigError(
                "no proxy given and neither HTTPS_PROXY nor https_proxy is set"
            )
    if not _URL_TEXT.fullmatch(proxy):
        raise ClientConfigError("the proxy URL has whitespace, a control or a non-ASCII character")
    text = proxy if "://" in proxy else "http://" + proxy
    scheme, _, rest = text.partition("://")
    if scheme.lower() != "http":
        raise ClientConfigError(
            f"the proxy URL's scheme is {scheme[:20]!r}: sealgate's listener speaks plain "
            "http:// (the TLS is to the upstream, through it)"
        )
    authority, _, tail = rest.partition("/")
    if tail or any(c in authority for c in "?#"):
        raise ClientConfigError("the proxy URL is http://[user:password@]host:port, no path")
    userinfo, at, hostport = authority.rpartition("@")
    try:
        host, port = split_authority(hostport)
    except HostError as exc:
        raise ClientConfigError(f"the proxy's address: {exc}") from None
    address = ProxyAddress(host.name, port)
    if not at:
        return address, Credentials()
    user_text, _, password_text = userinfo.partition(":")
    try:  # split before decoding: an encoded ',' is part of its element, which then fails
        user = unquote(user_text, errors="strict")
        parts = [unquote(p, errors="strict") for p in password_text.split(",")]
    except UnicodeDecodeError:
        raise ClientConfigError("the proxy URL's credentials are not UTF-8") from None
    if parts == [""]:
        parts = []
    if user and user != NO_ONE:
        if not parts:
            raise ClientConfigError("the proxy URL names a sandbox without its key")
        return address, credentials(user, parts[0], parts[1:])
    return address, credentials(tokens=parts)


def resolve(
    proxy: str | None,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> tuple[ProxyAddress, Credentials]:
    """The proxy and the credentials to show it: the URL's, and the arguments'. A sandbox named
    both in the URL and as an argument is refused (which one was meant?); tokens add up."""
    address, in_url = parse_proxy(proxy, environ)
    given = credentials(sandbox, key, tokens)
    if in_url.sandbox is not None and given.sandbox is not None:
        raise ClientConfigError(
            "the proxy URL already names a sandbox: pass it there or as sandbox=/key=, not both"
        )
    return address, credentials(
        in_url.sandbox or given.sandbox,
        in_url.key if in_url.key is not None else given.key,
        (*in_url.tokens, *given.tokens),
    )


def proxy_url(
    proxy: str | None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
) -> str:
    """The proxy URL with its credentials in it, for HTTPS_PROXY or any client that takes one:
    `http://<id>:<key>[,<token>...]@host:port`, or `http://_:<token>,...@host:port`."""
    address, creds = resolve(proxy, sandbox, key, tokens)
    userinfo = creds.userinfo
    return f"http://{userinfo}@{address.authority}" if userinfo else address.origin


def proxy_authorization(
    *, sandbox: str | None = None, key: str | None = None, tokens: str | Iterable[str] = ()
) -> str | None:
    """The `Proxy-Authorization` value for these credentials, or None when there are none."""
    return credentials(sandbox, key, tokens).proxy_authorization


def tokenizer_header(tokens: str | Iterable[str]) -> str:
    """The `Proxy-Tokenizer` value: the checked tokens joined with ','."""
    checked = check_tokens(tokens)
    if not checked:
        raise ClientConfigError("no tokens: send no Proxy-Tokenizer header at all")
    return ",".join(checked)


# -- base-URL mode ----------------------------------------------------------------------------


def route(address: ProxyAddress, url: str, tokens: tuple[str, ...] = ()) -> str:
    """`url` (https only) in base-URL form on the proxy at `address`. `tokens` must have been
    checked (`check_tokens`); they go into the prefix, `/_/<token>,...@<host>`.

    The host is canonicalised as the proxy will read it (lower case, IDNA, compressed IPv6 in
    brackets, port 443 left out); the path and query are kept exactly as written (an empty path
    stays empty, so an SDK can append its own); a fragment is dropped (it is never sent)."""
    if not _URL_TEXT.fullmatch(url):
        raise ClientConfigError(
            "the URL has whitespace, a control or a non-ASCII character: percent-encode it"
        )
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "https":
        raise ClientConfigError(
            f"base-URL mode forwards https:// URLs only, not {scheme[:20]!r}: the proxy speaks "
            "verified TLS to the upstream"
        )
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        raise ClientConfigError(
            "the URL has user information ('user@host'): credentials go in headers or tokens, "
            "never in the URL sent to the proxy"
        )
    try:
        host, port = split_authority(authority, _DEFAULT_HTTPS_PORT)
    except HostError as exc:
        raise ClientConfigError(f"the URL's host: {exc}") from None
    name = f"[{host.name}]" if ":" in host.name else host.name
    target = name if port == _DEFAULT_HTTPS_PORT else f"{name}:{port}"
    tail = tail.partition("#")[0]
    if tail.startswith("?"):
        tail = "/" + tail  # the proxy reads `/_/host?q` too, but `/_/host/?q` is unambiguous
    segment = f"{','.join(tokens)}@{target}" if tokens else target
    return f"{address.origin}{PREFIX}{segment}{tail}"


def unroute(address: ProxyAddress, location: str) -> str | None:
    """A `Location` the proxy sent back in base-URL form (`/_/...` or `http://<proxy>/_/...`),
    as the https URL it stands for; None when it is not in that form. The prefix's tokens are
    dropped: the client adds its own to the next request."""
    own = address.origin
    if location.lower().startswith(own.lower() + PREFIX):
        location = location[len(own):]
    if not location.startswith(PREFIX):
        return None
    rest = location[len(PREFIX):]
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    segment, tail = rest[:end], rest[end:]
    authority = segment.rpartition("@")[2]
    try:
        host, port = split_authority(authority, _DEFAULT_HTTPS_PORT)
    except HostError:
        return None
    name = f"[{host.name}]" if ":" in host.name else host.name
    target = name if port == _DEFAULT_HTTPS_PORT else f"{name}:{port}"
    return f"https://{target}{tail}"


def at_proxy(address: ProxyAddress, url: str) -> bool:
    """Whether `url` is already addressed to the proxy's listener (say an SDK's base URL)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "http":
        return False
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    try:
        host, port = split_authority(rest[:end], 80)
    except HostError:
        return False
    return (host.name, port) == (address.host, address.port)


def base_url_headers(creds: Credentials) -> dict[str, str]:
    """The headers a base-URL request carries: the sandbox's `Proxy-Authorization` (its key
    only: the tokens go in `Proxy-Tokenizer`, which applies to this request alone)."""
    headers: dict[str, str] = {}
    own = Credentials(creds.sandbox, creds.key).proxy_authorization
    if own is not None:
        headers["Proxy-Authorization"] = own
    if creds.tokens:
        headers[TOKENIZER_HEADER] = ",".join(creds.tokens)
    return headers


def base_url(proxy: str | None, url: str, *, tokens: str | Iterable[str] = ()) -> str:
    """`url` rewritten for base-URL mode: `https://api.stripe.com` on the proxy at
    `http://10.0.0.5:8080` is `http://10.0.0.5:8080/_/api.stripe.com`, with `tokens` it is
    `http://10.0.0.5:8080/_/<token>,...@api.stripe.com`. For SDKs that take a base URL.

    Credentials in the proxy URL are not carried over: a base URL has no place for the key
    (one in its user information would be sent upstream as `Authorization`). The identity is
    then the source address the sandbox runtime registered, or the default policy; an SDK that
    can add headers may send `proxy_authorization(...)` as `Proxy-Authorization`."""
    address, _ = parse_proxy(proxy)
    return route(address, url, check_tokens(tokens))


def ca_bundle(given: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None,
              ) -> str | None:
    """The CA bundle to verify the proxy's certificates with: `given`, else the first of
    REQUESTS_CA_BUNDLE, SSL_CERT_FILE, CURL_CA_BUNDLE that is set (what `sealgate env` writes),
    else None (the library's default roots, which do not hold the proxy's CA)."""
    if given is not None:
        return os.fspath(given)
    env = os.environ if environ is None else environ
    return next((env[name] for name in CA_VARIABLES if env.get(name)), None)
