"""boto3, unchanged, with only the placeholder keys, through a real proxy that re-signs its
SigV4 requests (aws-sigv4) for a fake AWS that checks every signature with the real keys
(tests/awsfake.py, botocore as its reference signer).

The fake serves S3, STS and DynamoDB under their real names (the stub DNS answers loopback for
them, the test CA issued their certificates, only the proxy trusts it); the client trusts the
bundle `sealgate env` wrote (AWS_CA_BUNDLE). The real keys, with a session token, are in the
proxy's file store; the sandbox's environment holds the documented placeholder pair only.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sealgate.credentials.processors import (
    AWS_PLACEHOLDER_KEY_ID,
    AWS_PLACEHOLDER_SECRET,
    AwsSigV4Processor,
)
from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.sdk.kit import World, policy, rule, rules_file, world

pytest.importorskip("boto3", reason="boto3 is not installed (pip install -e '.[test]')")

from botocore.credentials import Credentials

from tests.awsfake import AwsFake

REAL = Credentials("AKIACANARYKEYID00042", "CANARY/aws+secret/key0123456789abcdefABCD",
                   "CANARY-session/token+0123456789==")
SECRET_JSON = json.dumps({"access_key_id": REAL.access_key, "secret_access_key": REAL.secret_key,
                          "session_token": REAL.token})
S3, STS, DDB, SQS = (f"{s}.us-east-1.amazonaws.com" for s in ("s3", "sts", "dynamodb", "sqs"))
KEYS = {"aws-1": "aws-key-sigv4-1", "plain-1": "plain-key-sigv4-1",
        "tokens-1": "tokens-key-sigv4-1"}


def _sigv4(services: str) -> str:
    return f"{{type: aws-sigv4, services: [{services}], regions: [us-east-1]}}"


def rules(port: int) -> str:
    return rules_file(
        [
            policy("aws", rule(S3, [port], inject=_sigv4("s3")),
                   rule(STS, [port], inject=_sigv4("sts")),
                   rule(DDB, [port], inject=_sigv4("dynamodb")),
                   rule(SQS, [port], inject=_sigv4("s3"))),
            # Methods make the proxy intercept (a bare host rule would pass TLS through).
            policy("plain", rule(S3, [port], methods=["GET"])),
            policy("tokens", rule(S3, [port]), tokens=True),
        ],
        {"aws-1": ("aws", KEYS["aws-1"]), "plain-1": ("plain", KEYS["plain-1"]),
         "tokens-1": ("tokens", KEYS["tokens-1"])},
        default="tokens",  # base-URL mode: a client on loopback with no proxy credentials
    )


@contextlib.contextmanager
def aws_world(directory: Path, test_ca: OriginCA, dns: StubDNS) -> Iterator[World]:
    """A proxy with `rules` in front of an AwsFake (`World.aws`), the real keys in its store;
    at the end, a check that none of them was logged."""
    fake = AwsFake(REAL)
    # The file store is YAML: the JSON object goes in quoted, as one string.
    with world(directory, test_ca, dns, [S3, STS, DDB, SQS], fake, rules, KEYS,
               f"'{SECRET_JSON}'", preload=["boto3", "requests"]) as made:
        made.aws = fake  # type: ignore[attr-defined]
        yield made
    logged = made.proxy.audit_text() + made.proxy.stderr()
    for canary in (REAL.secret_key, REAL.token, REAL.access_key):
        assert canary not in logged


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    with aws_world(tmp_path_factory.mktemp("aws-sigv4"), test_ca, dns) as made:
        yield made


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()


def aws_env(w: World, sandbox: str, **extra: str) -> dict[str, str]:
    env = {**w.env(sandbox), "AWS_ACCESS_KEY_ID": AWS_PLACEHOLDER_KEY_ID,
           "AWS_SECRET_ACCESS_KEY": AWS_PLACEHOLDER_SECRET, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent",
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", **extra}
    assert not [v for v in env.values()
                if REAL.secret_key in v or REAL.token in v or REAL.access_key in v]
    return env


CLIENT = """
def client(service, endpoint, region="us-east-1", **config):
    import boto3, botocore.config
    return boto3.client(service, endpoint_url=endpoint, region_name=region,
                        config=botocore.config.Config(s3={"addressing_style": "path"},
                                                      retries={"max_attempts": 1}, **config))

def refused(call):
    import botocore.exceptions
    try:
        call()
    except botocore.exceptions.ClientError as exc:
        meta = exc.response["ResponseMetadata"]
        return {"status": meta["HTTPStatusCode"],
                "reason": meta["HTTPHeaders"].get("x-sealgate-error"), "text": str(exc)}
    return {"status": 200}
"""

EVERYTHING = CLIENT + """
def main(s3, sts, ddb):
    import requests
    c = client("s3", s3)
    c.put_object(Bucket="bkt", Key="dir/a key.txt", Body=b"hello through sealgate")
    got = c.get_object(Bucket="bkt", Key="dir/a key.txt")["Body"].read().decode()
    part = b"x" * (1 << 20)
    made = c.create_multipart_upload(Bucket="bkt", Key="big.bin")
    etags = [c.upload_part(Bucket="bkt", Key="big.bin", UploadId=made["UploadId"],
                           PartNumber=n, Body=part + bytes([n]))["ETag"] for n in (1, 2)]
    c.complete_multipart_upload(
        Bucket="bkt", Key="big.bin", UploadId=made["UploadId"],
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n}
                                   for n, e in zip((1, 2), etags)]})
    big = len(c.get_object(Bucket="bkt", Key="big.bin")["Body"].read())
    # botocore presigns S3 with SigV2 unless asked for SigV4 (refused, and told so).
    v2 = c.generate_presigned_url("get_object", Params={"Bucket": "bkt", "Key": "dir/a key.txt"})
    sigv2 = requests.get(v2, timeout=20)
    url = client("s3", s3, signature_version="s3v4").generate_presigned_url(
        "get_object", Params={"Bucket": "bkt", "Key": "dir/a key.txt"}, ExpiresIn=300)
    presigned = requests.get(url, timeout=20)
    echo = c.get_object(Bucket="bkt", Key="echo")["Body"].read().decode()
    who = client("sts", sts).get_caller_identity()
    tables = client("dynamodb", ddb).list_tables()["TableNames"]
    return {"got": got, "big": big, "presigned": [presigned.status_code, presigned.text],
            "sigv2": [sigv2.status_code, sigv2.headers.get("x-sealgate-error"), sigv2.text],
            "url": url, "echo": echo, "account": who["Account"], "tables": tables}
"""


def test_boto3_works_with_placeholder_keys_only(w: World) -> None:
    out = w.run(EVERYTHING, aws_env(w, "aws-1"), s3=w.url(host=S3), sts=w.url(host=STS),
                ddb=w.url(host=DDB)).ok()
    assert out["got"] == "hello through sealgate"
    assert out["big"] == 2 * (1 << 20) + 2
    assert out["presigned"] == [200, "hello through sealgate"], out["presigned"]
    assert AWS_PLACEHOLDER_KEY_ID in out["url"]  # the sandbox only ever saw its own signature
    assert out["sigv2"][:2] == [400, "request_inapplicable"]
    assert "signature_version='s3v4'" in out["sigv2"][2]
    assert out["account"] == "123456789012" and out["tables"] == ["alpha", "beta"]
    fake: AwsFake = w.aws  # type: ignore[attr-defined]
    assert {line.split()[0] for line in fake.verified} == {"s3", "sts", "dynamodb"}
    assert any("?uploads" in r.path for r in w.fake.requests)
    # The echo shows what arrived; the key id and session token came back masked.
    echoed = json.loads(out["echo"])
    assert REAL.access_key not in echoed["Authorization"]
    assert REAL.token not in out["echo"] and REAL.access_key not in out["echo"]
    assert "[REDACTED]" in echoed["X-Amz-Security-Token"]
    # Nothing the sandbox ran saw a real key, and every request that arrived was re-signed.
    for arrived in w.fake.requests:
        assert AWS_PLACEHOLDER_KEY_ID not in arrived.path
        assert AWS_PLACEHOLDER_KEY_ID not in arrived.headers.get("authorization", "")


def test_without_sealgate_the_fake_refuses_the_placeholder(w: World) -> None:
    """The fake checks signatures: the same call, forwarded untouched, is refused."""
    code = CLIENT + """
def main(s3):
    return refused(lambda: client("s3", s3).get_object(Bucket="bkt", Key="x"))
"""
    out = w.run(code, aws_env(w, "plain-1"), s3=w.url(host=S3)).ok()
    assert out["status"] == 403 and "InvalidAccessKeyId" in out["text"], out


def run_refused(w: World, code: str, reason: str, **args: Any) -> dict[str, Any]:
    env = aws_env(w, "aws-1", **args.pop("env", {}))
    out: dict[str, Any] = w.run(CLIENT + code, env, **args).ok()
    assert out.get("reason") == reason, out
    assert w.fake.untouched(), "a refused request reached the fake"
    line = w.proxy.wait_audit(lambda e: e.get("reason") == reason)
    assert line["decision"] == "deny"
    return out


def test_a_region_the_rule_does_not_name_is_refused(w: World) -> None:
    out = run_refused(w, """
def main(s3):
    return refused(lambda: client("s3", s3, region="eu-west-1").get_object(Bucket="b", Key="k"))
""", "aws_scope", s3=w.url(host=S3))
    assert out["status"] == 403


def test_a_service_the_rule_does_not_name_is_refused(w: World) -> None:
    run_refused(w, """
def main(sqs):
    return refused(lambda: client("sqs", sqs).list_queues())
""", "aws_scope", sqs=w.url(host=SQS))


def test_a_real_looking_key_id_is_refused(w: World) -> None:
    out = run_refused(w, """
def main(s3):
    return refused(lambda: client("s3", s3).get_object(Bucket="b", Key="k"))
""", "request_inapplicable", s3=w.url(host=S3), env={"AWS_ACCESS_KEY_ID": "AKIASOMEREALKEY00001"})
    assert out["status"] == 400


def test_an_unsigned_request_is_refused(w: World) -> None:
    run_refused(w, """
def main(s3):
    import botocore
    return refused(lambda: client("s3", s3, signature_version=botocore.UNSIGNED)
                   .get_object(Bucket="b", Key="k"))
""", "request_inapplicable", s3=w.url(host=S3))


def test_a_skewed_clock_is_refused(w: World) -> None:
    out = run_refused(w, """
def main(s3):
    import datetime, botocore.auth
    real = botocore.auth.get_current_datetime
    botocore.auth.get_current_datetime = lambda: real() - datetime.timedelta(minutes=20)
    return refused(lambda: client("s3", s3).get_object(Bucket="b", Key="k"))
""", "aws_clock_skew", s3=w.url(host=S3))
    assert "behind the proxy's clock" in out["text"] or out["status"] == 400


ROUND_TRIP = CLIENT + """
def main(s3):
    c = client("s3", s3)
    c.put_object(Bucket="bkt", Key="t.txt", Body=b"sealed keys")
    return c.get_object(Bucket="bkt", Key="t.txt")["Body"].read().decode()
"""


def sealed_env(w: World) -> dict[str, str]:
    """The placeholder keys, and the real ones in a sealed token in the proxy credentials
    (boto3 cannot add a header to every request)."""
    token = w.mint(AwsSigV4Processor(services="s3", regions="us-east-1"), host=S3,
                   secret=SECRET_JSON)
    env = aws_env(w, "tokens-1")
    env.update({k: v for k, v in w.env("tokens-1", key=f"{KEYS['tokens-1']},{token}").items()
                if "proxy" in k.lower()})
    return env


def test_keys_in_a_sealed_token(w: World) -> None:
    """The same processor sealed in a token instead of brokered."""
    assert w.run(ROUND_TRIP, sealed_env(w), s3=w.url(host=S3)).ok() == "sealed keys"
    assert w.fake.requests and all("AKIACANARY" in r.headers["authorization"]
                                   for r in w.fake.requests)


def test_boto3_in_base_url_mode_with_the_keys_in_a_token(w: World) -> None:
    """No proxy, no CA: boto3's endpoint_url is the base URL with a token in it. botocore
    percent-encodes the prefix's ':' and '@' as it joins the path; the proxy reads them."""
    token = w.mint(AwsSigV4Processor(services="s3", regions="us-east-1"), host=S3,
                   secret=SECRET_JSON)
    env = {k: v for k, v in aws_env(w, "tokens-1").items()
           if "proxy" not in k.lower() and "CA" not in k and "CERT" not in k}
    assert w.run(ROUND_TRIP, env, s3=w.base_url(host=S3, tokens=[token])).ok() == "sealed keys"
    assert [r.method for r in w.fake.requests] == ["PUT", "GET"]
    assert all("AKIACANARY" in r.headers["authorization"] and r.path.startswith("/bkt/")
               for r in w.fake.requests)
    line = w.proxy.wait_audit(lambda e: e.get("method") == "PUT" and e.get("base_url"))
    assert (line["decision"], line["policy"]) == ("allow", "tokens")


HTTP2 = """
def main(s3):
    import httpx
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    request = AWSRequest(method="GET", url=s3 + "/bkt/h2.txt")
    S3SigV4Auth(Credentials("SEALGATEPLACEHOLDER", "x"), "s3", "us-east-1").add_auth(request)
    with httpx.Client(http2=True, trust_env=True) as c:
        c.put(s3 + "/bkt/h2.txt", content=b"over h2")  # refused: not signed
        r = c.get(s3 + "/bkt/h2.txt", headers=dict(request.headers.items()))
        return [r.http_version, r.status_code, r.text]
"""


def test_http2_client_signs_authority_as_host(w: World) -> None:
    """Over HTTP/2 there is no Host header, only :authority, which the upstream receives as
    Host: that is what is signed."""
    fake: AwsFake = w.aws  # type: ignore[attr-defined]
    fake.objects["/bkt/h2.txt"] = b"over h2"
    out = w.run(HTTP2, aws_env(w, "aws-1"), s3=w.url(host=S3)).ok()
    assert out == ["HTTP/2", 200, "over h2"], out
