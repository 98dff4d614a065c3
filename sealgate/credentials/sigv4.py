"""AWS Signature Version 4 (`AWS4-HMAC-SHA256`), as AWS's specification describes it: the
canonical request, the string to sign, the signing key and the signature, and the parts of a
signature a client presents (its credential scope and signed headers).

Pure functions over text; what a request must look like to be re-signed, and writing the new
signature into it, is `awsresign`. The canonicalisation follows AWS's rules, which
botocore also implements (the tests use it as the reference): the path URI-encoded twice after
dot and empty segments are resolved, except for S3, whose path is encoded once and never
normalised; the query's names and values decoded, URI-encoded (`A-Z a-z 0-9 - . _ ~` kept,
everything else `%XX` in upper-case hex, a space `%20`) and sorted by name, then value; header
names lower-case, sorted, each value trimmed with inner runs of whitespace made one space, and a
repeated header's values joined by `,` in order.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Final
from urllib.parse import quote, quote_from_bytes, unquote_to_bytes

from sealgate.reasons import Reason

from .errors import CredentialError

__all__ = [
    "ALGORITHM",
    "EMPTY_SHA256",
    "Scope",
    "SignatureError",
    "authorization",
    "canonical_query",
    "canonical_request",
    "canonical_uri",
    "is_s3",
    "parse_amz_date",
    "parse_authorization",
    "parse_credential",
    "parse_signed_headers",
    "signature",
    "signing_key",
    "string_to_sign",
]

ALGORITHM: Final = "AWS4-HMAC-SHA256"
TERMINATOR: Final = "aws4_request"
EMPTY_SHA256: Final = hashlib.sha256(b"").hexdigest()

_KEY_ID: Final = re.compile(r"[\x21-\x2e\x30-\x7e]{1,128}")  # visible ASCII but `/`
_DATE: Final = re.compile(r"\d{8}")
_AMZ_DATE: Final = re.compile(r"\d{8}T\d{6}Z")
_NAME: Final = re.compile(r"[a-z0-9-]{1,64}")  # a region or a service
_HEADER: Final = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]{1,64}")  # lower-case token characters
_SIGNATURE: Final = re.compile(r"[0-9a-f]{64}")
_MAX_SIGNED_HEADERS: Final = 64
_USUAL: Final = re.compile(
    r"AWS4-HMAC-SHA256 Credential=([\x21-\x2b\x2d\x2e\x30-\x7e]{1,128})/(\d{8})/"
    r"([a-z0-9-]{1,64})/([a-z0-9-]{1,64})/aws4_request, ?SignedHeaders=([^,\s]+), ?"
    r"Signature=[0-9a-f]{64}"
)


class SignatureError(CredentialError):
    """A presented signature that is not SigV4's shape. The message quotes nothing but the
    region, service and header names, which passed their patterns."""

    reason = Reason.REQUEST_INAPPLICABLE  # as `awsresign` refuses the request


@dataclass(frozen=True, slots=True)
class Scope:
    """A credential: `<access key id>/<date>/<region>/<service>/aws4_request`."""

    access_key_id: str
    date: str  # YYYYMMDD
    region: str
    service: str

    @property
    def text(self) -> str:
        """The credential scope, without the key id: what the string to sign names."""
        return f"{self.date}/{self.region}/{self.service}/{TERMINATOR}"

    def credential(self, access_key_id: str) -> str:
        """The whole credential, for another key id."""
        return f"{access_key_id}/{self.text}"


@dataclass(frozen=True, slots=True)
class SignedAuthorization:
    """The parts of an `Authorization: AWS4-HMAC-SHA256 ...` value."""

    scope: Scope
    signed_headers: tuple[str, ...]


# -- reading what a client sent ------------------------------------------------------------------


def parse_credential(text: str) -> Scope:
    parts = text.split("/")
    if len(parts) != 5 or parts[4] != TERMINATOR:
        raise SignatureError(
            "the credential is not <key id>/<date>/<region>/<service>/aws4_request"
        )
    key_id, date, region, service, _ = parts
    if not _KEY_ID.fullmatch(key_id) or not _DATE.fullmatch(date):
        raise SignatureError("the credential's key id or date is malformed")
    if not _NAME.fullmatch(region) or not _NAME.fullmatch(service):
        raise SignatureError("the credential's region or service is malformed")
    return Scope(key_id, date, region, service)


def parse_signed_headers(text: str) -> tuple[str, ...]:
    names = text.split(";")
    if len(names) > _MAX_SIGNED_HEADERS or not all(_HEADER.fullmatch(n) for n in names):
        raise SignatureError(
            f"SignedHeaders must be 1-{_MAX_SIGNED_HEADERS} lower-case header names, `;` apart"
        )
    if len(set(names)) != len(names):
        raise SignatureError("SignedHeaders names a header twice")
    return tuple(names)


def parse_signature(text: str) -> None:
    if not _SIGNATURE.fullmatch(text):
        raise SignatureError("the signature is not 64 lower-case hex digits")


def parse_authorization(value: str) -> SignedAuthorization:
    """`AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...` read; SignatureError
    for anything else."""
    if (usual := _USUAL.fullmatch(value)) is not None:
        # The order and spacing every SDK writes, in one match: the field-by-field reading
        # below is most of the re-signing's cost.
        key_id, date, region, service, signed = usual.groups()
        return SignedAuthorization(Scope(key_id, date, region, service),
                                   parse_signed_headers(signed))
    scheme, _, rest = value.strip().partition(" ")
    if scheme != ALGORITHM:
        raise SignatureError(f"the Authorization is not {ALGORITHM}")
    fields: dict[str, str] = {}
    for item in rest.split(","):
        name, equals, text = item.strip().partition("=")
        if not equals or name in fields:
            raise SignatureError("the Authorization's fields are not Credential, SignedHeaders "
                                 "and Signature, each once")
        fields[name] = text
    if fields.keys() != {"Credential", "SignedHeaders", "Signature"}:
        raise SignatureError("the Authorization's fields are not Credential, SignedHeaders "
                             "and Signature, each once")
    parse_signature(fields["Signature"])
    return SignedAuthorization(parse_credential(fields["Credential"]),
                     parse_signed_headers(fields["SignedHeaders"]))


@lru_cache(maxsize=64)
def parse_amz_date(text: str) -> int:
    """`YYYYMMDDTHHMMSSZ` (X-Amz-Date) as seconds since the epoch."""
    if not _AMZ_DATE.fullmatch(text):
        raise SignatureError("X-Amz-Date is not YYYYMMDDTHHMMSSZ")
    # By hand: strptime is a third of the re-signing's cost.
    fields = (int(text[0:4]), int(text[4:6]), int(text[6:8]), int(text[9:11]),
              int(text[11:13]), int(text[13:15]))
    year, month, day, hour, minute, second = fields
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]
            and hour < 24 and minute < 60 and second < 60):
        raise SignatureError("X-Amz-Date is not a valid time")
    return calendar.timegm((*fields, 0, 0, 0))


# -- the canonical request -------------------------------------------------------------------------


def is_s3(service: str) -> bool:
    """S3 (and its variants) sign their path encoded once and not normalised."""
    return service == "s3" or service.startswith("s3-")


def _encode(data: bytes, safe: str = "") -> str:
    # `quote` keeps A-Z a-z 0-9 _ . - ~ always: SigV4's unreserved set.
    return quote_from_bytes(data, safe=safe)


def _raw(text: str) -> bytes:
    return unquote_to_bytes(text.encode("utf-8", "surrogateescape"))


def _normalised(path: str) -> str:
    """RFC 3986 dot segments removed and empty segments dropped, as AWS's services other than
    S3 resolve a path before they check its signature."""
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment and segment != ".":
            kept.append(segment)
    trailing = "/" if path.endswith("/") and kept else ""
    return "/" + "/".join(kept) + trailing


def canonical_uri(raw_path: str, *, s3: bool) -> str:
    """The canonical URI of a raw (still percent-encoded) path, without its query."""
    once = _encode(_raw(raw_path or "/"), safe="/")
    if s3:
        return once
    return quote(_normalised(once), safe="/~")


def canonical_query(elements: Sequence[str]) -> str:
    """The canonical query string of raw `name=value` elements (empty ones ignored)."""
    pairs = []
    for element in elements:
        if element:
            name, _, value = element.partition("=")
            pairs.append((_encode(_raw(name)), _encode(_raw(value))))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def canonical_request(
    method: str,
    raw_path: str,
    query: Sequence[str],
    headers: Mapping[str, Sequence[str]],
    payload_hash: str,
    *,
    s3: bool,
) -> str:
    """`headers`: each signed header (lower-case) with its values in order; they are the signed
    headers, sorted here."""
    names = sorted(headers)
    lines = "".join(
        f"{name}:{','.join(' '.join(v.split()) for v in headers[name])}\n" for name in names
    )
    return "\n".join((
        method, canonical_uri(raw_path, s3=s3), canonical_query(query), lines,
        ";".join(names), payload_hash,
    ))


# -- signing ---------------------------------------------------------------------------------------


def string_to_sign(amz_date: str, scope: Scope, canonical: str) -> str:
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{ALGORITHM}\n{amz_date}\n{scope.text}\n{digest}"


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.digest(key, message.encode("utf-8"), "sha256")


def signing_key(secret_access_key: str, scope: Scope) -> bytes:
    return _signing_key(secret_access_key, scope.date, scope.region, scope.service)


@lru_cache(maxsize=256)
def _signing_key(secret_access_key: str, date: str, region: str, service: str) -> bytes:
    # Cached: it changes once a day per key, region and service, and is four HMACs.
    key = _hmac(f"AWS4{secret_access_key}".encode(), date)
    for part in (region, service, TERMINATOR):
        key = _hmac(key, part)
    return key


def signature(secret_access_key: str, amz_date: str, scope: Scope, canonical: str) -> str:
    """The hex signature of a canonical request."""
    key = signing_key(secret_access_key, scope)
    return _hmac(key, string_to_sign(amz_date, scope, canonical)).hex()


def authorization(credential: str, signed_headers: Sequence[str], hex_signature: str) -> str:
    return (f"{ALGORITHM} Credential={credential}, SignedHeaders={';'.join(signed_headers)}, "
            f"Signature={hex_signature}")
