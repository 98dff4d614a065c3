"""What an `aws-sigv4` processor does to a request: read the SigV4 signature the sandbox made
with the placeholder keys, check it is one the processor may re-sign, and sign the request again
with the real keys (`sigv4` is the algorithm).

Both of SigV4's forms: the `Authorization: AWS4-HMAC-SHA256 ...` header, and the query string
of a presigned URL (`X-Amz-Credential`, `X-Amz-Signature`, ...). What is signed is the request
as it leaves the proxy: the client's signed headers, read after every change the proxy made
(less any it removed; plus `x-amz-security-token` when the real keys carry a session token).

Clock: a header-signed request keeps the client's `X-Amz-Date`, which must be within 5 minutes
of the proxy's clock (AWS allows 15; re-dating would sign a time the client never chose, and a
sandbox with a clock that far off is told so). A presigned URL is valid from its `X-Amz-Date`
for `X-Amz-Expires` seconds (at most 7 days, as AWS says): it may not be dated over 5 minutes
ahead, nor be used once expired.

Payload: `x-amz-content-sha256` is kept as the client chose it: `UNSIGNED-PAYLOAD` and
`STREAMING-UNSIGNED-PAYLOAD-TRAILER` (chunks not signed) as they are; a hex hash only if it is
the body's (checked once the body is buffered; one of unknown length is signed as claimed, and
AWS checks it); without the header, the body's hash is signed (presigned S3: `UNSIGNED-PAYLOAD`;
a GET of unknown length: the empty body's). An upload signed chunk by chunk
(`STREAMING-AWS4-HMAC-SHA256-PAYLOAD`) has its headers signed at once and every chunk re-signed
as the body streams (`awschunked.Resigner`); its trailer and ECDSA kin are refused.

No error raised here quotes the secret, the session token or a key id the sandbox presented.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final, Protocol
from urllib.parse import quote, unquote

from sealgate.reasons import Reason

from . import awschunked, sigv4
from .awskeys import AwsKeys
from .errors import InjectionError, RequestInapplicable
from .httprequest import MutableRequest, query_elements, without_query_params

__all__ = [
    "MAX_EXPIRES",
    "MAX_SKEW",
    "AwsClockSkew",
    "AwsScopeRefused",
    "AwsStreamingSigned",
    "Presented",
    "Resigning",
    "needs_body",
    "read",
    "resign",
]

MAX_SKEW: Final = 300  # seconds
MAX_EXPIRES: Final = 7 * 24 * 3600
UNSIGNED: Final = frozenset({"UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"})
CHUNK_SIGNED: Final = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
_HEX_HASH: Final = re.compile(r"[0-9a-f]{64}")
_CONTENT_SHA256: Final = "x-amz-content-sha256"
_BODYLESS: Final = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
_TOKEN: Final = "x-amz-security-token"  # noqa: S105 (a header name)
_SIGNED_QUERY: Final = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
                        "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token")


class Resigning(Protocol):
    """What of an aws-sigv4 processor (`processors.awssigv4`) re-signing reads: the key id the
    sandbox signs with, and the services and regions it may be re-signed for (as written, and
    as sets)."""

    @property
    def placeholder(self) -> str: ...

    @property
    def services(self) -> str: ...

    @property
    def regions(self) -> str: ...

    @property
    def allowed_services(self) -> frozenset[str]: ...

    @property
    def allowed_regions(self) -> frozenset[str]: ...


class AwsScopeRefused(InjectionError):
    reason = Reason.AWS_SCOPE


class AwsClockSkew(InjectionError):
    reason = Reason.AWS_CLOCK_SKEW


class AwsStreamingSigned(InjectionError):
    reason = Reason.AWS_STREAMING_SIGNED


@dataclass(frozen=True, slots=True)
class Presented:
    """A SigV4 request as the sandbox signed it, checked."""

    scope: sigv4.Scope
    signed_headers: tuple[str, ...]
    amz_date: str
    expires: int | None  # a presigned URL's X-Amz-Expires; None for the header form
    payload: str | None  # the payload hash to sign; None: the body's, once it is here
    claimed: str | None  # a hex hash the client put in x-amz-content-sha256, to check

    @property
    def chunk_signed(self) -> bool:
        return self.payload == CHUNK_SIGNED

    @property
    def presigned(self) -> bool:
        return self.expires is not None

    @property
    def needs_body(self) -> bool:
        return self.payload is None


def _one(values: list[str], what: str) -> str | None:
    if len(values) > 1:
        raise RequestInapplicable(f"the request carries {what} more than once")
    return values[0] if values else None


def _query_value(elements: list[str], name: str) -> str | None:
    wanted = name.lower()
    found = [unquote(value) for key, _, value in (e.partition("=") for e in elements)
             if unquote(key).lower() == wanted]
    return _one(found, name)


def _presigned(elements: list[str]) -> tuple[sigv4.Scope, tuple[str, ...], str, int]:
    algorithm = _query_value(elements, "X-Amz-Algorithm")
    if algorithm != sigv4.ALGORITHM:
        raise RequestInapplicable(f"the presigned URL's X-Amz-Algorithm is not {sigv4.ALGORITHM}")
    values = {name: _query_value(elements, name) for name in _SIGNED_QUERY[1:6]}
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise RequestInapplicable(f"the presigned URL lacks {', '.join(missing)}")
    credential, date, expires, signed, hex_signature = (str(v) for v in values.values())
    sigv4.parse_signature(hex_signature)
    if not expires.isdigit() or not 1 <= int(expires) <= MAX_EXPIRES:
        raise RequestInapplicable(f"X-Amz-Expires must be 1-{MAX_EXPIRES} seconds")
    return (sigv4.parse_credential(credential), sigv4.parse_signed_headers(signed), date,
            int(expires))


def _check_clock(amz_date: str, expires: int | None, now: float) -> None:
    off = sigv4.parse_amz_date(amz_date) - int(now)
    if expires is None and abs(off) > MAX_SKEW:
        raise AwsClockSkew(
            f"the request's X-Amz-Date is {abs(off)} s {'ahead of' if off > 0 else 'behind'} "
            f"the proxy's clock (at most {MAX_SKEW} s): sign it again with a correct clock"
        )
    if expires is not None and off > MAX_SKEW:
        raise AwsClockSkew(f"the presigned URL is dated {off} s ahead of the proxy's clock")
    if expires is not None and off + expires < 0:
        raise AwsClockSkew(f"the presigned URL expired {-(off + expires)} s ago")


def _payload(request: MutableRequest, scope: sigv4.Scope, presigned: bool
             ) -> tuple[str | None, str | None]:
    """(the payload hash to sign, or None for the body's; a hex hash to check against it)."""
    chosen = _one(request.get_header_values(_CONTENT_SHA256), "x-amz-content-sha256")
    length = request.body_length()
    if chosen is None:
        if presigned and sigv4.is_s3(scope.service):
            return "UNSIGNED-PAYLOAD", None
        if length is None and request.get_method() in _BODYLESS:
            # An HTTP/2 GET says nothing of its body until it ends: signed as empty (a body
            # after all fails AWS's own check of the signature).
            return sigv4.EMPTY_SHA256, None
        return None, None
    if chosen in UNSIGNED or (chosen == CHUNK_SIGNED and not presigned):
        return chosen, None
    if chosen.startswith("STREAMING-"):
        raise AwsStreamingSigned(
            f"x-amz-content-sha256 {chosen[:64]!r}: of the uploads signed chunk by chunk only "
            f"{CHUNK_SIGNED} (no trailer, not ECDSA) is re-signed; sign the payload whole, or "
            "use UNSIGNED-PAYLOAD over HTTPS"
        )
    if not _HEX_HASH.fullmatch(chosen):
        raise RequestInapplicable("x-amz-content-sha256 is not a hex SHA-256 or a payload mode")
    if length is None:
        # Not buffered to be checked: signed as claimed, and AWS compares it with the body.
        return chosen, None
    return None, chosen


def read(processor: Resigning, request: MutableRequest, now: float) -> Presented:
    """The sandbox's signature, checked: a SigV4 request (header or presigned form) made with
    the placeholder key id, for an allowed service and region, dated as `MAX_SKEW` allows."""
    authorization = request.get_header_values("authorization")
    _, elements = query_elements(request.get_path())
    expires: int | None = None
    try:
        if authorization:
            if _query_value(elements, "X-Amz-Signature") is not None:
                raise RequestInapplicable("the request is signed both in its header and its URL")
            presented = sigv4.parse_authorization(_one(authorization, "Authorization") or "")
            scope, signed = presented.scope, presented.signed_headers
            amz_date = _one(request.get_header_values("x-amz-date"), "X-Amz-Date")
            if amz_date is None:
                raise RequestInapplicable("a SigV4 request needs an X-Amz-Date header")
        elif _query_value(elements, "X-Amz-Algorithm") is not None:
            scope, signed, amz_date, expires = _presigned(elements)
        elif _query_value(elements, "AWSAccessKeyId") is not None:
            # botocore presigns S3 URLs with SigV2 unless told otherwise.
            raise RequestInapplicable(
                "the URL is presigned with Signature Version 2 (AWSAccessKeyId), which is not "
                "re-signed: presign with SigV4 (botocore: Config(signature_version='s3v4'))"
            )
        else:
            raise RequestInapplicable(
                "the request is not signed with AWS Signature Version 4 (no Authorization "
                "AWS4-HMAC-SHA256 and no X-Amz-Signature): sign it with the placeholder keys"
            )
        if scope.access_key_id != processor.placeholder:
            raise RequestInapplicable(
                "the request is signed with an access key id other than the placeholder "
                f"{processor.placeholder!r}: sign with the placeholder keys"
            )
        if scope.date != amz_date[:8]:
            raise RequestInapplicable("the credential's date is not X-Amz-Date's")
        _check_clock(amz_date, expires, now)
    except sigv4.SignatureError as exc:
        raise RequestInapplicable(str(exc)) from None
    if "host" not in signed:
        raise RequestInapplicable("SigV4's SignedHeaders must include host")
    if (scope.service not in processor.allowed_services
            or scope.region not in processor.allowed_regions):
        raise AwsScopeRefused(
            f"SigV4 scope {scope.service} in {scope.region} is not allowed: the credential "
            f"signs for services {processor.services} in regions {processor.regions}"
        )
    payload, claimed = _payload(request, scope, expires is not None)
    return Presented(scope, signed, amz_date, expires, payload, claimed)


def _signed_headers(request: MutableRequest, presented: Presented, keys: AwsKeys
                    ) -> dict[str, list[str]]:
    """The headers to sign, with their values as they leave the proxy: the client's list,
    less those no longer in the request, with the session token the keys carry (if any)."""
    token_header = keys.session_token is not None and not presented.presigned
    names = set(presented.signed_headers) - {_TOKEN}
    if token_header:
        names.add(_TOKEN)
    headers = {}
    for name in sorted(names):
        if values := request.get_header_values(name):
            headers[name] = values
    if "host" not in headers:
        raise RequestInapplicable("the request has no Host to sign")
    return headers


def needs_body(processor: Resigning, request: MutableRequest, now: float) -> bool:
    """Whether `resign` will need the body (a payload hash to compute or check). Read from
    `x-amz-content-sha256` where it can be, so the common request is read once, by `resign`;
    a request this says needs its body is checked once the body is here (nothing is sent
    before)."""
    chosen = request.get_header_values(_CONTENT_SHA256)
    if (len(chosen) == 1 and chosen[0] in UNSIGNED) or request.body_length() == 0:
        return False
    try:
        return read(processor, request, now).needs_body
    except InjectionError:
        return False  # refused by `resign`, at once


def resign(processor: Resigning, keys: AwsKeys, request: MutableRequest, now: float
           ) -> str:
    """Check the sandbox's signature (`read`) and replace it with one made with `keys`.
    Returns the new signature."""
    presented = read(processor, request, now)
    payload = presented.payload
    if payload is None:
        payload = hashlib.sha256(request.get_body()).hexdigest()
        if presented.claimed is not None and presented.claimed != payload:
            raise RequestInapplicable("x-amz-content-sha256 is not the SHA-256 of the body")
    # The sandbox's token (a placeholder, if any) never goes on; the real one goes where the
    # form says, before anything is signed.
    presigned = presented.presigned
    token = [keys.session_token] if keys.session_token is not None and not presigned else []
    if token or request.get_header_values(_TOKEN):
        request.set_header_values("X-Amz-Security-Token", token)
    scope = presented.scope
    credential = scope.credential(keys.access_key_id)
    headers = _signed_headers(request, presented, keys)
    before, elements = without_query_params(request.get_path(), _SIGNED_QUERY[1:])
    if presigned:
        elements += [f"X-Amz-Credential={quote(credential, safe='')}",
                     f"X-Amz-Date={presented.amz_date}",
                     f"X-Amz-Expires={presented.expires}",
                     f"X-Amz-SignedHeaders={quote(';'.join(headers), safe='')}"]
        if keys.session_token is not None:
            elements.append(f"X-Amz-Security-Token={quote(keys.session_token, safe='')}")
    canonical = sigv4.canonical_request(
        request.get_method(), before, elements, headers, payload, s3=sigv4.is_s3(scope.service)
    )
    hex_signature = sigv4.signature(keys.secret_access_key, presented.amz_date, scope, canonical)
    if presented.chunk_signed:
        resigner = awschunked.Resigner(hex_signature, sigv4.signing_key(
            keys.secret_access_key, scope), presented.amz_date, scope)

        def resigned(data: bytes) -> bytes:
            try:
                return resigner.feed(data)
            except awschunked.ChunkError as exc:
                raise RequestInapplicable(str(exc)) from None

        request.pass_body_through(resigned)
    if presigned:
        elements.append(f"X-Amz-Signature={hex_signature}")
        request.set_path(f"{before}?{'&'.join(elements)}")
    else:
        request.set_header_values(
            "Authorization", [sigv4.authorization(credential, list(headers), hex_signature)]
        )
    return hex_signature
