"""STS AssumeRole for aws-sigv4 secrets that name a role (proxy/credentials/awsroles.py), and
the role fields of the secret (issuer/awskeys.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from sealgate.issuer import awskeys
from sealgate.issuer.processors import AwsSigV4Processor, SecretInvalid, check_secret
from sealgate.proxy.credentials import awsroles
from sealgate.proxy.credentials.awsroles import RoleError, RoleSessions

BASE = {"access_key_id": "AKIAROLEBASEUNIT0001", "secret_access_key": "base/SECRET"}
ROLE = {**BASE, "role_arn": "arn:aws:iam::123456789012:role/ci", "external_id": "ext-1"}
TEMP = json.dumps({"access_key_id": "ASIATEMPUNIT00000001", "secret_access_key": "t/S",
                   "session_token": "tok"})


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _sessions(answers: list[tuple[str, float] | Exception], clock: Clock,
              delay: float = 0.0) -> tuple[RoleSessions, list[int]]:
    sessions = RoleSessions(clock=clock)
    calls: list[int] = []

    async def assume(base: awskeys.AwsKeys) -> tuple[str, float]:
        calls.append(1)
        await asyncio.sleep(delay)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sessions._assume = assume  # type: ignore[method-assign]
    return sessions, calls


def test_keys_without_a_role_are_used_as_they_are() -> None:
    sessions, calls = _sessions([], Clock())
    assert asyncio.run(sessions.resolve(json.dumps(BASE))) == json.dumps(BASE)
    assert not calls


def test_one_call_for_many_waiting_requests_then_cached_until_before_expiry() -> None:
    clock = Clock()
    sessions, calls = _sessions([(TEMP, clock.now + 3600), (TEMP, clock.now + 7200)], clock,
                                delay=0.01)

    async def many() -> list[str]:
        return await asyncio.gather(*(sessions.resolve(json.dumps(ROLE)) for _ in range(20)))

    assert asyncio.run(many()) == [TEMP] * 20
    assert len(calls) == 1
    clock.now += 3600 - awsroles.REFRESH_BEFORE - 1
    asyncio.run(sessions.resolve(json.dumps(ROLE)))
    assert len(calls) == 1
    clock.now += 2  # inside the last 5 minutes: asked again
    asyncio.run(sessions.resolve(json.dumps(ROLE)))
    assert len(calls) == 2


def test_a_failed_refresh_uses_keys_not_yet_expired_then_fails_closed() -> None:
    clock = Clock()
    sessions, calls = _sessions(
        [(TEMP, clock.now + 400), RoleError("down"), RoleError("down")], clock)
    asyncio.run(sessions.resolve(json.dumps(ROLE)))
    clock.now += 200
    assert asyncio.run(sessions.resolve(json.dumps(ROLE))) == TEMP  # refresh failed, still valid
    clock.now += 300
    with pytest.raises(RoleError):
        asyncio.run(sessions.resolve(json.dumps(ROLE)))
    assert len(calls) == 3


def test_sts_answers_are_read_for_keys_or_an_error_code() -> None:
    ok = (b"<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>ASIATEMPUNIT00000001"
          b"</AccessKeyId><SecretAccessKey>t/S</SecretAccessKey><SessionToken>tok</SessionToken>"
          b"<Expiration>2030-01-01T00:00:00Z</Expiration></Credentials></AssumeRoleResult>"
          b"</AssumeRoleResponse>")
    secret, expires = awsroles._keys(200, ok, 1_000_000.0)
    assert json.loads(secret) == json.loads(TEMP) and expires > 1_000_000
    with pytest.raises(RoleError, match="answered 403 AccessDenied"):
        awsroles._keys(403, b"<Error><Code>AccessDenied</Code><Message>m</Message></Error>", 0)
    with pytest.raises(RoleError, match="no usable keys"):
        awsroles._keys(200, b"<x>not keys</x>", 0)
    with pytest.raises(RoleError, match="expired already"):
        awsroles._keys(200, ok, 2e9)


def test_an_unreachable_sts_is_a_role_error_naming_no_value() -> None:
    sessions = RoleSessions()
    secret = json.dumps({**ROLE, "sts_endpoint": "https://127.0.0.1:9"})

    async def once() -> None:
        try:
            await sessions.resolve(secret)
        finally:
            await sessions.close()

    with pytest.raises(RoleError) as raised:
        asyncio.run(once())
    assert "base/SECRET" not in str(raised.value) and "ext-1" not in str(raised.value)


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


def test_a_sealed_token_may_not_name_a_role() -> None:
    """Assuming dials the secret's STS endpoint: a token anyone can mint must not choose it."""
    processor = AwsSigV4Processor(services="s3", regions="us-east-1")
    check_secret(processor, json.dumps(BASE))
    with pytest.raises(SecretInvalid, match="only from a secret store"):
        check_secret(processor, json.dumps(ROLE))
