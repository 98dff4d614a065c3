"""An `aws-chunked` body signed chunk by chunk (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD`), signed
again: each chunk's signature chains on the one before it, starting from the request's own
(the seed), so a re-signed request needs every chunk re-signed with the new keys.

    <size, hex>;chunk-signature=<64 hex>CRLF<size bytes>CRLF
    ...
    0;chunk-signature=<64 hex>CRLF CRLF

A chunk's string to sign (AWS: "Transferring payload in multiple chunks"):
`AWS4-HMAC-SHA256-PAYLOAD`, X-Amz-Date, the scope, the previous signature, the SHA-256 of the
empty string and the SHA-256 of the chunk's data, one per line. Signatures are 64 characters
before and after, so the body keeps its length and its Content-Length. The body is re-signed
whole, once it is buffered (bounded by the request budget); trailers
(`...-PAYLOAD-TRAILER`) and ECDSA (SigV4a) are not read here.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Final

from sealgate.issuer.sigv4 import EMPTY_SHA256, Scope

__all__ = ["ALGORITHM", "ChunkError", "resign"]

ALGORITHM: Final = "AWS4-HMAC-SHA256-PAYLOAD"
_HEAD: Final = re.compile(rb"([0-9a-fA-F]{1,16});chunk-signature=[0-9a-f]{64}\r\n")


class ChunkError(ValueError):
    """A body that is not aws-chunked with a signature per chunk, as the header said."""


def resign(body: bytes, seed: str, key: bytes, amz_date: str, scope: Scope) -> bytes:
    """`body` with every chunk signed again with `key` (the signing key of `scope`), from
    `seed` (the request's new signature)."""
    prefix = f"{ALGORITHM}\n{amz_date}\n{scope.text}\n"
    out: list[bytes] = []
    previous, at = seed, 0
    while True:
        head = _HEAD.match(body, at)
        if head is None:
            raise ChunkError(f"the aws-chunked body has no chunk header at byte {at}")
        size = int(head.group(1), 16)
        start = head.end()
        end = start + size
        if body[end:end + 2] != b"\r\n":
            raise ChunkError(f"the aws-chunked body's chunk at byte {at} is not {size} bytes")
        data = body[start:end]
        text = f"{prefix}{previous}\n{EMPTY_SHA256}\n{hashlib.sha256(data).hexdigest()}"
        previous = hmac.digest(key, text.encode(), "sha256").hex()
        out += [head.group(1), b";chunk-signature=", previous.encode(), b"\r\n", data, b"\r\n"]
        at = end + 2
        if not size:
            break
    if at != len(body):
        raise ChunkError("the aws-chunked body goes on after its final chunk")
    return b"".join(out)
