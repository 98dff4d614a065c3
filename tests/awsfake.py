"""A fake of AWS over HTTPS on loopback that checks SigV4 as AWS does, with the REAL secret, and
botocore (not sealgate's signer) as the reference: S3 (path-style objects, multipart uploads,
presigned GETs), STS GetCallerIdentity (query protocol) and DynamoDB ListTables (JSON protocol).

A request whose signature botocore does not reproduce with the real keys gets 403
SignatureDoesNotMatch in AWS's XML; a key id or session token other than the real ones 403
InvalidAccessKeyId / InvalidToken; a payload hash that is not the body's 400
XAmzContentSHA256Mismatch. Served through `tests.sdk.kit.FakeAPI`, which records what arrived.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest, HTTPHeaders
from botocore.credentials import Credentials

from tests.sdk.kit import Arrived, Reply

ACCOUNT = "123456789012"


def reference_signature(
    method: str, url: str, fields: Sequence[tuple[str, str]], body: bytes, *,
    keys: Credentials, service: str, region: str, amz_date: str,
    signed_headers: Sequence[str], presigned: bool,
) -> str:
    """What botocore signs for this request, over exactly `signed_headers` (botocore would pick
    its own list), dated `amz_date`. For a presigned `url`, its X-Amz-Signature is left out."""
    s3 = service == "s3"
    if presigned:
        parts = urlsplit(url)
        query = "&".join(e for e in parts.query.split("&")
                         if unquote(e.partition("=")[0]) != "X-Amz-Signature")
        url = parts._replace(query=query).geturl()
        base: type[SigV4Auth] = S3SigV4QueryAuth if s3 else SigV4QueryAuth
    else:
        base = S3SigV4Auth if s3 else SigV4Auth
    wanted = set(signed_headers)

    class Reference(base):  # type: ignore[valid-type,misc]
        def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
            chosen = HTTPHeaders()
            for name, value in fields:
                if name.lower() in wanted:
                    chosen.add_header(name.lower(), value)
            return chosen

    request = AWSRequest(method=method, url=url, data=body)
    for name, value in fields:
        request.headers.add_header(name, value)
    request.context["timestamp"] = amz_date
    auth = Reference(keys, service, region)
    canonical = auth.canonical_request(request)
    return str(auth.signature(auth.string_to_sign(request, canonical), request))


def _error(status: int, code: str, message: str) -> Reply:
    xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
           f"<Message>{message}</Message><RequestId>fake</RequestId></Error>")
    return Reply(status, xml.encode(), {"Content-Type": "application/xml"})


def _aws_chunked(body: bytes) -> bytes:
    """The data of an `aws-chunked` body (unsigned chunks, trailers ignored)."""
    data, rest = b"", body
    while rest:
        line, _, rest = rest.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if not size:
            break
        data, rest = data + rest[:size], rest[size + 2:]
    return data


@dataclass
class AwsFake:
    """The route for `FakeAPI`: checks every request's signature, then answers it."""

    keys: Credentials
    # The principal that may assume a role (STS AssumeRole), and the keys that gave out.
    base: Credentials | None = None
    issued: dict[str, Credentials] = field(default_factory=dict)
    assumed: list[dict[str, str]] = field(default_factory=list)  # each AssumeRole's form
    expires_in: int = 3600
    sts_down: bool = False
    objects: dict[str, bytes] = field(default_factory=dict)
    uploads: dict[str, dict[int, bytes]] = field(default_factory=dict)
    verified: list[str] = field(default_factory=list)  # "<service> <method> <path>", in order
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, seen: Arrived) -> Reply:
        checked = self._check(seen)
        if isinstance(checked, Reply):
            return checked
        service, path, query, keys = checked
        with self._lock:
            self.verified.append(f"{service} {seen.method} {path}")
        if service == "s3":
            return self._s3(seen, path, query)
        if service == "sts":
            return self._sts(seen, keys)
        if service == "dynamodb":
            return Reply(200, {"TableNames": ["alpha", "beta"]},
                         {"Content-Type": "application/x-amz-json-1.0"})
        return _error(400, "UnknownService", "the fake does not serve this service")

    def _keys_for(self, akid: str) -> Credentials | None:
        if akid == self.keys.access_key:
            return self.keys
        if self.base is not None and akid == self.base.access_key:
            return self.base
        return self.issued.get(akid)

    def _check(self, seen: Arrived) -> Reply | tuple[str, str, dict[str, str], Credentials]:
        headers = seen.headers
        path, _, raw_query = seen.path.partition("?")
        query = dict(parse_qsl(raw_query, keep_blank_values=True))
        presigned = "X-Amz-Signature" in query
        if presigned:
            credential, signed = query.get("X-Amz-Credential", ""), query["X-Amz-SignedHeaders"]
            amz_date, given = query.get("X-Amz-Date", ""), query["X-Amz-Signature"]
            token = query.get("X-Amz-Security-Token")
        elif headers.get("authorization", "").startswith("AWS4-HMAC-SHA256 "):
            parts = dict(p.strip().split("=", 1)
                         for p in headers["authorization"][17:].split(","))
            credential, signed, given = (parts["Credential"], parts["SignedHeaders"],
                                         parts["Signature"])
            amz_date, token = headers.get("x-amz-date", ""), headers.get("x-amz-security-token")
        else:
            return _error(403, "AccessDenied", "Missing Authentication Token")
        akid, _date, region, service, _ = credential.split("/")
        keys = self._keys_for(akid)
        if keys is None:
            return _error(403, "InvalidAccessKeyId",
                          "The AWS Access Key Id you provided does not exist in our records.")
        if token != keys.token:
            return _error(403, "InvalidToken",
                          "The provided token is malformed or otherwise invalid.")
        content = headers.get("x-amz-content-sha256")
        if content and len(content) == 64 and content != hashlib.sha256(seen.body).hexdigest():
            return _error(400, "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' "
                          "header does not match what was computed.")
        expected = reference_signature(
            seen.method, f"https://{headers['host']}{seen.path}", seen.fields, seen.body,
            keys=keys, service=service, region=region, amz_date=amz_date,
            signed_headers=signed.split(";"), presigned=presigned,
        )
        chunks_ok = content != "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" or self.chunks_verified(
            seen.body, given, amz_date, region, service, keys)
        if not hmac.compare_digest(expected, given) or not chunks_ok:
            return _error(403, "SignatureDoesNotMatch",
                          "The request signature we calculated does not match the signature you "
                          "provided. Check your key and signing method.")
        return service, path, query, keys

    def chunks_verified(self, body: bytes, seed: str, amz_date: str, region: str,
                        service: str, keys: Credentials | None = None) -> bool:
        """Every chunk's signature of an aws-chunked body, chained from `seed`, as AWS checks
        it (botocore derives the key and signs; the chunk's string to sign is AWS's)."""
        request = AWSRequest()
        request.context["timestamp"] = amz_date
        auth = SigV4Auth(keys or self.keys, service, region)
        scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
        previous, rest = seed, body
        while True:
            head, _, rest = rest.partition(b"\r\n")
            size_hex, _, signature = head.partition(b";chunk-signature=")
            size = int(size_hex, 16)
            chunk, crlf, rest = rest[:size], rest[size:size + 2], rest[size + 2:]
            text = "\n".join(("AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, previous,
                              hashlib.sha256(b"").hexdigest(), hashlib.sha256(chunk).hexdigest()))
            previous = str(auth.signature(text, request))
            if crlf != b"\r\n" or not hmac.compare_digest(previous.encode(), signature):
                return False
            if not size:
                return not rest

    def _s3(self, seen: Arrived, path: str, query: dict[str, str]) -> Reply:
        xml = {"Content-Type": "application/xml"}
        data = seen.body
        if "aws-chunked" in seen.headers.get("content-encoding", ""):
            data = _aws_chunked(data)
        if seen.method == "PUT" and "uploadId" in query:
            upload = self.uploads[query["uploadId"]]
            upload[int(query["partNumber"])] = data
            return Reply(200, b"", {"ETag": f'"{hashlib.md5(data).hexdigest()}"'})
        if seen.method == "PUT":
            self.objects[path] = data
            return Reply(200, b"", {"ETag": f'"{hashlib.md5(data).hexdigest()}"'})
        if seen.method == "POST" and "uploads" in query:
            upload_id = f"upload-{len(self.uploads) + 1}"
            self.uploads[upload_id] = {}
            bucket, _, key = path.lstrip("/").partition("/")
            return Reply(200, (
                "<InitiateMultipartUploadResult><Bucket>" + bucket + "</Bucket><Key>" + key +
                "</Key><UploadId>" + upload_id + "</UploadId></InitiateMultipartUploadResult>"
            ).encode(), xml)
        if seen.method == "POST" and "uploadId" in query:
            parts = self.uploads.pop(query["uploadId"])
            self.objects[path] = b"".join(parts[n] for n in sorted(parts))
            return Reply(200, (
                b"<CompleteMultipartUploadResult><Location>x</Location><Bucket>b</Bucket>"
                b"<Key>k</Key><ETag>\"done\"</ETag></CompleteMultipartUploadResult>"
            ), xml)
        if seen.method == "GET" and path.endswith("/echo"):
            # A debug object: the request as it arrived, so the test sees what is masked.
            echoed = json.dumps(dict(seen.fields)).encode()
            return Reply(200, echoed, {"Content-Type": "text/plain"})
        if seen.method == "GET" and path in self.objects:
            return Reply(200, self.objects[path], {"Content-Type": "binary/octet-stream"})
        return _error(404, "NoSuchKey", "The specified key does not exist.")

    def _sts(self, seen: Arrived, keys: Credentials) -> Reply:
        form: dict[str, Any] = dict(parse_qsl(seen.body.decode()))
        if form.get("Action") == "AssumeRole":
            return self._assume(form, keys)
        if form.get("Action") != "GetCallerIdentity":
            return _error(400, "InvalidAction", "the fake knows GetCallerIdentity only")
        xml = (
            '<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
            f"<GetCallerIdentityResult><Arn>arn:aws:iam::{ACCOUNT}:user/sealgate-test</Arn>"
            f"<UserId>AIDAFAKEUSER</UserId><Account>{ACCOUNT}</Account>"
            "</GetCallerIdentityResult><ResponseMetadata><RequestId>fake</RequestId>"
            "</ResponseMetadata></GetCallerIdentityResponse>"
        )
        return Reply(200, xml.encode(), {"Content-Type": "text/xml"})

    def _assume(self, form: dict[str, Any], keys: Credentials) -> Reply:
        with self._lock:
            self.assumed.append(form)
        if self.sts_down:
            return _error(503, "ServiceUnavailable", "the fake's STS is down")
        if keys is not self.base:
            return _error(403, "AccessDenied", "not authorized to perform sts:AssumeRole")
        n = len(self.issued) + 1
        temp = Credentials(f"ASIAFAKEROLE{n:08d}", f"role-secret/{secrets.token_urlsafe(24)}",
                           f"role-token/{secrets.token_urlsafe(32)}")
        self.issued[temp.access_key] = temp
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + self.expires_in))
        xml = (
            '<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
            "<AssumeRoleResult><Credentials>"
            f"<AccessKeyId>{temp.access_key}</AccessKeyId>"
            f"<SecretAccessKey>{temp.secret_key}</SecretAccessKey>"
            f"<SessionToken>{temp.token}</SessionToken><Expiration>{expires}</Expiration>"
            "</Credentials><AssumedRoleUser><Arn>x</Arn><AssumedRoleId>y</AssumedRoleId>"
            "</AssumedRoleUser></AssumeRoleResult></AssumeRoleResponse>"
        )
        return Reply(200, xml.encode(), {"Content-Type": "text/xml"})
