"""STS AssumeRole for aws-sigv4 secrets that name a role (proxy/credentials/awsroles.py), and
the role fields of the secret (issuer/awskeys.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sealgate.credentials import awskeys
from sealgate.credentials.processors import AwsSigV4Processor, SecretInvalid
from sealgate.proxy.credentials import awsroles
from sealgate.proxy.credentials.awsroles import RoleSessions
from sealgate.proxy.credentials.exchanged import ExchangeError
from sealgate.proxy.net.guard import Guard
from sealgate.proxy.net.resolver import Resolver
from sealgate.proxy.policy.model import Policy
from sealgate.proxy.policy.rulesfile import load_rules
from tests.dnsstub import StubDNS

BASE = {"access_key_id": "AKIAROLEBASEUNIT0001", "secret_access_key": "base/SECRET"}
ROLE = {**BASE, "role_arn": "arn:aws:iam::123456789012:role/ci", "external_id": "ext-1"}
TEMP = json.dumps({"access_key_id": "ASIATEMPUNIT00000001", "secret_access_key": "t/S",
                   "session_token": "tok"})  # as STS's answer below reads


@pytest.fixture
def guarded(tmp_path: Path, dns: StubDNS) -> tuple[Guard, Policy]:
    """A real guard on the tests' stub DNS, and a policy opening loopback only."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\npolicies:\n  p:\n    allow:\n      - host: s3.amazonaws.com\n"
                     "    allow_networks: [127.0.0.1/32]\n")
    host, port = dns.address
    return Guard(Resolver.from_spec(f"{host}:{port}")), load_rules(rules).policies["p"]


def _resolve(sessions: RoleSessions, secret: str, guarded: tuple[Guard, Policy]) -> str:
    async def once() -> str:
        try:
            return await sessions.resolve(secret, *guarded)
        finally:
            await sessions.close()

    return asyncio.run(once())


def test_keys_without_a_role_are_used_as_they_are(guarded: tuple[Guard, Policy]) -> None:
    assert _resolve(RoleSessions(), json.dumps(BASE), guarded) == json.dumps(BASE)


def test_sts_answers_are_read_for_keys_or_an_error_code() -> None:
    ok = (b"<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>ASIATEMPUNIT00000001"
          b"</AccessKeyId><SecretAccessKey>t/S</SecretAccessKey><SessionToken>tok</SessionToken>"
          b"<Expiration>2030-01-01T00:00:00Z</Expiration></Credentials></AssumeRoleResult>"
          b"</AssumeRoleResponse>")
    secret, expires = awsroles._keys(200, ok, 1_000_000.0)
    assert json.loads(secret) == json.loads(TEMP) and expires > 1_000_000
    with pytest.raises(ExchangeError, match="answered 403 AccessDenied"):
        awsroles._keys(403, b"<Error><Code>AccessDenied</Code><Message>m</Message></Error>", 0)
    with pytest.raises(ExchangeError, match="no usable keys"):
        awsroles._keys(200, b"<x>not keys</x>", 0)
    with pytest.raises(ExchangeError, match="expired already"):
        awsroles._keys(200, ok, 2e9)


def test_an_unreachable_sts_is_an_error_naming_no_value(guarded: tuple[Guard, Policy]) -> None:
    secret = json.dumps({**ROLE, "sts_endpoint": "https://127.0.0.1:9"})
    with pytest.raises(ExchangeError, match=r"STS AssumeRole at 127\.0\.0\.1 failed") as raised:
        _resolve(RoleSessions(), secret, guarded)
    assert "base/SECRET" not in str(raised.value) and "ext-1" not in str(raised.value)


@pytest.mark.parametrize(("answer", "why"), [("A 10.9.9.9", "private"),
                                             ("A 169.254.169.254", "metadata")])
def test_sts_is_dialed_through_the_guard(guarded: tuple[Guard, Policy], dns: StubDNS,
                                         answer: str, why: str) -> None:
    """A name that resolves to an address the policy does not open is never dialed."""
    dns.set("sts.internal.test", answer)
    secret = json.dumps({**ROLE, "sts_endpoint": "https://sts.internal.test"})
    with pytest.raises(ExchangeError, match=rf"sts.internal.test is refused \({why}\)"):
        _resolve(RoleSessions(), secret, guarded)


@pytest.mark.parametrize(("extra", "message"), [
    ({"role_arn": "arn:aws:iam::123:role/x"}, "role_arn"),
    ({"sts_endpoint": "http://sts.amazonaws.com"}, "sts_endpoint"),
    ({"sts_endpoint": "https://sts.amazonaws.com/x?y"}, "sts_endpoint"),
    ({"duration_seconds": 60}, "duration_seconds"),
    ({"duration_seconds": "3600"}, "duration_seconds"),
    ({"external_id": "x"}, "external_id"),
])
def test_role_fields_are_checked(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        awskeys.parse(json.dumps({**ROLE, **extra}))


def test_role_fields_need_a_role() -> None:
    with pytest.raises(ValueError, match="need role_arn"):
        awskeys.parse(json.dumps({**BASE, "external_id": "ext-1"}))


def test_a_sealed_token_may_name_a_role() -> None:
    """Sealed as brokered: the proxy dials the token's STS endpoint only where the sandbox's
    policy allows a POST to it (tests/integration/test_aws_roles.py)."""
    processor = AwsSigV4Processor(services="s3", regions="us-east-1")
    processor.check_secret(json.dumps(BASE))
    processor.check_secret(json.dumps(ROLE))
    with pytest.raises(SecretInvalid, match="role_arn"):
        processor.check_secret(json.dumps({**ROLE, "role_arn": "not an arn"}))
