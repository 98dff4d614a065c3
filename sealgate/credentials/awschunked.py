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
as it streams (`Resigner`: one chunk held at a time), never buffered whole; trailers
(`...-PAYLOAD-TRAILER`) and ECDSA (SigV4a) are not read here.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Final

from sealgate.reasons import Reason

from .errors import CredentialError
from .sigv4 import EMPTY_SHA256, Scope

__all__ = ["ALGORITHM", "ChunkError", "Resigner"]

ALGORITHM: Final = "AWS4-HMAC-SHA256-PAYLOAD"
_HEAD: Final = re.compile(rb"([0-9a-fA-F]{1,16});chunk-signature=[0-9a-f]{64}\r\n")


class ChunkError(CredentialError):
    """A body that is not aws-chunked with a signature per chunk, as the header said."""

    reason = Reason.REQUEST_INAPPLICABLE  # as `awsresign` refuses the request


class Resigner:
    """Re-signs an aws-chunked body as it passes: `feed` takes the bytes as they come and
    returns the re-signed chunks complete so far (b"" at the end, for a check that the body
    ended with its final chunk). b"" is only ever the end, as in mitmproxy's stream functions:
    the proxy drops the empty pieces an HTTP/2 client may send mid-body before they get here
    (`proxy.engine.framing.no_empty_chunks`). At most one chunk is held, bounded by `max_chunk`."""

    def __init__(self, seed: str, key: bytes, amz_date: str, scope: Scope, *,
                 max_chunk: int = 16 << 20) -> None:
        self._prefix = f"{ALGORITHM}\n{amz_date}\n{scope.text}\n"
        self._previous = seed
        self._key = key
        self._max = max_chunk
        self._held = bytearray()
        self._seen = 0  # bytes of the body before what is held
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """Raises ChunkError for a body that is not what its header said."""
        if self.done and data:
            raise ChunkError("the aws-chunked body goes on after its final chunk")
        self._held += data
        out: list[bytes] = []
        while not self.done:
            head = _HEAD.match(self._held)
            if head is None:
                if len(self._held) > 100 or (self._held and b"\n" in self._held):
                    raise ChunkError(f"the aws-chunked body has no chunk header at byte "
                                     f"{self._seen}")
                break
            size = int(head.group(1), 16)
            if size > self._max:
                raise ChunkError(f"an aws-chunked chunk of {size} bytes (at most {self._max})")
            start, end = head.end(), head.end() + size
            if len(self._held) < end + 2:
                break
            if self._held[end:end + 2] != b"\r\n":
                raise ChunkError(f"the aws-chunked body's chunk at byte {self._seen} is not "
                                 f"{size} bytes")
            chunk = bytes(self._held[start:end])
            text = (f"{self._prefix}{self._previous}\n{EMPTY_SHA256}\n"
                    f"{hashlib.sha256(chunk).hexdigest()}")
            self._previous = hmac.digest(self._key, text.encode(), "sha256").hex()
            out += [head.group(1), b";chunk-signature=", self._previous.encode(), b"\r\n",
                    chunk, b"\r\n"]
            del self._held[:end + 2]
            self._seen += end + 2
            self.done = size == 0
        if not data and not self.done:
            raise ChunkError("the aws-chunked body ended before its final chunk")
        if self.done and self._held:
            raise ChunkError("the aws-chunked body goes on after its final chunk")
        return b"".join(out)

