"""aws-sigv4 with a role: the store holds keys that may only assume a role (STS AssumeRole,
with an external id), the proxy assumes it, caches the role's keys until shortly before they
expire and signs boto3's requests with them. The sandbox holds the placeholder pair only."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.sdk.kit import FakeAPI, World, policy, rule, rules_file, world

pytest.importorskip("boto3", reason="boto3 is not installed (pip install -e '.[test]')")

from botocore.credentials import Credentials

from sealgate.credentials.processors import AwsSigV4Processor
from sealgate.proxy.credentials import exchanged
from tests.awsfake import AwsFake
from tests.integration.test_aws_sigv4 import CLIENT, ROUND_TRIP, aws_env

BASE = Credentials("AKIAROLEBASECANARY01", "CANARY/role+base/secret0123456789abcdef")
S3, STS = "s3.us-east-1.amazonaws.com", "sts.us-east-1.amazonaws.com"  # the proxy dials STS
KEYS = {"role-1": "role-key-sigv4-1", "sealed-1": "role-key-sealed-1",
        "narrow-1": "role-key-narrow-1"}
ROLE = "arn:aws:iam::123456789012:role/sealgate-ci"


def rules(port: int) -> str:
    """role-1 brokered; sealed-1 and narrow-1 carry the role in a token, and only sealed-1's
    policy lets the sandbox POST to STS."""
    return rules_file(
        [policy("role", rule(S3, [port], inject="{type: aws-sigv4, services: [s3], "
                                              "regions: [us-east-1]}")),
         policy("sealed", rule(S3, [port]), rule(STS, [port], methods=["POST"], paths=["/"]),
                tokens=True),
         policy("narrow", rule(S3, [port]), tokens=True)],
        {"role-1": ("role", KEYS["role-1"]), "sealed-1": ("sealed", KEYS["sealed-1"]),
         "narrow-1": ("narrow", KEYS["narrow-1"])}, default=None,
    )


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("aws-roles")
    aws = AwsFake(Credentials("AKIAUNUSEDSTATIC0001", "unused"), base=BASE)
    fake = FakeAPI(test_ca, [S3, STS], aws)
    secret = json.dumps({
        "access_key_id": BASE.access_key, "secret_access_key": BASE.secret_key,
        "role_arn": ROLE, "external_id": "sealgate-external-id",
        "sts_endpoint": f"https://{STS}:{fake.port}",
    })
    with world(directory, test_ca, dns, [S3, STS], None, rules, KEYS, f"'{secret}'",
               fake=fake) as made:
        made.aws = aws  # type: ignore[attr-defined]
        made.role_secret = secret  # type: ignore[attr-defined]
        yield made
    logged = made.proxy.audit_text() + made.proxy.stderr()
    assert BASE.secret_key not in logged
    for temp in aws.issued.values():
        assert temp.secret_key not in logged and temp.token not in logged


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()
    aws: AwsFake = w.aws  # type: ignore[attr-defined]
    aws.assumed.clear()
    aws.sts_down, aws.expires_in = False, 3600


def test_sts_down_before_any_keys_fails_closed(w: World) -> None:
    """First in the module: the proxy holds no role keys yet."""
    aws: AwsFake = w.aws  # type: ignore[attr-defined]
    aws.sts_down = True
    code = CLIENT + """
def main(s3):
    return refused(lambda: client("s3", s3).get_object(Bucket="b", Key="k"))
"""
    out = w.run(code, aws_env(w, "role-1"), s3=w.url(host=S3)).ok()
    assert (out["status"], out["reason"]) == (503, "secret_unavailable"), out
    w.proxy.wait_audit(lambda e: e.get("reason") == "secret_unavailable")
    # boto3 retries a 503: the failure is remembered for 5 s, so STS saw one call.
    assert len(aws.assumed) == 1
    assert not [r for r in w.fake.requests if r.path.startswith("/b/")]  # S3 saw nothing
    time.sleep(exchanged.RETRY_AFTER)  # for the next test: STS may be asked again


def test_keys_close_to_expiry_are_asked_for_again(w: World) -> None:
    """Before the next test (which counts one AssumeRole from keys close to expiry)."""
    aws: AwsFake = w.aws  # type: ignore[attr-defined]
    aws.expires_in = 2  # refreshed from its second half on, behind the requests using it
    assert w.run(ROUND_TRIP, aws_env(w, "role-1"), s3=w.url(host=S3)).ok() == "sealed keys"
    first = len(aws.assumed)
    assert first == 1
    time.sleep(1.2)
    assert w.run(ROUND_TRIP, aws_env(w, "role-1"), s3=w.url(host=S3)).ok() == "sealed keys"
    assert len(aws.assumed) == 2
    time.sleep(2.1)  # the short keys lapse: the next test starts with none usable


def test_the_role_is_assumed_once_and_its_keys_sign(w: World) -> None:
    aws: AwsFake = w.aws  # type: ignore[attr-defined]
    for _ in range(2):
        assert w.run(ROUND_TRIP, aws_env(w, "role-1"), s3=w.url(host=S3)).ok() == "sealed keys"
    (form,) = aws.assumed  # four S3 requests, one AssumeRole, signed with the base keys
    assert form["RoleArn"] == ROLE and form["ExternalId"] == "sealgate-external-id"
    s3 = [r for r in w.fake.requests if "Action=AssumeRole" not in r.body.decode(errors="replace")]
    assert len(s3) == 4
    for arrived in s3:
        assert "ASIAFAKEROLE" in arrived.headers["authorization"]
        assert arrived.headers["x-amz-security-token"].startswith("role-token/")


def _sealed_env(w: World, sandbox: str) -> dict[str, str]:
    # Its own session name: not the brokered role's keys, which the proxy may hold already.
    secret = json.dumps({**json.loads(w.role_secret),  # type: ignore[attr-defined]
                         "role_session_name": "sealed-session"})
    token = w.mint(AwsSigV4Processor(services="s3", regions="us-east-1"), host=S3, secret=secret)
    env = aws_env(w, sandbox)
    env.update({k: v for k, v in w.env(sandbox, key=f"{KEYS[sandbox]},{token}").items()
                if "proxy" in k.lower()})
    return env


def test_the_role_sealed_in_a_token_where_the_policy_allows_sts(w: World) -> None:
    aws: AwsFake = w.aws  # type: ignore[attr-defined]
    assert w.run(ROUND_TRIP, _sealed_env(w, "sealed-1"), s3=w.url(host=S3)).ok() == "sealed keys"
    (form,) = aws.assumed
    assert form["RoleSessionName"] == "sealed-session" and form["RoleArn"] == ROLE
    s3 = [r for r in w.fake.requests if "Action=AssumeRole" not in r.body.decode(errors="replace")]
    assert len(s3) == 2 and all("ASIAFAKEROLE" in r.headers["authorization"] for r in s3)


def test_a_sealed_role_is_not_assumed_where_the_policy_does_not_allow_sts(w: World) -> None:
    aws: AwsFake = w.aws  # type: ignore[attr-defined]
    code = CLIENT + """
def main(s3):
    return refused(lambda: client("s3", s3).get_object(Bucket="b", Key="k"))
"""
    out = w.run(code, _sealed_env(w, "narrow-1"), s3=w.url(host=S3)).ok()
    assert (out["status"], out["reason"]) == (403, "not_allowed"), out
    line = w.proxy.wait_audit(lambda e: e.get("sandbox") == "narrow-1" and e.get("reason"))
    assert line["reason"] == "not_allowed"
    assert not aws.assumed and not w.fake.requests
