"""SigV4 (issuer/sigv4.py) against AWS's test-suite cases with botocore as the reference
(tests/vectors/sigv4.json), and aws-sigv4's re-signing (issuer/awsresign.py) of requests
botocore signed with the placeholder keys, checked by botocore with the real ones."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("botocore", reason="botocore is not installed (pip install -e '.[test]')")

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sealgate.credentials import awschunked, awsresign, sigv4
from sealgate.credentials.awsresign import AwsClockSkew, AwsScopeRefused, AwsStreamingSigned
from sealgate.credentials.httprequest import InMemoryRequest
from sealgate.credentials.processors import (
    AWS_PLACEHOLDER_KEY_ID,
    AWS_PLACEHOLDER_SECRET,
    AwsSigV4Processor,
    ProcessorInvalid,
    RequestInapplicable,
    SecretInvalid,
    processor_from_object,
)
from tests.awsfake import AwsFake, reference_signature

VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "sigv4.json").read_text())
TOKEN_VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "vectors.json").read_text())
REAL = Credentials("AKIAREALEXAMPLE00001", "real/SECRET+key/EXAMPLE0000000000000001",
                   "real-session/token+EXAMPLE==")
SECRET = json.dumps({"access_key_id": REAL.access_key, "secret_access_key": REAL.secret_key,
                     "session_token": REAL.token})
PLACEHOLDER = Credentials(AWS_PLACEHOLDER_KEY_ID, AWS_PLACEHOLDER_SECRET)
PROCESSOR = AwsSigV4Processor(services="s3,sts,dynamodb", regions="us-east-1,eu-west-1")


# -- the algorithm -------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_signature_matches_the_reference(vector: dict[str, Any]) -> None:
    path, _, query = vector["target"].partition("?")
    elements = [e for e in query.split("&") if e] if query else []
    fields = [tuple(f) for f in vector["headers"]]
    if vector["presigned"]:
        elements = [e for e in elements if unquote(e.partition("=")[0]) != "X-Amz-Signature"]
    headers: dict[str, list[str]] = {}
    for name, value in fields:
        headers.setdefault(name.lower(), []).append(value)
    assert sorted(headers) == vector["signed_headers"]
    if "x-amz-content-sha256" in headers:
        payload = headers["x-amz-content-sha256"][0]
    elif vector["presigned"] and vector["service"] == "s3":
        payload = "UNSIGNED-PAYLOAD"
    else:
        payload = hashlib.sha256(vector["body"].encode()).hexdigest()
    scope = sigv4.Scope(VECTORS["access_key_id"], VECTORS["amz_date"][:8], vector["region"],
                        vector["service"])
    canonical = sigv4.canonical_request(vector["method"], path, elements, headers, payload,
                                        s3=sigv4.is_s3(vector["service"]))
    assert sigv4.signature(VECTORS["secret_access_key"], VECTORS["amz_date"], scope,
                           canonical) == vector["signature"]


def test_the_suite_s_published_signatures_are_among_the_vectors() -> None:
    assert sum(bool(v.get("published")) for v in VECTORS["vectors"]) == 2


def test_token_vector_signature_is_botocore_s() -> None:
    (vector,) = [v for v in TOKEN_VECTORS["valid"] if v["name"] == "aws-sigv4"]
    fields = [tuple(f) for f in vector["expected"]["headers"]]
    auth = dict(fields)["authorization"]
    keys = json.loads(json.loads(vector["plaintext"])["secret"])
    parts = dict(p.strip().split("=", 1) for p in auth[17:].split(","))
    assert parts["Credential"].startswith(keys["access_key_id"] + "/")
    assert dict(fields)["x-amz-security-token"] == keys["session_token"]
    expected = reference_signature(
        vector["request"]["method"], f"https://api.example.com{vector['request']['path']}",
        fields, vector["request"]["body"].encode(),
        keys=Credentials(keys["access_key_id"], keys["secret_access_key"]),
        service="s3", region="us-east-1", amz_date="20231114T221320Z",
        signed_headers=parts["SignedHeaders"].split(";"), presigned=False,
    )
    assert parts["Signature"] == expected


@pytest.mark.parametrize("value", [
    "AWS4-HMAC-SHA256 Credential=a/20150830/us-east-1/s3/aws4_request, SignedHeaders=host",
    "AWS4-HMAC-SHA256 Credential=a/2015083/us-east-1/s3/aws4_request, SignedHeaders=host, "
    f"Signature={'0' * 64}",
    "AWS4-HMAC-SHA256 Credential=a/20150830/US-EAST-1/s3/aws4_request, SignedHeaders=host, "
    f"Signature={'0' * 64}",
    "AWS4-HMAC-SHA256 Credential=a/20150830/us-east-1/s3/aws4, SignedHeaders=host, "
    f"Signature={'0' * 64}",
    "AWS4-HMAC-SHA256 Credential=a/20150830/us-east-1/s3/aws4_request, SignedHeaders=Host, "
    f"Signature={'0' * 64}",
    "AWS4-HMAC-SHA256 Credential=a/20150830/us-east-1/s3/aws4_request, SignedHeaders=host;host, "
    f"Signature={'0' * 64}",
    "AWS4-ECDSA-P256-SHA256 Credential=a/20150830/us-east-1/s3/aws4_request, "
    f"SignedHeaders=host, Signature={'0' * 64}",
    "Bearer x",
])
def test_malformed_authorizations_are_refused(value: str) -> None:
    with pytest.raises(sigv4.SignatureError):
        sigv4.parse_authorization(value)


# -- the processor -------------------------------------------------------------------------------


def test_processor_fields_round_trip_and_are_checked() -> None:
    obj = {"type": "aws-sigv4", "services": "s3,sts", "regions": "us-east-1"}
    processor = processor_from_object(obj)
    assert isinstance(processor, AwsSigV4Processor)
    assert processor.allowed_services == {"s3", "sts"}
    assert processor.placeholder == AWS_PLACEHOLDER_KEY_ID
    assert processor.to_object() == {**obj, "placeholder": AWS_PLACEHOLDER_KEY_ID}
    for bad in ({"services": "S3"}, {"services": ""}, {"regions": "us-east-1,"},
                {"placeholder": "short"}, {"regions": "*"}):
        with pytest.raises(ProcessorInvalid):
            processor_from_object({**obj, **bad})


@pytest.mark.parametrize("secret", [
    "not json", "[]", '{"access_key_id": "AKIAREALEXAMPLE00001"}',
    '{"access_key_id": "short", "secret_access_key": "x"}',
    '{"access_key_id": "AKIAREALEXAMPLE00001", "secret_access_key": "a b"}',
    '{"access_key_id": "AKIAREALEXAMPLE00001", "secret_access_key": "x", "region": "y"}',
])
def test_secrets_that_are_not_keys_are_refused_without_quoting(secret: str) -> None:
    with pytest.raises(SecretInvalid) as raised:
        PROCESSOR.inject(secret, InMemoryRequest())
    assert "AKIAREALEXAMPLE00001" not in str(raised.value) and "a b" not in str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__context__ is None


# -- re-signing what botocore signed with the placeholder ---------------------------------------


def _signed(method: str, url: str, body: bytes = b"", *, service: str = "s3",
            region: str = "us-east-1", headers: dict[str, str] | None = None,
            presign: bool = False, keys: Credentials = PLACEHOLDER,
            after: dict[str, str] | None = None) -> tuple[InMemoryRequest, float]:
    """An InMemoryRequest as botocore (with `keys`) sends it, and the time it was signed;
    `after`: headers set once it is signed (botocore's S3 signer picks its own payload hash)."""
    request = AWSRequest(method=method, url=url, data=body, headers=headers or {})
    s3 = service == "s3"
    if presign:
        auth: SigV4Auth = (S3SigV4QueryAuth if s3 else SigV4QueryAuth)(keys, service, region, 600)
    else:
        auth = (S3SigV4Auth if s3 else SigV4Auth)(keys, service, region)
    auth.add_auth(request)
    parts = urlsplit(request.url)
    fields = [("Host", parts.netloc), *request.headers.items()]
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    stamp = sigv4.parse_amz_date(request.context["timestamp"])
    made = InMemoryRequest(headers=fields, path=target, body=body, method=method)
    for name, value in (after or {}).items():
        made.set_header_values(name, [value])
    return made, stamp


def _verified(request: InMemoryRequest, *, service: str = "s3", region: str = "us-east-1") -> None:
    """botocore, with the real keys, reproduces the signature the proxy wrote."""
    host = request.get_header_values("host")[0]
    _, _, query = request.path.partition("?")
    params = {unquote(k): unquote(v) for k, _, v in (e.partition("=") for e in query.split("&"))}
    if "X-Amz-Signature" in params:
        credential, given = params["X-Amz-Credential"], params["X-Amz-Signature"]
        signed, amz_date = params["X-Amz-SignedHeaders"], params["X-Amz-Date"]
        assert params.get("X-Amz-Security-Token") == REAL.token
    else:
        (auth,) = request.get_header_values("authorization")
        parts = dict(p.strip().split("=", 1) for p in auth[17:].split(","))
        credential, given, signed = parts["Credential"], parts["Signature"], parts["SignedHeaders"]
        amz_date = request.get_header_values("x-amz-date")[0]
        assert request.get_header_values("x-amz-security-token") == [REAL.token]
        assert "x-amz-security-token" in signed.split(";")
    assert credential == f"{REAL.access_key}/{amz_date[:8]}/{region}/{service}/aws4_request"
    expected = reference_signature(
        request.method, f"https://{host}{request.path}", request.headers, request.body,
        keys=REAL, service=service, region=region, amz_date=amz_date,
        signed_headers=signed.split(";"), presigned="X-Amz-Signature" in params,
    )
    assert given == expected


@pytest.mark.parametrize(("method", "url", "body", "service"), [
    ("PUT", "https://s3.us-east-1.amazonaws.com/bucket/a%20key/~x.txt", b"data", "s3"),
    ("GET", "https://s3.us-east-1.amazonaws.com/bucket/k?list-type=2&prefix=a%2Fb", b"", "s3"),
    ("POST", "https://sts.us-east-1.amazonaws.com/", b"Action=GetCallerIdentity&Version=2011-06-15",
     "sts"),
    ("POST", "https://dynamodb.us-east-1.amazonaws.com/", b'{"Limit": 1}', "dynamodb"),
])
def test_header_form_is_re_signed_with_the_real_keys(
    method: str, url: str, body: bytes, service: str
) -> None:
    headers = {"Content-Type": "application/x-amz-json-1.0"} if service == "dynamodb" else {}
    request, now = _signed(method, url, body, service=service, headers=headers)
    PROCESSOR.inject(SECRET, request, now=now)
    _verified(request, service=service)


@pytest.mark.parametrize(("url", "service"), [
    ("https://s3.us-east-1.amazonaws.com/bucket/photo%20one.jpg?response-content-type=a%2Fb", "s3"),
    ("https://sts.us-east-1.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15", "sts"),
])
def test_presigned_url_is_re_signed(url: str, service: str) -> None:
    request, now = _signed("GET", url, service=service, presign=True)
    PROCESSOR.inject(SECRET, request, now=now + 300)  # a URL used a while after it was made
    _verified(request, service=service)
    assert AWS_PLACEHOLDER_KEY_ID not in request.path


def test_a_hashed_payload_must_be_the_body_s() -> None:
    request, now = _signed("PUT", "https://s3.us-east-1.amazonaws.com/b/k", b"data",
                           after={"X-Amz-Content-SHA256": hashlib.sha256(b"data").hexdigest()})
    PROCESSOR.inject(SECRET, request, now=now)
    _verified(request)
    request, now = _signed("PUT", "https://s3.us-east-1.amazonaws.com/b/k", b"data",
                           after={"X-Amz-Content-SHA256": hashlib.sha256(b"other").hexdigest()})
    with pytest.raises(RequestInapplicable, match="not the SHA-256 of the body"):
        PROCESSOR.inject(SECRET, request, now=now)


def test_the_sandbox_s_session_token_is_replaced() -> None:
    keys = Credentials(AWS_PLACEHOLDER_KEY_ID, AWS_PLACEHOLDER_SECRET, "placeholder-token")
    request, now = _signed("GET", "https://s3.us-east-1.amazonaws.com/b/k", keys=keys)
    PROCESSOR.inject(SECRET, request, now=now)
    _verified(request)
    static = json.dumps({"access_key_id": REAL.access_key, "secret_access_key": REAL.secret_key})
    request, now = _signed("GET", "https://s3.us-east-1.amazonaws.com/b/k", keys=keys)
    PROCESSOR.inject(static, request, now=now)
    assert not request.get_header_values("x-amz-security-token")
    assert "x-amz-security-token" not in request.get_header_values("authorization")[0]


def test_the_host_sent_is_the_host_signed() -> None:
    request, now = _signed("GET", "https://s3.us-east-1.amazonaws.com/b/k")
    request.set_header_values("Host", ["other.example.com"])  # as the proxy rewrote it
    PROCESSOR.inject(SECRET, request, now=now)
    _verified(request)


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"region": "ap-south-1"}, AwsScopeRefused, "s3 in ap-south-1 is not allowed"),
    ({"service": "sqs", "url": "https://sqs.us-east-1.amazonaws.com/"}, AwsScopeRefused,
     "sqs in us-east-1"),
    ({"keys": Credentials("AKIAOTHERKEYID000001", "x")}, RequestInapplicable,
     "other than the placeholder"),
    ({"skew": 301}, AwsClockSkew, "301 s behind"),
    ({"skew": -400}, AwsClockSkew, "400 s ahead"),
    ({"unsigned": True}, RequestInapplicable, "not signed with AWS Signature Version 4"),
    ({"streaming": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"}, AwsStreamingSigned, "no trailer"),
    ({"presign_skew": 601}, AwsClockSkew, "expired 1 s ago"),
])
def test_refusals(change: dict[str, Any], error: type[Exception], message: str) -> None:
    url = change.get("url", "https://s3.us-east-1.amazonaws.com/b/k")
    headers = {"X-Amz-Content-SHA256": change["streaming"]} if "streaming" in change else None
    request, now = _signed(
        "GET", url, service=change.get("service", "s3"), region=change.get("region", "us-east-1"),
        keys=change.get("keys", PLACEHOLDER), after=headers, presign="presign_skew" in change,
    )
    if change.get("unsigned"):
        request.set_header_values("Authorization", [])
    now += change.get("skew", 0) + change.get("presign_skew", 0)
    with pytest.raises(error, match=message) as raised:
        PROCESSOR.inject(SECRET, request, now=now)
    assert REAL.secret_key not in str(raised.value) and "AKIAOTHER" not in str(raised.value)


def _framed(*chunks: bytes) -> bytes:
    return b"".join(b"%x;chunk-signature=%s\r\n%s\r\n" % (len(c), b"0" * 64, c) for c in chunks)


def test_a_chunk_signed_body_is_re_signed_chunk_by_chunk() -> None:
    body = _framed(b"a" * 8192, b"tail", b"")
    request, now = _signed("PUT", "https://s3.us-east-1.amazonaws.com/b/k", body, after={
        "X-Amz-Content-SHA256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "Content-Encoding": "aws-chunked", "X-Amz-Decoded-Content-Length": "8196"})
    PROCESSOR.inject(SECRET, request, now=now)
    _verified(request)
    assert len(request.body) == len(body) and b"0" * 64 not in request.body
    (auth,) = request.get_header_values("authorization")
    seed = auth.rpartition("Signature=")[2]
    amz_date = request.get_header_values("x-amz-date")[0]
    fake = AwsFake(REAL)
    assert fake.chunks_verified(request.body, seed, amz_date, "us-east-1", "s3")
    assert not fake.chunks_verified(body, seed, amz_date, "us-east-1", "s3")


def test_a_chunk_signed_body_is_re_signed_the_same_however_it_arrives() -> None:
    """Split in two at every byte, and byte by byte: what `Resigner` holds of a chunk header or
    of a chunk waits for the rest, and the output is the body fed whole, which verifies."""
    body = _framed(b"a" * 150, b"\r\n", b"b", b"c" * 17, b"")
    amz_date = "20260101T120000Z"
    scope = sigv4.Scope(REAL.access_key, amz_date[:8], "us-east-1", "s3")
    seed = hashlib.sha256(b"the request's signature").hexdigest()

    def resigned(pieces: list[bytes]) -> bytes:
        resigner = awschunked.Resigner(seed, sigv4.signing_key(REAL.secret_key, scope),
                                       amz_date, scope)
        out = b"".join(resigner.feed(piece) for piece in pieces)
        return out + resigner.feed(b"")

    whole = resigned([body])
    assert len(whole) == len(body)
    assert AwsFake(REAL).chunks_verified(whole, seed, amz_date, "us-east-1", "s3")
    for cut in range(1, len(body)):  # no piece is b"", which is the end
        assert resigned([body[:cut], body[cut:]]) == whole, cut
    assert resigned([body[at:at + 1] for at in range(len(body))]) == whole


@pytest.mark.parametrize("body", [
    _framed(b"abc")[:-2], _framed(b"abc"), _framed(b"abc", b"") + b"x",
    b"3;chunk-signature=short\r\nabc\r\n",
])
def test_a_malformed_chunk_signed_body_is_refused(body: bytes) -> None:
    request, now = _signed("PUT", "https://s3.us-east-1.amazonaws.com/b/k", body, after={
        "X-Amz-Content-SHA256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"})
    with pytest.raises(RequestInapplicable, match="aws-chunked"):
        PROCESSOR.inject(SECRET, request, now=now)


class _Streaming(InMemoryRequest):
    """A request whose body is still coming (chunked, or HTTP/2 without Content-Length)."""

    def body_length(self) -> int | None:
        return None


def _streaming(request: InMemoryRequest) -> _Streaming:
    return _Streaming(headers=request.headers, path=request.path, body=b"", method=request.method)


def test_a_claimed_hash_of_a_body_of_unknown_length_is_signed_as_claimed() -> None:
    claimed = hashlib.sha256(b"on its way").hexdigest()
    request, now = _signed("PUT", "https://s3.us-east-1.amazonaws.com/b/k",
                           after={"X-Amz-Content-SHA256": claimed})
    streaming = _streaming(request)
    assert not awsresign.needs_body(PROCESSOR, streaming, now)
    PROCESSOR.inject(SECRET, streaming, now=now)
    _verified(streaming)  # AWS compares the claim with the body it receives


def test_unknown_lengths_without_a_payload_hash() -> None:
    get, now = _signed("GET", "https://sts.us-east-1.amazonaws.com/?Action=GetCallerIdentity",
                       service="sts")
    assert not awsresign.needs_body(PROCESSOR, _streaming(get), now)  # signed as empty
    streaming = _streaming(get)
    PROCESSOR.inject(SECRET, streaming, now=now)
    _verified(streaming, service="sts")
    post, now = _signed("POST", "https://sts.us-east-1.amazonaws.com/", b"Action=X",
                        service="sts")
    assert awsresign.needs_body(PROCESSOR, _streaming(post), now)  # 411 from the pipeline
