"""Temporary AWS keys the proxy obtains itself: STS AssumeRole with the keys of a brokered
`aws-sigv4` secret that names a role (`sealgate.credentials.awskeys.AssumeRole`).

The role's keys are cached as every credential the proxy obtains is (`credentials.exchanged`):
asked for again in their last 5 minutes, one call per role at a time however many requests wait
for it, at most 5 s of waiting, keys that have not expired still used while a refresh fails, a
failed call not repeated for 5 s. With none left, the request fails closed (503
`secret_unavailable`). STS is dialed as sandbox traffic is (`credentials.dial`: through the
guard under the policy of the request that needs the keys), so keys are cached per policy's
networks. The endpoint comes from the secret: the operator's, or a sealed token's, which the
broker first puts to the policy decision as a POST the sandbox would make (`Broker.sealed`). No
error raised here quotes a key or a token; STS's answer is read for its error code only.
"""

from __future__ import annotations

import hashlib
import re
import ssl
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Final
from urllib.parse import urlencode, urlsplit

from sealgate.credentials import awskeys, sigv4
from sealgate.credentials.awskeys import AwsKeys

from ..net.guard import Guard
from ..policy.model import Policy
from . import dial
from .exchanged import Exchanged, ExchangeError, Obtained

__all__ = ["RoleSessions"]

_FORM: Final = "application/x-www-form-urlencoded; charset=utf-8"
_SOURCE: Final = "sts"  # the keys obtained are the role's; the base keys are in the cache key
# The few leaf elements read from STS's XML: by pattern, not with an XML parser (no entities,
# no nesting to walk); a value with markup or an entity in it is not a value.
_ELEMENT: Final = re.compile(
    rb"<(Code|AccessKeyId|SecretAccessKey|SessionToken|Expiration)>([^<&]{1,4096})</\1>"
)


class RoleSessions:
    def __init__(self, *, cafile: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cafile = cafile
        self.clock = clock
        # By the base keys and the networks of the policy they were dialed under.
        self.cache: Exchanged[tuple[AwsKeys, tuple[object, ...]]] = Exchanged(clock=clock)
        self._ssl = ssl.create_default_context(cafile=cafile)
        self.outcomes: Counter[str] = Counter()  # AssumeRole calls: obtained, failed

    async def resolve(self, secret: str, guard: Guard | None, policy: Policy | None) -> str:
        """The keys to sign with: `secret` itself, or, when it names a role, the role's
        (in the same JSON form), STS dialed through `guard` under `policy`. Raises ValueError
        for a secret that is not keys, ExchangeError when the role's keys cannot be had."""
        base = awskeys.parse(secret)
        if base.role is None:
            return secret
        if guard is None or policy is None:
            raise ExchangeError("assuming a role needs the guard to dial STS")
        key = (base, policy.allow_networks)
        held = self.cache.fresh(key, _SOURCE)
        if held is not None:
            return held
        return await self.cache.get(key, _SOURCE, lambda: self._assume(base, guard, policy))

    async def _assume(self, base: AwsKeys, guard: Guard, policy: Policy) -> Obtained:
        role = base.role
        assert role is not None
        form = {"Action": "AssumeRole", "Version": "2011-06-15", "RoleArn": role.role_arn,
                "RoleSessionName": role.role_session_name,
                "DurationSeconds": str(role.duration_seconds)}
        if role.external_id is not None:
            form["ExternalId"] = role.external_id
        body = urlencode(form).encode()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        headers = {"host": urlsplit(role.sts_endpoint).netloc, "content-type": _FORM,
                   "x-amz-date": stamp}
        if base.session_token is not None:
            headers["x-amz-security-token"] = base.session_token
        scope = sigv4.Scope(base.access_key_id, stamp[:8], role.sts_region, "sts")
        canonical = sigv4.canonical_request(
            "POST", "/", [], {k: [v] for k, v in headers.items()},
            hashlib.sha256(body).hexdigest(), s3=False,
        )
        signature = sigv4.signature(base.secret_access_key, stamp, scope, canonical)
        headers["authorization"] = sigv4.authorization(
            scope.credential(base.access_key_id), sorted(headers), signature
        )
        try:
            status, text = await dial.post(
                dial.endpoint(role.sts_endpoint.rstrip("/") + "/"), headers, body,
                guard=guard, policy=policy, tls=self._ssl, what="STS AssumeRole at")
            secret, expires = _keys(status, text, self.clock())
        except ExchangeError:
            self.outcomes["failed"] += 1
            raise
        self.outcomes["obtained"] += 1
        return Obtained(secret, expires, _SOURCE)

    async def close(self) -> None:
        await self.cache.close()


def _keys(status: int, text: bytes, now: float) -> tuple[str, float]:
    """The role's keys as an aws-sigv4 secret, and when they expire, from STS's XML."""
    found = {name.decode(): value.decode("ascii", "replace").strip()
             for name, value in _ELEMENT.findall(text)}
    if status != 200:
        code = found.get("Code", "")
        named = code if code.isalnum() and len(code) <= 64 else "an error"
        raise ExchangeError(f"STS AssumeRole answered {status} {named}")
    try:
        keys = AwsKeys(found["AccessKeyId"], found["SecretAccessKey"], found["SessionToken"])
        expires = datetime.fromisoformat(found["Expiration"].replace("Z", "+00:00")).timestamp()
        awskeys.parse(secret := keys.to_json())
    except (KeyError, ValueError):
        raise ExchangeError("STS AssumeRole's answer holds no usable keys") from None
    if expires <= now:
        raise ExchangeError("STS AssumeRole's keys have expired already")
    return secret, expires
