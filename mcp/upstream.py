"""One tool call sent to its API: to the address the guard pinned and nothing else, TLS
verified for the tool's host, no redirect followed, the answer read up to the tool's cap; on a
connection kept for the same pinned address, host, port, scheme, TLS settings and sandbox, or
a new one (pool.py).

The request target goes out exactly as the template made it (`encoded=True`: no client
re-encoding, which could undo the percent-encoding of an argument). The answer must come
uncompressed, as asked (`Accept-Encoding: identity`): compressed bytes could not be scrubbed
before they are decoded, and decoding them unbounded is a bomb, so such an answer is refused
(`encoding_unscrubbable`), as the proxy refuses what it cannot scrub. An answer that is a slice
(206, or a `Content-Range`) to a call a credential was injected into (`whole`) is refused as the
proxy refuses one (`response_sliced`, policy/reshaping.py), its body never read: its range
headers were not sent, so one nobody listed asked for it, and a secret it echoes could be cut
where the scrubber, which finds whole secrets, would not see it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

import aiohttp
from yarl import URL

from sealgate.hostport import format_hostport
from sealgate.proxy.calls import Denial, Pin, ToolRequest, sliced
from sealgate.reasons import Reason

from .pool import Pool, PoolKey

__all__ = ["Answer", "failures", "read_capped", "send"]

_CHUNK: Final = 64 << 10
_IDENTITY: Final = frozenset({"", "identity"})


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    content_type: str


async def send(call: ToolRequest, target: str, headers: list[tuple[str, str]],
               body: bytes | None, *, pin: Pin, tls: ssl.SSLContext, pool: Pool,
               owner: tuple[str | None, str], limit: int, timeout: float,
               whole: bool) -> Answer:
    """`call` to `pin.address` with the request target, headers and body its credentials were
    written into (a query processor adds to the target), on a connection of `owner`'s (the
    sandbox, the policy) to that address; Denial for a call that fails, or an answer over
    `limit` bytes or compressed, or, when `whole` (a credential was injected), a slice. An
    answer not read to its end closes its connection."""
    default = 443 if call.scheme == "https" else 80
    authority = call.host.name if call.port == default else format_hostport(call.host.name,
                                                                            call.port)
    url = URL(f"{call.scheme}://{format_hostport(call.host.name, call.port)}{target}",
              encoded=True)
    key = PoolKey(owner[0], owner[1], call.scheme, call.host.name, call.port, str(pin.address),
                  tls if call.scheme == "https" else None)
    with failures(call.host.name, timeout):
        async with asyncio.timeout(timeout), pool.session(key) as session, session.request(
            call.method, url, headers=[("Host", authority), *headers], data=body,
            allow_redirects=False,
        ) as answer:
            coding = answer.headers.get("Content-Encoding", "").strip().lower()
            if coding not in _IDENTITY:
                raise Denial(Reason.ENCODING_UNSCRUBBABLE,
                             "the API answered compressed although asked not to")
            if whole and (denial := sliced(answer.status,
                                           "Content-Range" in answer.headers)) is not None:
                raise denial
            data = await read_capped(answer, limit)
            return Answer(answer.status, data, answer.headers.get("Content-Type", ""))


async def read_capped(answer: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole answer, or Denial past `limit` bytes (its connection then closed)."""
    data = bytearray()
    async for chunk in answer.content.iter_chunked(_CHUNK):
        data += chunk
        if len(data) > limit:
            raise Denial(Reason.RESPONSE_TOO_LARGE, f"the answer is over its {limit} bytes")
    return bytes(data)


@contextmanager
def failures(host: str, timeout: float) -> Iterator[None]:
    """What went wrong on the way to `host`, as the Denial the agent reads (never an address
    or a certificate's details)."""
    try:
        yield
    except TimeoutError:
        raise Denial(Reason.UPSTREAM_TIMEOUT, f"{host} did not answer within {timeout:g} s"
                     ) from None
    except aiohttp.ClientConnectorCertificateError:
        raise Denial(Reason.UPSTREAM_TLS_FAILED, f"{host}'s certificate did not verify") from None
    except (aiohttp.ClientConnectorSSLError, ssl.SSLError):
        raise Denial(Reason.UPSTREAM_TLS_FAILED, f"TLS with {host} failed") from None
    except aiohttp.ClientConnectorError:
        raise Denial(Reason.CONNECT_FAILED, f"{host} could not be connected to") from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        # ValueError: aiohttp's "Line is too long" of a stream read by lines.
        raise Denial(Reason.UPSTREAM_RESET,
                     f"the call to {host} failed ({type(exc).__name__})") from None
