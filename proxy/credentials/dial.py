"""The calls the proxy makes itself for a credential: a token endpoint (`credentials.exchanges`),
STS (`credentials.awsroles`).

Dialed as sandbox traffic is: the endpoint's name resolved and every answer checked by the guard
under the policy of the request that needs the credential (an internal address only where that
policy's allow_networks opens it, metadata never), the checked address dialed, TLS verified for
the name (against `--upstream-ca` when given), no redirects followed, the answer read up to
`MAX_ANSWER`. Errors name the endpoint's host and the failure's class, never a value.
"""

from __future__ import annotations

import socket
import ssl
from typing import Final, NamedTuple
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from sealgate.hostname import Host, HostError, split_authority

from ..errors import Denial
from ..net.guard import Guard
from ..policy.model import Policy
from .exchanged import ExchangeError

__all__ = ["MAX_ANSWER", "TIMEOUT", "Endpoint", "Pinned", "endpoint", "post"]

TIMEOUT: Final = 10.0
MAX_ANSWER: Final = 64 << 10


class Endpoint(NamedTuple):
    """Where a credential is asked for: the URL and its host, port and path (with query)."""

    url: str
    host: Host
    port: int
    path: str


def endpoint(url: str) -> Endpoint:
    """`url` (an https URL its processor or secret checked) as an Endpoint; ExchangeError for a
    host no policy could name."""
    parts = urlsplit(url)
    try:
        host, port = split_authority(parts.netloc, 443)
    except HostError:
        raise ExchangeError("the endpoint's host is malformed") from None
    return Endpoint(url, host, port, (parts.path or "/") + (f"?{parts.query}" * bool(parts.query)))


class Pinned(AbstractResolver):
    """aiohttp's resolver for one dial: the address the guard checked, and nothing else."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        v6 = ":" in self.address
        return [ResolveResult(hostname=host, host=self.address, port=port,
                              family=socket.AF_INET6 if v6 else socket.AF_INET, proto=0,
                              flags=socket.AI_NUMERICHOST)]

    async def close(self) -> None:
        return None


async def post(target: Endpoint, headers: dict[str, str], body: bytes, *, guard: Guard,
               policy: Policy, tls: ssl.SSLContext, what: str) -> tuple[int, bytes]:
    """POST `body` to `target`; the status and at most MAX_ANSWER bytes of the answer.
    ExchangeError when the guard refuses the endpoint or the call fails (`what` names it)."""
    try:
        pin = await guard.pin(target.host, target.port, policy)
    except Denial as exc:
        raise ExchangeError(f"{what} {target.host.name} is refused ({exc.reason})") from None
    connector = aiohttp.TCPConnector(ssl=tls, resolver=Pinned(str(pin.address)),
                                     force_close=True, use_dns_cache=False)
    try:
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT),
            headers={"User-Agent": "sealgate"},
        ) as session, session.post(target.url, data=body, headers=headers,
                                   allow_redirects=False) as answer:
            return answer.status, await answer.content.read(MAX_ANSWER)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise ExchangeError(f"{what} {target.host.name} failed: {type(exc).__name__}") from None
