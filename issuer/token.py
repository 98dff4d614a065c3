"""The sealed-token wire format: ``sg1.<kid>.<base64url(sealed box of the claims JSON)>``.

The issuer seals with this module and the proxy opens, checks and applies with it, so the two
cannot disagree about a token. The format is written down in docs/token-format.md and pinned by
tests/vectors/. Order of use: `unseal` and `check_time` (together: `open_token`), then
`check_binding`, `check_scope`, and `apply` (the proxy applies through `inject.py`, which
works the processor out once per opened token).
The processors and the injection itself are `issuer.processors`, shared with the proxy's broker;
their errors are translated here into `TokenError`s.

Secrets: `Claims.secret` is left out of reprs, and no error raised here quotes it or chains an
exception that holds the plaintext. Errors about other fields may quote them, shortened.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import TYPE_CHECKING, ClassVar, Final, assert_never

from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox

from sealgate.issuer import jsonfields
from sealgate.issuer.processors import (
    MutableRequest,
    Processor,
    ProcessorInvalid,
    RequestInapplicable,
    SecretInvalid,
    check_secret,
    inject,
    processor_from_object,
    processor_to_object,
)

if TYPE_CHECKING:
    from sealgate.issuer.keys import Keyring, PublicKeyEntry

__all__ = [
    "CLAIMS_VERSION",
    "CLOCK_SKEW_SECONDS",
    "DEFAULT_PORT",
    "MAX_LIFETIME_SECONDS",
    "MAX_TOKEN_LENGTH",
    "TOKEN_PREFIX",
    "AuthDigestBinding",
    "Binding",
    "Claims",
    "Envelope",
    "HostPattern",
    "PolicyBinding",
    "SandboxBinding",
    "TokenBinding",
    "TokenError",
    "TokenExpired",
    "TokenInapplicable",
    "TokenInvalid",
    "TokenMalformed",
    "TokenScope",
    "apply",
    "check_binding",
    "check_scope",
    "check_time",
    "claims_from_object",
    "claims_from_plaintext",
    "encode_claims",
    "format_token",
    "load_json_object",
    "open_token",
    "parse_envelope",
    "redacted_claims",
    "seal",
    "unseal",
    "validity",
]

TOKEN_PREFIX: Final = "sg1"  # noqa: S105 - a format tag, not a credential
CLAIMS_VERSION: Final = 1
MAX_TOKEN_LENGTH: Final = 8192
# Clocks of the issuer and the proxy may disagree by this much in either direction.
CLOCK_SKEW_SECONDS: Final = 30
# Enforced at use as well as at mint: anyone holding a public key can seal a token, so the
# proxy cannot rely on the issuer's cap alone.
MAX_LIFETIME_SECONDS: Final = 24 * 3600
DEFAULT_PORT: Final = 443
# crypto_box_seal adds an ephemeral X25519 public key (32) and a Poly1305 tag (16).
SEAL_OVERHEAD: Final = 48
REDACTED: Final = "[redacted]"

_KID: Final = re.compile(r"[0-9a-f]{16}")
_B64URL: Final = re.compile(r"[A-Za-z0-9_-]+")
_VISIBLE: Final = re.compile(r"[\x21-\x7e]+")
_METHOD: Final = re.compile(r"[A-Z]{1,20}")
_JTI: Final = re.compile(r"[A-Za-z0-9._~:-]{1,128}")
_HEX_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
_LABEL: Final = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMERIC_LABEL: Final = re.compile(r"[0-9]+|0x[0-9a-f]*")
_PORT: Final = re.compile(r"[1-9][0-9]{0,4}")
_MAX_INT: Final = 2**53
_MAX_LIST: Final = 32


# --- errors -----------------------------------------------------------------------------------


class TokenError(Exception):
    """Why a token was refused. `reason` is the machine code, `status` the HTTP status to answer."""

    reason: ClassVar[str] = "token_error"
    status: ClassVar[int] = 400


class TokenMalformed(TokenError):
    """Bad prefix, shape, base64, size, JSON, schema, unknown field or unknown processor."""

    reason = "token_malformed"
    status = 400


class TokenInvalid(TokenError):
    """Unknown kid, decryption failure, or the sealed kid differs from the visible one."""

    reason = "token_invalid"
    status = 400


class TokenExpired(TokenError):
    """Outside the validity window: past `exp`, or before `nbf`/`iat` (with clock skew)."""

    reason = "token_expired"
    status = 401


class TokenScope(TokenError):
    """The request's host, port, method or path is outside what the token allows."""

    reason = "token_scope"
    status = 403


class TokenBinding(TokenError):
    """The token's binding (sandbox, policy or proxy bearer secret) is not met."""

    reason = "token_binding"
    status = 407


class TokenInapplicable(TokenError):
    """The request lacks what the processor needs (the placeholder it replaces)."""

    reason = "token_inapplicable"
    status = 400


def _show(value: str, limit: int = 40) -> str:
    """A short repr of a non-secret value for an error message."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


# --- strict JSON ------------------------------------------------------------------------------


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {_show(key)}")
        obj[key] = value
    return obj


def _reject_float(_text: str) -> object:
    raise ValueError("numbers must be integers")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 16:
        raise ValueError("integer has too many digits")
    return int(text)


def load_json_object(text: str) -> dict[str, object]:
    """Parse a JSON object strictly: duplicate keys, floats, NaN/Infinity and huge integers are
    errors (ValueError). Error messages carry positions, never content."""
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_pairs,
            parse_float=_reject_float,
            parse_int=_bounded_int,
            parse_constant=_reject_float,
        )
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise ValueError("top level must be a JSON object")
    return value


# --- bindings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SandboxBinding:
    """Usable only by the sandbox with this id."""

    sandbox: str

    def __post_init__(self) -> None:
        if not _VISIBLE.fullmatch(self.sandbox) or len(self.sandbox) > 128:
            raise TokenMalformed("binding: sandbox must be 1-128 visible ASCII characters")


@dataclass(frozen=True)
class PolicyBinding:
    """Usable only by a sandbox running under this policy."""

    policy: str

    def __post_init__(self) -> None:
        if not _VISIBLE.fullmatch(self.policy) or len(self.policy) > 128:
            raise TokenMalformed("binding: policy must be 1-128 visible ASCII characters")


@dataclass(frozen=True)
class AuthDigestBinding:
    """Usable only with `Proxy-Authorization: Bearer <s>` where SHA-256(UTF-8 s) is the digest."""

    auth_sha256: str

    def __post_init__(self) -> None:
        if not _HEX_DIGEST.fullmatch(self.auth_sha256):
            raise TokenMalformed("binding: auth_sha256 must be 64 lowercase hex digits")

    @classmethod
    def of_secret(cls, bearer_secret: str) -> AuthDigestBinding:
        return cls(hashlib.sha256(bearer_secret.encode("utf-8")).hexdigest())


Binding = SandboxBinding | PolicyBinding | AuthDigestBinding
_BINDING_TYPES: Final[Mapping[str, type[Binding]]] = {
    "sandbox": SandboxBinding,
    "policy": PolicyBinding,
    "auth_sha256": AuthDigestBinding,
}


# --- hosts ------------------------------------------------------------------------------------


def _host_error(text: str, why: str) -> TokenMalformed:
    return TokenMalformed(f"host pattern {_show(text, 80)}: {why}")


def _check_dns_name(name: str, text: str) -> None:
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise _host_error(text, "not a lowercase DNS name (use the xn-- form for IDNs)")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        raise _host_error(text, "numeric names must be canonical dotted-quad IPv4 addresses")


@dataclass(frozen=True)
class HostPattern:
    """One allowed destination: an exact host, or with `wildcard` any host strictly below it
    (`*.example.com` matches `a.example.com` and `a.b.example.com`, not `example.com`), on one
    port (443 unless the pattern names another). Hosts are compared lowercase."""

    host: str
    port: int = DEFAULT_PORT
    wildcard: bool = False

    def __post_init__(self) -> None:
        # Checked here, not only in `parse`, so that a pattern built directly cannot be sealed
        # into a token the proxy would then refuse (or read differently).
        if not 1 <= self.port <= 65535:
            raise _host_error(str(self), "port must be 1-65535")
        try:
            address: IPv4Address | IPv6Address | None = ip_address(self.host)
        except ValueError:
            address = None
        if address is not None:
            if self.wildcard:
                raise _host_error(str(self), "a wildcard needs a DNS name, not an address")
            if str(address) != self.host or "%" in self.host:
                raise _host_error(str(self), "IP addresses must be canonical, without zone id")
            return
        _check_dns_name(self.host, str(self))
        if self.wildcard and "." not in self.host:
            raise _host_error(str(self), "a wildcard needs at least two labels after '*.'")

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        """Parse `name`, `*.name`, `a.b.c.d` or `[v6]`, each optionally with `:port`."""
        if len(text) > 300 or not text.isascii():
            raise _host_error(text, "must be at most 300 ASCII characters")
        lowered = text.lower()
        port = DEFAULT_PORT
        if lowered.startswith("["):
            inner, close, rest = lowered[1:].partition("]")
            if not close or (rest and not rest.startswith(":")):
                raise _host_error(text, "bracketed IPv6 must be [address] or [address]:port")
            try:
                address = IPv6Address(inner)
            except ValueError:
                raise _host_error(text, "not an IPv6 address") from None
            if address.scope_id is not None:
                raise _host_error(text, "IPv6 zone ids are not allowed")
            if rest:
                port = _parse_port(rest[1:], text)
            return cls(address.compressed, port)
        if lowered.count(":") > 1:
            raise _host_error(text, "IPv6 addresses must be in brackets")
        name, colon, port_text = lowered.partition(":")
        if colon:
            port = _parse_port(port_text, text)
        wildcard = name.startswith("*.")
        return cls(name[2:] if wildcard else name, port, wildcard)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = f"*.{host}" if self.wildcard else host
        return text if self.port == DEFAULT_PORT else f"{text}:{self.port}"

    def matches(self, host: str, port: int) -> bool:
        if port != self.port:
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host


def _parse_port(text: str, pattern: str) -> int:
    if not _PORT.fullmatch(text) or int(text) > 65535:
        raise _host_error(pattern, "port must be 1-65535 in plain decimal")
    return int(text)


# --- claims -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Claims:
    """What a token says. `secret` never appears in repr(). None means "no restriction" for
    `methods` and `paths`, "not set" for `nbf`, `jti` and `binding`."""

    version: int = CLAIMS_VERSION
    kid: str
    secret: str = field(repr=False)
    processor: Processor
    hosts: tuple[HostPattern, ...]
    methods: tuple[str, ...] | None = None
    paths: tuple[str, ...] | None = None
    exp: int
    nbf: int | None = None
    iat: int
    jti: str | None = None
    binding: Binding | None = None

    def __post_init__(self) -> None:
        if self.version != CLAIMS_VERSION:
            raise TokenMalformed(f"unsupported claims version (this is version {CLAIMS_VERSION})")
        if not _KID.fullmatch(self.kid):
            raise TokenMalformed("kid must be 16 lowercase hex digits")
        self._check_secret()
        if not 1 <= len(self.hosts) <= _MAX_LIST:
            raise TokenMalformed(f"hosts must list 1-{_MAX_LIST} host patterns")
        if self.methods is not None:
            if not 1 <= len(self.methods) <= _MAX_LIST:
                raise TokenMalformed(f"methods, if present, must list 1-{_MAX_LIST} methods")
            if not all(_METHOD.fullmatch(method) for method in self.methods):
                raise TokenMalformed("methods must be upper-case HTTP method names")
        if self.paths is not None:
            if not 1 <= len(self.paths) <= _MAX_LIST:
                raise TokenMalformed(f"paths, if present, must list 1-{_MAX_LIST} prefixes")
            for prefix in self.paths:
                _check_path_prefix(prefix)
        self._check_times()
        if self.jti is not None and not _JTI.fullmatch(self.jti):
            raise TokenMalformed("jti must be 1-128 characters from A-Z a-z 0-9 . _ ~ : -")

    def _check_secret(self) -> None:
        try:
            check_secret(self.processor, self.secret)
        except SecretInvalid as exc:
            raise TokenMalformed(str(exc)) from None

    def _check_times(self) -> None:
        for name, value in (("exp", self.exp), ("iat", self.iat), ("nbf", self.nbf)):
            if value is not None and not 0 <= value < _MAX_INT:
                raise TokenMalformed(f"{name} must be a non-negative integer below 2**53")
        start = self.iat if self.nbf is None else max(self.iat, self.nbf)
        if self.exp <= start:
            raise TokenMalformed("exp must be later than iat and nbf")
        if self.exp - self.iat > MAX_LIFETIME_SECONDS:
            raise TokenMalformed(f"exp - iat exceeds the {MAX_LIFETIME_SECONDS} s lifetime cap")


def _check_path_prefix(prefix: str) -> None:
    if (
        not prefix.startswith("/")
        or len(prefix) > 1024
        or not _VISIBLE.fullmatch(prefix)
        or any(char in prefix for char in "?#\\")
        or _has_dot_segment(prefix)
    ):
        raise TokenMalformed(
            "paths must be 1-1024 visible ASCII characters starting with '/', "
            "without '?', '#', '\\' or dot segments"
        )


def _has_dot_segment(path: str) -> bool:
    """True if some server might read a segment as `.`/`..` or split it further: plain or
    percent-encoded dots, encoded slashes or backslashes, and `..;x` (Java path parameters)."""
    for segment in path.split("/"):
        decoded = urllib.parse.unquote(segment)
        if decoded.partition(";")[0] in (".", "..") or "/" in decoded or "\\" in decoded:
            return True
    return False


# --- claims <-> JSON --------------------------------------------------------------------------

_CLAIM_FIELDS: Final = frozenset(f.name for f in fields(Claims))
_REQUIRED_CLAIMS: Final = frozenset(
    {"version", "kid", "secret", "processor", "hosts", "exp", "iat"}
)


def _only_fields(
    obj: Mapping[str, object], allowed: frozenset[str], required: frozenset[str], where: str
) -> None:
    if problem := jsonfields.unknown(obj, allowed) or jsonfields.missing(obj, required):
        raise TokenMalformed(f"{where}: {problem}")


def _string(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TokenMalformed(f"{what} must be a string")
    return value


def _integer(value: object, what: str) -> int:
    # bool is an int subclass in Python; JSON true is not a number.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TokenMalformed(f"{what} must be an integer")
    return value


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > _MAX_LIST:
        raise TokenMalformed(f"{what} must be a list of at most {_MAX_LIST} strings")
    return tuple(_string(item, f"each of {what}") for item in value)


def _object(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise TokenMalformed(f"{what} must be an object")
    return value


def _processor_from_json(value: object) -> Processor:
    try:
        return processor_from_object(value)
    except ProcessorInvalid as exc:
        raise TokenMalformed(str(exc)) from None


def _binding_from_json(value: object) -> Binding:
    obj = _object(value, "binding")
    if len(obj) != 1:
        raise TokenMalformed("binding must have exactly one of: sandbox, policy, auth_sha256")
    ((name, inner),) = obj.items()
    cls = _BINDING_TYPES.get(name)
    if cls is None:
        raise TokenMalformed(f"unknown binding {_show(name)}")
    return cls(_string(inner, f"binding: {name}"))


def _binding_to_json(binding: Binding) -> dict[str, object]:
    (spec,) = fields(binding)
    return {spec.name: getattr(binding, spec.name)}


def claims_from_object(obj: Mapping[str, object]) -> Claims:
    """Build claims from parsed JSON, rejecting unknown or missing fields and wrong types."""
    _only_fields(obj, _CLAIM_FIELDS, _REQUIRED_CLAIMS, "claims")
    if any(value is None for value in obj.values()):
        raise TokenMalformed("claims: omit optional fields instead of sending null")
    methods = obj.get("methods")
    paths = obj.get("paths")
    nbf = obj.get("nbf")
    jti = obj.get("jti")
    binding = obj.get("binding")
    return Claims(
        version=_integer(obj["version"], "version"),
        kid=_string(obj["kid"], "kid"),
        secret=_string(obj["secret"], "secret"),
        processor=_processor_from_json(obj["processor"]),
        hosts=tuple(HostPattern.parse(text) for text in _strings(obj["hosts"], "hosts")),
        methods=None if methods is None else _strings(methods, "methods"),
        paths=None if paths is None else _strings(paths, "paths"),
        exp=_integer(obj["exp"], "exp"),
        nbf=None if nbf is None else _integer(nbf, "nbf"),
        iat=_integer(obj["iat"], "iat"),
        jti=None if jti is None else _string(jti, "jti"),
        binding=None if binding is None else _binding_from_json(binding),
    )


def _claims_to_object(claims: Claims, secret: str) -> dict[str, object]:
    obj: dict[str, object] = {
        "version": claims.version,
        "kid": claims.kid,
        "secret": secret,
        "processor": processor_to_object(claims.processor),
        "hosts": [str(pattern) for pattern in claims.hosts],
    }
    if claims.methods is not None:
        obj["methods"] = list(claims.methods)
    if claims.paths is not None:
        obj["paths"] = list(claims.paths)
    obj["exp"] = claims.exp
    if claims.nbf is not None:
        obj["nbf"] = claims.nbf
    obj["iat"] = claims.iat
    if claims.jti is not None:
        obj["jti"] = claims.jti
    if claims.binding is not None:
        obj["binding"] = _binding_to_json(claims.binding)
    return obj


def encode_claims(claims: Claims) -> bytes:
    """The plaintext that gets sealed: compact UTF-8 JSON."""
    text = json.dumps(_claims_to_object(claims, claims.secret), separators=(",", ":"))
    return text.encode("utf-8")


def redacted_claims(claims: Claims) -> dict[str, object]:
    """The claims as JSON-ready data with the secret replaced by "[redacted]"."""
    return _claims_to_object(claims, REDACTED)


def claims_from_plaintext(plaintext: bytes) -> Claims:
    # The error is raised outside the except block so that no decode error, which holds the
    # plaintext (and so the secret), rides along as __context__.
    problem = ""
    try:
        obj = load_json_object(plaintext.decode("utf-8"))
    except UnicodeDecodeError:
        problem = "claims are not UTF-8"
    except ValueError as exc:
        problem = f"claims are not valid JSON: {exc}"
    if problem:
        raise TokenMalformed(problem)
    return claims_from_object(obj)


# --- envelope ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """The visible part of a token: which key it was sealed to, and the sealed bytes."""

    kid: str
    sealed: bytes = field(repr=False)


def _b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64url_decode(text: str) -> bytes:
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise TokenMalformed("sealed part is not unpadded base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    # Non-zero padding bits would give one ciphertext many spellings.
    if _b64url_encode(data) != text:
        raise TokenMalformed("sealed part is not canonical base64url")
    return data


def format_token(kid: str, sealed: bytes) -> str:
    return f"{TOKEN_PREFIX}.{kid}.{_b64url_encode(sealed)}"


def parse_envelope(token: str) -> Envelope:
    """Check the token's shape and decode it, without any key. Raises TokenMalformed."""
    if not isinstance(token, str):
        raise TokenMalformed("token must be a string")
    if len(token) > MAX_TOKEN_LENGTH:
        raise TokenMalformed(f"token is longer than {MAX_TOKEN_LENGTH} characters")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        raise TokenMalformed(f"token must look like {TOKEN_PREFIX}.<kid>.<base64url>")
    kid, body = parts[1], parts[2]
    if not _KID.fullmatch(kid):
        raise TokenMalformed("token kid must be 16 lowercase hex digits")
    sealed = _b64url_decode(body)
    if len(sealed) <= SEAL_OVERHEAD:
        raise TokenMalformed("sealed part is too short to hold a sealed box")
    return Envelope(kid, sealed)


def seal(claims: Claims, public_key: PublicKeyEntry) -> str:
    """Seal `claims` to `public_key` (libsodium crypto_box_seal) and format the token."""
    if claims.kid != public_key.kid:
        raise TokenInvalid(f"claims name kid {claims.kid} but the key is {public_key.kid}")
    sealed = SealedBox(PublicKey(public_key.public_key)).encrypt(encode_claims(claims))
    token = format_token(claims.kid, sealed)
    if len(token) > MAX_TOKEN_LENGTH:
        raise TokenMalformed(
            f"claims too large: the token would be {len(token)} characters (max {MAX_TOKEN_LENGTH})"
        )
    return token


def unseal(token: str, keyring: Keyring) -> Claims:
    """Parse, decrypt and validate a token's claims, without checking the time window."""
    envelope = parse_envelope(token)
    entry = keyring.get(envelope.kid)
    if entry is None:
        raise TokenInvalid(f"unknown key id {envelope.kid}")
    try:
        plaintext = SealedBox(PrivateKey(entry.private_key)).decrypt(envelope.sealed)
    except CryptoError:
        raise TokenInvalid("token does not decrypt under its key (tampered or wrong key)") from None
    claims = claims_from_plaintext(plaintext)
    if claims.kid != envelope.kid:
        raise TokenInvalid("sealed kid differs from the visible kid")
    return claims


def validity(claims: Claims) -> tuple[int, int]:
    """The Unix seconds [start, end) in which the token may be used, clock skew included."""
    start = claims.iat if claims.nbf is None else max(claims.iat, claims.nbf)
    return start - CLOCK_SKEW_SECONDS, claims.exp + CLOCK_SKEW_SECONDS


def check_time(claims: Claims, *, now: float | None = None) -> None:
    moment = time.time() if now is None else now
    start, end = validity(claims)
    if moment >= end:
        raise TokenExpired("token has expired")
    if moment < start:
        raise TokenExpired("token is not valid yet")


def open_token(token: str, keyring: Keyring, *, now: float | None = None) -> Claims:
    """`unseal` plus the time window. Raises a TokenError subclass, nothing else."""
    claims = unseal(token, keyring)
    check_time(claims, now=now)
    return claims


# --- use --------------------------------------------------------------------------------------


def _canonical_request_host(host: str) -> str:
    name = host.lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name.endswith("."):
        name = name[:-1]
    if ":" in name:
        try:
            return IPv6Address(name).compressed
        except ValueError:
            return name
    return name


def _path_allowed(prefixes: Sequence[str], target: str) -> bool:
    path = target.partition("?")[0].partition("#")[0]
    if not path.startswith("/") or "\\" in path or _has_dot_segment(path):
        # The upstream may normalise these into a path the prefix never allowed.
        return False
    return any(
        path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/")
        for prefix in prefixes
    )


def check_scope(claims: Claims, host: str, port: int, method: str, path: str) -> None:
    """Raise TokenScope unless host:port, method and path are all inside the token.

    Path prefixes match whole segments (`/v1/charges` allows `/v1/charges/ch_1`, not
    `/v1/chargesX`), and a path with dot segments or encoded slashes never matches."""
    name = _canonical_request_host(host)
    if not any(pattern.matches(name, port) for pattern in claims.hosts):
        raise TokenScope(f"host {_show(name, 80)} port {port} is not allowed by this token")
    if claims.methods is not None and method not in claims.methods:
        raise TokenScope(f"method {_show(method, 20)} is not allowed by this token")
    if claims.paths is not None and not _path_allowed(claims.paths, path):
        raise TokenScope(f"path {_show(path, 80)} is not allowed by this token")


def _bearer_credentials(values: Sequence[str]) -> list[str]:
    found = []
    for value in values:
        scheme, _, credential = value.strip().partition(" ")
        if scheme.lower() == "bearer" and credential.strip():
            found.append(credential.strip())
    return found


def check_binding(
    claims: Claims,
    *,
    sandbox_id: str | None,
    policy: str | None,
    proxy_authorization: Sequence[str],
) -> None:
    """Raise TokenBinding unless the request meets the token's binding (if any).

    For an auth digest binding, any one `Proxy-Authorization: Bearer` value whose SHA-256 matches
    is enough; other schemes (the proxy's own Basic identity) are ignored."""
    binding = claims.binding
    match binding:
        case None:
            return
        case SandboxBinding(sandbox=bound):
            if sandbox_id is None or not hmac.compare_digest(
                sandbox_id.encode("utf-8"), bound.encode("utf-8")
            ):
                raise TokenBinding("token is bound to another sandbox")
        case PolicyBinding(policy=bound):
            if policy is None or not hmac.compare_digest(
                policy.encode("utf-8"), bound.encode("utf-8")
            ):
                raise TokenBinding("token is bound to another policy")
        case AuthDigestBinding(auth_sha256=digest):
            expected = bytes.fromhex(digest)
            matched = False
            for credential in _bearer_credentials(proxy_authorization):
                actual = hashlib.sha256(credential.encode("utf-8")).digest()
                matched |= hmac.compare_digest(actual, expected)
            if not matched:
                raise TokenBinding(
                    "token needs Proxy-Authorization: Bearer with the secret it was bound to"
                )
        case _:
            assert_never(binding)


def apply(claims: Claims, request: MutableRequest) -> None:
    """Inject the secret into `request` as the token's processor says. Raises TokenInapplicable."""
    try:
        inject(claims.processor, claims.secret, request)
    except RequestInapplicable as exc:
        raise TokenInapplicable(str(exc)) from None
