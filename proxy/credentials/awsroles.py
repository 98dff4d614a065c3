"""Temporary AWS keys the proxy obtains itself: STS AssumeRole with the keys of a brokered
`aws-sigv4` secret that names a role (`issuer.awskeys.AssumeRole`).

The role's keys are cached until 5 minutes before they expire, and asked for again from then
on, one call per role at a time however many requests wait for it; while a refresh fails, keys
that have not expired yet are still used. With none left, the request fails closed (503
`secret_unavailable`). The STS endpoint comes from the secret, which only the operator writes
(sealed tokens may not name a role: `issuer.processors.check_secret`), and is dialed as a Vault
store is, with verified TLS (against `--upstream-ca` when given), never through a sandbox's
policy. No error raised here quotes a key or a token; STS's answer is read for its error code
only.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import ssl
import time
from collections.abc import Callable
from datetime import datetime
from typing import Final
from urllib.parse import urlencode, urlsplit

import aiohttp

from sealgate.issuer import awskeys, sigv4
from sealgate.issuer.awskeys import AwsKeys

__all__ = ["RoleError", "RoleSessions"]

REFRESH_BEFORE: Final = 300.0  # seconds before expiry a role's keys are asked for again
TIMEOUT: Final = 10.0
MAX_ANSWER: Final = 64 << 10
_FORM: Final = "application/x-www-form-urlencoded; charset=utf-8"
# The few leaf elements read from STS's XML: by pattern, not with an XML parser (no entities,
# no nesting to walk); a value with markup or an entity in it is not a value.
_ELEMENT: Final = re.compile(
    rb"<(Code|AccessKeyId|SecretAccessKey|SessionToken|Expiration)>([^<&]{1,4096})</\1>"
)


class RoleError(Exception):
    """STS did not give the role's keys; the message names the failure, no value."""


class RoleSessions:
    def __init__(self, *, cafile: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cafile = cafile
        self.clock = clock
        self._held: dict[AwsKeys, tuple[str, float]] = {}  # base keys -> (role's keys, expiry)
        self._asking: dict[AwsKeys, asyncio.Future[tuple[str, float]]] = {}
        self._http: aiohttp.ClientSession | None = None
        self.calls = 0  # AssumeRole calls made, for tests and the curious

    async def resolve(self, secret: str) -> str:
        """The keys to sign with: `secret` itself, or, when it names a role, the role's
        (in the same JSON form). Raises ValueError for a secret that is not keys, RoleError."""
        base = awskeys.parse(secret)
        if base.role is None:
            return secret
        now = self.clock()
        held = self._held.get(base)
        if held is not None and now < held[1] - REFRESH_BEFORE:
            return held[0]
        try:
            return (await self._ask(base))[0]
        except RoleError:
            if held is not None and now < held[1]:
                return held[0]
            raise

    async def _ask(self, base: AwsKeys) -> tuple[str, float]:
        asking = self._asking.get(base)
        if asking is None:
            asking = self._asking[base] = asyncio.ensure_future(self._assume(base))
            asking.add_done_callback(lambda _: self._asking.pop(base, None))
        # Shielded: one waiting request that is cancelled must not cancel the call for all.
        found = await asyncio.shield(asking)
        self._held[base] = found
        return found

    async def _assume(self, base: AwsKeys) -> tuple[str, float]:
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
        self.calls += 1
        try:
            async with self._client().post(role.sts_endpoint.rstrip("/") + "/", data=body,
                                           headers=headers) as answer:
                status, text = answer.status, await answer.content.read(MAX_ANSWER)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise RoleError(f"STS AssumeRole failed: {type(exc).__name__}") from None
        return _keys(status, text, self.clock())

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            context = ssl.create_default_context(cafile=self.cafile)
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT),
                connector=aiohttp.TCPConnector(ssl=context),
            )
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


def _keys(status: int, text: bytes, now: float) -> tuple[str, float]:
    """The role's keys as an aws-sigv4 secret, and when they expire, from STS's XML."""
    found = {name.decode(): value.decode("ascii", "replace").strip()
             for name, value in _ELEMENT.findall(text)}
    if status != 200:
        code = found.get("Code", "")
        named = code if code.isalnum() and len(code) <= 64 else "an error"
        raise RoleError(f"STS AssumeRole answered {status} {named}")
    try:
        keys = AwsKeys(found["AccessKeyId"], found["SecretAccessKey"], found["SessionToken"])
        expires = datetime.fromisoformat(found["Expiration"].replace("Z", "+00:00")).timestamp()
        awskeys.parse(secret := keys.to_json())
    except (KeyError, ValueError):
        raise RoleError("STS AssumeRole's answer holds no usable keys") from None
    if expires <= now:
        raise RoleError("STS AssumeRole's keys have expired already")
    return secret, expires
