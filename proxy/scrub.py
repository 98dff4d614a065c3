"""Response scrubbing: an upstream that echoes an injected credential must not hand it to the
sandbox (debug endpoints, error pages and request-echo services all do).

The needles are the secret itself and every header value the injection produced (a Basic
credential's base64 form, say). Requests that carry an injected credential ask the upstream for
an identity encoding, so the body can be scrubbed byte for byte: whole when it was buffered, and
chunk by chunk, with a carry-over of one needle's length, when it streams. The mask has the
needle's length, so the response keeps its framing.

An upstream may compress anyway. A buffered body is decoded, scrubbed and encoded again by the
caller; a streamed one is decoded on the fly here (gzip, deflate, br, zstd) and passed on
decoded, since a secret inside compressed bytes cannot be found by searching them. Any other
coding cannot be scrubbed, and `decoder` says so with None: the caller must not pass it on.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from typing import Protocol

import brotli
import zstandard

REDACTED = b"[REDACTED]"

# A mitmproxy stream function. It returns a list, never b"" for "nothing yet": mitmproxy sends
# each bytes value it gets as a chunk, and an empty chunk ends a chunked HTTP/1 body early.
Stream = Callable[[bytes], list[bytes]]


class Decoder(Protocol):
    def decompress(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes:
        """What is left at the end; raises if the stream ended inside a member."""
        ...


class _Part(Protocol):  # zlib's and zstandard's decompress objects
    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class _Members:
    """A stream of concatenated members (gzip members, zstd frames), each decoded by a fresh
    object, as mitmproxy's own decoders read them."""

    def __init__(self, new: Callable[[], _Part]) -> None:
        self._new = new
        self._part = new()

    def decompress(self, data: bytes) -> bytes:
        out = [self._part.decompress(data)]
        while self._part.eof and (rest := self._part.unused_data):
            self._part = self._new()
            out.append(self._part.decompress(rest))
        return b"".join(out)

    def flush(self) -> bytes:
        tail = self._part.flush()
        if not self._part.eof:
            raise zlib.error("compressed stream ended early")
        return tail


class _Deflate:
    """`deflate` is zlib-wrapped by the standard and raw in some servers' hands; which one is
    told by the first two bytes (a zlib header is a multiple of 31, method 8)."""

    def __init__(self) -> None:
        self._head = b""
        self._inner: _Members | None = None

    def decompress(self, data: bytes) -> bytes:
        if self._inner is None:
            self._head += data
            if len(self._head) < 2:
                return b""
            wrapped = self._head[0] & 0x0F == 8 and int.from_bytes(self._head[:2]) % 31 == 0
            wbits = zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS
            self._inner = _Members(lambda: zlib.decompressobj(wbits))
            data, self._head = self._head, b""
        return self._inner.decompress(data)

    def flush(self) -> bytes:
        if self._inner is None:
            raise zlib.error("compressed stream ended early")
        return self._inner.flush()


class _Brotli:
    def __init__(self) -> None:
        self._decompressor = brotli.Decompressor()

    def decompress(self, data: bytes) -> bytes:
        return bytes(self._decompressor.process(data))

    def flush(self) -> bytes:
        if not self._decompressor.is_finished():
            raise brotli.error("brotli stream ended early")
        return b""


def decoder(encoding: str) -> Decoder | None:
    """A streaming decoder for one content-coding; None for one that cannot be scrubbed (an
    unknown coding, or several stacked)."""
    match encoding.strip().lower():
        case "gzip" | "x-gzip":
            return _Members(lambda: zlib.decompressobj(zlib.MAX_WBITS | 16))
        case "deflate":
            return _Deflate()
        case "br":
            return _Brotli()
        case "zstd":
            return _Members(lambda: zstandard.ZstdDecompressor().decompressobj())
        case _:
            return None


def _mask(needle: bytes) -> bytes:
    # As long as what it replaces: Content-Length and offsets stay true, so scrubbing never
    # has to re-frame a response.
    return (REDACTED * (len(needle) // len(REDACTED) + 1))[: len(needle)]


class Scrubber:
    def __init__(self, needles: Iterable[str]) -> None:
        # Longest first, so a header value containing the secret is replaced as a whole.
        unique = {n.encode() for n in needles if len(n) >= 4}
        self.needles = sorted(unique, key=len, reverse=True)
        self.hits = 0

    def __bool__(self) -> bool:
        return bool(self.needles)

    def fields(
        self, fields: tuple[tuple[bytes, bytes], ...]
    ) -> tuple[tuple[bytes, bytes], ...]:
        """Header fields with every value scrubbed; the same tuple when nothing was echoed."""
        # One search over all values first: nearly always there is nothing to replace.
        joined = b"\n".join(value for _, value in fields)
        if not any(needle in joined for needle in self.needles):
            return fields
        return tuple((name, self.data(value)) for name, value in fields)

    def data(self, data: bytes) -> bytes:
        for needle in self.needles:
            if needle in data:
                self.hits += data.count(needle)
                data = data.replace(needle, _mask(needle))
        return data

    def stream(self, decode: Decoder | None = None) -> Stream:
        """A mitmproxy stream function, decoding first if given a decoder. It holds back the
        last (longest needle - 1) bytes of each chunk, so a needle split across two chunks is
        still found; b"" (the end) flushes."""
        keep = max(len(n) for n in self.needles) - 1
        carry = b""

        def scrub(chunk: bytes) -> list[bytes]:
            nonlocal carry
            if not chunk:
                tail = decode.flush() if decode is not None else b""
                out, carry = self.data(carry + tail), b""
                return [out] if out else []
            if decode is not None:
                chunk = decode.decompress(chunk)
            data = self.data(carry + chunk)
            if len(data) <= keep:
                carry = data
                return []
            carry = data[len(data) - keep :] if keep else b""
            return [data[: len(data) - keep] if keep else data]

        return scrub
