"""Build tests/vectors/sigv4.json: SigV4 signatures for the cases of AWS's published SigV4 test
suite (aws-sig-v4-test-suite: its credentials, date, region and requests), computed by botocore
as the reference, plus S3 cases (path encoded once, never normalised) and presigned URLs.

    .venv/bin/python tests/vectors/sigv4_generate.py          # rewrite sigv4.json
    .venv/bin/python tests/vectors/sigv4_generate.py --check  # exit 1 if it is out of date

Each vector: the request as it goes on the wire (raw target, header fields in order, body), the
scope, the signed headers, and the signature botocore makes; tests/unit/test_sigv4.py checks
that sealgate's signer makes the same. Two signatures the suite publishes are kept beside
botocore's, so the reference itself is checked against AWS.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Final

from botocore.credentials import Credentials

from tests.awsfake import reference_signature

PATH: Final = Path(__file__).with_name("sigv4.json")
# The suite's example credentials and time (public test values).
KEYS: Final = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
DATE: Final = "20150830T123600Z"
HOST: Final = "example.amazonaws.com"
STS_TOKEN: Final = (
    "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpS"
    "PfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQD"
    "YwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+sc"
    "qKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA=="
)
# What the suite's files give as the signature of these two (the reference must agree).
PUBLISHED: Final = {
    "get-vanilla": "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
    "post-vanilla": "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
}
UNRESERVED: Final = "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

# name, method, raw target, extra header fields, body, service
CASES: Final[list[tuple[str, str, str, list[tuple[str, str]], str, str]]] = [
    ("get-vanilla", "GET", "/", [], "", "service"),
    ("get-vanilla-query-order-key-case", "GET", "/?Param2=value2&Param1=value1", [], "",
     "service"),
    ("get-vanilla-query-order-value", "GET", "/?Param1=value2&Param1=Value1", [], "", "service"),
    ("get-vanilla-query-unreserved", "GET", f"/?{UNRESERVED}={UNRESERVED}", [], "", "service"),
    ("get-vanilla-utf8-query", "GET", "/?%E1%88%B4=bar", [], "", "service"),
    ("get-unreserved", "GET", f"/{UNRESERVED}", [], "", "service"),
    ("get-utf8", "GET", "/%E1%88%B4", [], "", "service"),
    ("get-space", "GET", "/example%20space/", [], "", "service"),
    ("get-slash", "GET", "//", [], "", "service"),
    ("get-slashes", "GET", "//example//", [], "", "service"),
    ("get-relative", "GET", "/example/..", [], "", "service"),
    ("get-relative-relative", "GET", "/example1/example2/../..", [], "", "service"),
    ("get-slash-dot-slash", "GET", "/./", [], "", "service"),
    ("get-slash-pointless-dot", "GET", "/./example", [], "", "service"),
    ("get-header-key-duplicate", "GET", "/",
     [("My-Header1", "value2"), ("My-Header1", "value2"), ("My-Header1", "value1")], "",
     "service"),
    ("get-header-value-order", "GET", "/",
     [("My-Header1", "value4"), ("My-Header1", "value1"), ("My-Header1", "value3"),
      ("My-Header1", "value2")], "", "service"),
    ("get-header-value-trim", "GET", "/",
     [("My-Header1", " value1"), ("My-Header2", ' "a   b   c"')], "", "service"),
    ("post-vanilla", "POST", "/", [], "", "service"),
    ("post-vanilla-query", "POST", "/?Param1=value1", [], "", "service"),
    ("post-header-key-sort", "POST", "/", [("My-Header1", "value1")], "", "service"),
    ("post-header-value-case", "POST", "/", [("My-Header1", "VALUE1")], "", "service"),
    ("post-x-www-form-urlencoded", "POST", "/",
     [("Content-Type", "application/x-www-form-urlencoded")], "Param1=value1", "service"),
    ("post-x-www-form-urlencoded-parameters", "POST", "/",
     [("Content-Type", "application/x-www-form-urlencoded; charset=utf8")], "Param1=value1",
     "service"),
    ("post-sts-header-before", "POST", "/", [("X-Amz-Security-Token", STS_TOKEN)], "",
     "service"),
    # S3: the path is signed as sent, encoded once, `//` and `..` kept.
    ("s3-get-object", "GET", "/bucket/photos/2015/a%20b~c.jpg",
     [("x-amz-content-sha256", "UNSIGNED-PAYLOAD")], "", "s3"),
    ("s3-double-slash", "GET", "/bucket//key/../x",
     [("x-amz-content-sha256", "UNSIGNED-PAYLOAD")], "", "s3"),
    ("s3-put-hashed", "PUT", "/bucket/key?partNumber=1&uploadId=abc%2Fdef",
     [("x-amz-content-sha256",
       "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824")], "hello", "s3"),
    ("s3-multipart-create", "POST", "/bucket/key?uploads",
     [("x-amz-content-sha256", "UNSIGNED-PAYLOAD")], "", "s3"),
]

# Presigned: name, method, target (auth parameters but the signature), service
_PRESIGN_AUTH: Final = (
    "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20150830%2Fus-east-1%2F"
    "{service}%2Faws4_request&X-Amz-Date=20150830T123600Z&X-Amz-Expires=86400&"
    "X-Amz-SignedHeaders=host"
)
PRESIGNED: Final = [
    ("presigned-s3-get", "GET", "/bucket/test.txt?{auth}", "s3"),
    ("presigned-s3-get-query", "GET", "/bucket/test.txt?response-content-type=text%2Fplain&{auth}",
     "s3"),
    ("presigned-sts", "GET", "/?Action=GetCallerIdentity&Version=2011-06-15&{auth}", "sts"),
]


def _vector(name: str, method: str, target: str, fields: list[tuple[str, str]], body: str,
            service: str, presigned: bool) -> dict[str, object]:
    signed = sorted({k.lower() for k, _ in fields})
    signature = reference_signature(
        method, f"https://{HOST}{target}", fields, body.encode(), keys=KEYS, service=service,
        region="us-east-1", amz_date=DATE, signed_headers=signed, presigned=presigned,
    )
    if name in PUBLISHED and signature != PUBLISHED[name]:
        raise SystemExit(f"botocore disagrees with AWS's published signature for {name}")
    vector: dict[str, object] = {
        "name": name, "method": method, "target": target, "headers": [list(f) for f in fields],
        "body": body, "service": service, "region": "us-east-1", "signed_headers": signed,
        "presigned": presigned, "signature": signature,
    }
    if name in PUBLISHED:
        vector["published"] = True
    return vector


def build() -> dict[str, object]:
    vectors = []
    for name, method, target, extra, body, service in CASES:
        fields = [("Host", HOST), ("X-Amz-Date", DATE), *extra]
        vectors.append(_vector(name, method, target, fields, body, service, False))
    for name, method, target, service in PRESIGNED:
        full = target.format(auth=_PRESIGN_AUTH.format(service=service))
        vectors.append(_vector(name, method, full, [("Host", HOST)], "", service, True))
    return {
        "format": "sealgate SigV4 test vectors",
        "generator": "tests/vectors/sigv4_generate.py",
        "reference": "botocore (SigV4Auth, S3SigV4Auth and their query forms)",
        "access_key_id": KEYS.access_key,
        "secret_access_key": KEYS.secret_key,
        "amz_date": DATE,
        "vectors": vectors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if sigv4.json is stale")
    text = json.dumps(build(), indent=2, ensure_ascii=False) + "\n"
    if parser.parse_args().check:
        if not PATH.exists() or PATH.read_text(encoding="utf-8") != text:
            sys.stderr.write(f"{PATH} is out of date; run {sys.argv[0]}\n")
            return 1
        return 0
    PATH.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
