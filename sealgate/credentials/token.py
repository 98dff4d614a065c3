"""The sealed-token wire format: ``sg1.<kid>.<base64url(sealed box of the claims JSON)>``.

The issuer seals with this module and the proxy opens with it, so the two cannot disagree about a
token. The format is written down in docs/token-format.md and pinned by tests/vectors/. This
module is the format: the claims and their rules, their JSON, the envelope, `seal` and `unseal`.
It is built on `scope` (host patterns, path prefixes) and `processors` (shared
with the proxy's broker; their errors are reported here as `TokenMalformed`); the checks of
opened claims against a request (time, binding, scope) are `checks`.

Secrets: `Claims.secret` is left out of reprs, and no error raised here quotes it or chains an
exception that holds the plaintext. Errors about other fields may quote them, shortened.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Final

from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox

from .errors import ProcessorInvalid, SecretInvalid, TokenInvalid, TokenMalformed
from .jsonfields import load_json_object, missing, show, unknown
from .keys import Keyring, PublicKeyEntry
from .processors import Processor, processor_from_object
from .scope import Destination, check_path_prefix

__all__ = [
    "CLAIMS_VERSION",
    "MAX_LIFETIME_SECONDS",
    "MAX_TOKEN_LENGTH",
    "TOKEN_PREFIX",
    "AuthDigestBinding",
    "Binding",
    "Claims",
    "Envelope",
    "PolicyBinding",
    "SandboxBinding",
    "claims_from_object",
    "encode_claims",
    "format_token",
    "parse_envelope",
    "redacted_claims",
    "seal",
    "unseal",
]

TOKEN_PREFIX: Final = "sg1"  # noqa: S105 - a format tag, not a credential
CLAIMS_VERSION: Final = 1
MAX_TOKEN_LENGTH: Final = 8192
# Enforced at use as well as at mint: anyone holding a public key can seal a token, so the
# proxy cannot rely on the issuer's cap alone.
MAX_LIFETIME_SECONDS: Final = 24 * 3600
# crypto_box_seal adds an ephemeral X25519 public key (32) and a Poly1305 tag (16).
SEAL_OVERHEAD: Final = 48
REDACTED: Final = "[redacted]"

_KID: Final = re.compile(r"[0-9a-f]{16}")
_B64URL: Final = re.compile(r"[A-Za-z0-9_-]+")
_VISIBLE: Final = re.compile(r"[\x21-\x7e]+")
_METHOD: Final = re.compile(r"[A-Z]{1,20}")
_JTI: Final = re.compile(r"[A-Za-z0-9._~:-]{1,128}")
_HEX_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
_MAX_INT: Final = 2**53
_MAX_LIST: Final = 32


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


# --- claims -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Claims:
    """What a token says. `secret` never appears in repr(). None means "no restriction" for
    `methods` and `paths`, "not set" for `nbf`, `jti` and `binding`."""

    version: int = CLAIMS_VERSION
    kid: str
    secret: str = field(repr=False)
    processor: Processor
    hosts: tuple[Destination, ...]
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
                check_path_prefix(prefix)
        self._check_times()
        if self.jti is not None and not _JTI.fullmatch(self.jti):
            raise TokenMalformed("jti must be 1-128 characters from A-Z a-z 0-9 . _ ~ : -")

    def _check_secret(self) -> None:
        try:
            self.processor.check_secret(self.secret)
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


# --- claims <-> JSON --------------------------------------------------------------------------

_CLAIM_FIELDS: Final = frozenset(f.name for f in fields(Claims))
_REQUIRED_CLAIMS: Final = frozenset(
    {"version", "kid", "secret", "processor", "hosts", "exp", "iat"}
)


def _only_fields(
    obj: Mapping[str, object], allowed: frozenset[str], required: frozenset[str], where: str
) -> None:
    if problem := unknown(obj, allowed) or missing(obj, required):
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
        raise TokenMalformed(f"unknown binding {show(name)}")
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
        hosts=tuple(Destination.parse(text) for text in _strings(obj["hosts"], "hosts")),
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
        "processor": claims.processor.to_object(),
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


def _claims_from_plaintext(plaintext: bytes) -> Claims:
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
    claims = _claims_from_plaintext(plaintext)
    if claims.kid != envelope.kid:
        raise TokenInvalid("sealed kid differs from the visible kid")
    return claims
