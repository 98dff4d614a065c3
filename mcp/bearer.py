"""Bearer tokens sealgate mints for its own MCP endpoint, each bound to one sandbox and to one
endpoint (the spec's audience), and the challenges that ask for one (docs/mcp.md, "Who calls").
Standard library only: `sealgate mcp token` mints in the main virtualenv, the server checks in
the MCP one.

    token  = "sgm1" "." kid "." claims "." mac
    kid    = 16 lowercase hex digits: SHA-256(key)[:8], so it follows from the key alone
    claims = base64url without padding of one JSON object, exactly
             {"sub": sandbox id, "aud": the endpoint's canonical resource URI,
              "iat": issued at, "exp": expires at}          (integer Unix seconds)
    mac    = base64url without padding of HMAC-SHA256(key, "sgm1." kid "." claims)

HMAC rather than a signature: what mints (`sealgate mcp token`) and what checks (`sealgate mcp
serve`) read the same state directory, so a key pair would keep nothing from a reader of that
directory (which holds the secret store besides), and HMAC needs nothing beyond the standard
library in either virtualenv. Not a JWT: no `alg` or header for a verifier to be talked into
trusting; the format is fixed, and everything is checked before the claims are parsed.

The key is `<state>/mcp-token.key`, 32 random bytes as 64 hex digits, mode 0600, made by the
first `sealgate mcp token`; removing or replacing it revokes every token made with it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from sealgate.reasons import Reason, SealgateError
from sealgate.watch import Snapshot

__all__ = ["DEFAULT_TTL", "KEY_FILE", "MAX_TTL", "WELL_KNOWN", "Claims", "InvalidToken",
           "KeyFile", "TokenKey", "canonical_resource", "challenges", "check", "create_key",
           "load_key", "metadata_paths", "metadata_url", "mint", "verify"]

log = logging.getLogger("sealgate.mcp")

PREFIX: Final = "sgm1"
KEY_FILE: Final = "mcp-token.key"
DEFAULT_TTL: Final = 3600
MAX_TTL: Final = 86400  # checked at minting and again at every use
SKEW: Final = 30  # seconds a clock may be off: minted and checked on hosts sharing the state
MAX_RESOURCE: Final = 1024
# The longest claims (a 64-character id, a MAX_RESOURCE URI, two 10-digit times) fit; a token
# longer than this is refused before anything in it is decoded.
MAX_TOKEN: Final = 2048
WELL_KNOWN: Final = "/.well-known/oauth-protected-resource"  # RFC 9728 section 3
REALM: Final = 'Basic realm="sealgate-mcp"'
_TOKEN: Final = re.compile(r"sgm1\.([0-9a-f]{16})\.([A-Za-z0-9_-]{2,2000})\.([A-Za-z0-9_-]{43})")
_KEY_TEXT: Final = re.compile(r"([0-9a-f]{64})\n?")
_SANDBOX: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # the rules' sandbox id
_CLAIMS: Final = ("sub", "aud", "iat", "exp")
_RELOAD_EVERY: Final = 1.0


class InvalidToken(SealgateError):
    """A bearer that proves nothing. Its text is fixed wording, never anything of the token:
    it goes into the 401's error_description and the JSON-RPC error."""

    reason = Reason.IDENTITY_INVALID


@dataclass(frozen=True)
class TokenKey:
    secret: bytes

    @property
    def kid(self) -> str:
        return hashlib.sha256(self.secret).hexdigest()[:16]

    def __repr__(self) -> str:  # never the secret, whatever prints a key
        return f"TokenKey(kid={self.kid})"


@dataclass(frozen=True)
class Claims:
    sandbox: str
    audience: str
    issued: int
    expires: int


def mint(key: TokenKey, sandbox: str, audience: str, ttl: int, now: int) -> str:
    """A token for `sandbox` at the endpoint `audience` (canonical_resource's form), valid for
    `ttl` seconds from `now`; ValueError naming what is wrong (check)."""
    check(sandbox, audience, ttl)
    claims = json.dumps({"sub": sandbox, "aud": audience, "iat": now, "exp": now + ttl},
                        separators=(",", ":"), ensure_ascii=True)
    signed = f"{PREFIX}.{key.kid}.{_b64(claims.encode())}"
    return f"{signed}.{_mac(key, signed)}"


def check(sandbox: str, audience: str, ttl: int) -> None:
    """ValueError unless a token can be minted with these (before a key is made for one)."""
    if not _SANDBOX.fullmatch(sandbox):
        raise ValueError("a sandbox id is 1-64 of A-Z a-z 0-9 . _ -, starting with a letter "
                         "or digit")
    if canonical_resource(audience) != audience:
        raise ValueError("the audience must be in canonical form (canonical_resource)")
    if not 1 <= ttl <= MAX_TTL:
        raise ValueError(f"a token lives 1 to {MAX_TTL} seconds")


def verify(key: TokenKey | None, token: str, audience: str, now: float) -> Claims:
    """The claims of a token made with `key` for `audience`, current at `now`; InvalidToken
    otherwise. In this order: its size, its shape, the key, the mac, and only then the claims
    are read."""
    if len(token) > MAX_TOKEN:
        raise InvalidToken(f"the token is over {MAX_TOKEN} characters")
    shape = _TOKEN.fullmatch(token)
    if shape is None:
        raise InvalidToken("not a sealgate MCP token (sgm1.<kid>.<claims>.<mac>)")
    if key is None:
        raise InvalidToken("this server has no token key yet (sealgate mcp token makes it)")
    kid, body, mac = shape.groups()
    if not hmac.compare_digest(kid, key.kid):
        raise InvalidToken("the token was made with another key than this server's")
    if not hmac.compare_digest(mac, _mac(key, token[:shape.start(3) - 1])):
        raise InvalidToken("the token's signature does not match")
    claims = _claims(body)
    if not 0 < claims.expires - claims.issued <= MAX_TTL:
        raise InvalidToken(f"the token's lifetime is not within 1 to {MAX_TTL} seconds")
    if claims.issued > now + SKEW:
        raise InvalidToken("the token was issued in the future")
    if now >= claims.expires + SKEW:
        raise InvalidToken("the token has expired")
    if claims.audience != audience:
        raise InvalidToken("the token is for another resource than this endpoint")
    return claims


def _claims(text: str) -> Claims:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        parsed = json.loads(raw, object_pairs_hook=_unique, parse_float=_no_number,
                            parse_constant=_no_number)
    except (binascii.Error, ValueError, RecursionError):
        raise InvalidToken("the token's claims do not parse") from None
    if not isinstance(parsed, dict) or tuple(parsed) != _CLAIMS:
        raise InvalidToken("the token's claims are not sub, aud, iat, exp")
    sub, aud, iat, exp = (parsed[name] for name in _CLAIMS)
    if not (isinstance(sub, str) and _SANDBOX.fullmatch(sub) and isinstance(aud, str)
            and all(type(t) is int and t >= 0 for t in (iat, exp))):
        raise InvalidToken("the token's claims are not of their types")
    return Claims(sub, aud, iat, exp)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("a key twice")
    return found


def _no_number(text: str) -> Any:
    raise ValueError(f"{text[:16]} is no integer")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _mac(key: TokenKey, signed: str) -> str:
    return _b64(hmac.new(key.secret, signed.encode("ascii"), hashlib.sha256).digest())


def canonical_resource(url: str) -> str:
    """An MCP endpoint's resource URI as the spec compares it (RFC 8707 section 2, RFC 9728):
    http or https, a host, no user information, query or fragment; scheme and host lower case,
    a default port and a lone `/` path dropped. ValueError naming what is wrong."""
    if len(url) > MAX_RESOURCE or not url.isascii() or any(c <= " " or c == "\x7f" for c in url):
        raise ValueError(f"a resource URI is at most {MAX_RESOURCE} printable ASCII characters")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url[:80]!r}: a resource URI is http(s)://HOST[:PORT][/PATH]")
    if "?" in url or "#" in url or "@" in parts.netloc:
        raise ValueError(f"{url[:80]!r}: no query, fragment or user information in a resource "
                         "URI")
    port = parts.port  # ValueError for a port that is not one
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    shown = host if port in (None, {"http": 80, "https": 443}[scheme]) else f"{host}:{port}"
    return f"{scheme}://{shown}{'' if parts.path == '/' else parts.path}"


def metadata_paths(resource: str) -> tuple[str, ...]:
    """Where the protected-resource metadata is served: RFC 9728's path-suffixed form for a
    resource with a path (the form its section 3.1 defines), and the root form."""
    path = urlsplit(resource).path
    return (WELL_KNOWN + path, WELL_KNOWN) if path else (WELL_KNOWN,)


def metadata_url(resource: str) -> str:
    """The metadata's URL a challenge names: the most specific of metadata_paths."""
    parts = urlsplit(resource)
    return f"{parts.scheme}://{parts.netloc}{metadata_paths(resource)[0]}"


def challenges(resource: str, error: str | None = None, description: str = ""
               ) -> tuple[tuple[bytes, bytes], ...]:
    """The WWW-Authenticate headers of a refusal: the Bearer challenge naming the metadata
    (with `error`, RFC 6750 section 3.1, when a bearer failed or was ambiguous), and the Basic
    one for the sandbox's proxy credentials. Both schemes are always accepted, so both are
    offered. A failed bearer's challenge comes first (a client may read only the first, as
    some parsers of a joined header do); otherwise Basic comes first, as it did alone before
    bearers were taken, and a client looking for the metadata finds it at its well-known URL
    all the same (the spec's fallback)."""
    bearer = f'Bearer resource_metadata="{metadata_url(resource)}"'
    if error is None:
        return ((b"www-authenticate", REALM.encode("ascii")),
                (b"www-authenticate", bearer.encode("ascii")))
    bearer += f', error="{error}"'
    if description:  # RFC 6750's error_description: no quote or backslash
        bearer += f', error_description="{_quotable(description)}"'
    return ((b"www-authenticate", bearer.encode("ascii")),
            (b"www-authenticate", REALM.encode("ascii")))


def _quotable(text: str) -> str:
    return "".join(c for c in text if " " <= c <= "~" and c not in '"\\')


def create_key(path: Path) -> TokenKey:
    """The key in `path`, made (32 random bytes) if absent: written whole to a file of its own
    (mode 0600) and linked into place, so that no reader ever sees half a key and, of two
    makers at once, the first link wins and both use its key."""
    try:
        return load_key(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".mcp-token.", suffix=".new")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_bytes(32).hex() + "\n")
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileExistsError):  # another maker's link won: theirs
            os.link(temp, path)
    finally:
        os.unlink(temp)
    return load_key(path)


def load_key(path: Path) -> TokenKey:
    """The key in `path`; FileNotFoundError when absent, ValueError when others than its owner
    may read or write it or it is not a key. Never says anything of the key's text."""
    with path.open(encoding="ascii", errors="replace") as file:
        if os.fstat(file.fileno()).st_mode & 0o077:
            raise ValueError(f"{path}: group or others have access to it (chmod 600 it)")
        text = file.read(128)
    found = _KEY_TEXT.fullmatch(text)
    if found is None:
        raise ValueError(f"{path}: not a token key (64 lowercase hex digits)")
    return TokenKey(bytes.fromhex(found.group(1)))


class KeyFile:
    """The server's view of the key file, read again when it changes (looked at once a second
    at most), so a key made after the server started, replaced or removed takes effect without
    a restart; a removed or unusable file is no key (every token refused), said on stderr."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen = Snapshot.unread((path,))
        self._key: TokenKey | None = None
        self._looked = float("-inf")

    def current(self) -> TokenKey | None:
        now = time.monotonic()
        if now - self._looked < _RELOAD_EVERY:
            return self._key
        self._looked = now
        if self._seen.changed():
            identities = self._seen.now()
            try:
                self._key = load_key(self.path)
            except FileNotFoundError:
                self._key = None
            except (OSError, ValueError) as exc:
                self._key = None
                log.error("sealgate mcp: token key unusable, every bearer is refused: %s", exc)
            self._seen = self._seen.retake(identities)
        return self._key
