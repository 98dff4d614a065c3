"""Response scrubbing: an upstream that echoes an injected credential must not hand it to the
sandbox (debug endpoints, error pages and request-echo services all do).

The needles are the secret itself and every header value the injection produced (a Basic
credential's base64 form, say). Requests that carry an injected credential ask the upstream for
an identity encoding, so the body can be scrubbed byte for byte: whole when it was buffered, and
chunk by chunk when it streams, each chunk passed on at once but for a tail that could be the
start of a needle (server-sent events and token streams must not wait for the next chunk). The
mask has the needle's length, so the response keeps its framing.

An upstream may compress anyway. Then the body is decoded and passed on decoded, since a secret
inside compressed bytes cannot be found by searching them: whole when buffered, on the fly when
streamed. Decoding is bounded, because a small compressed body can stand for gigabytes (a
"compression bomb"): one call decodes at most `DECODED_LIMIT` bytes, and zstd frames may not ask
for a window over 8 MiB. gzip, deflate and zstd can be decoded that way. brotli cannot: the
brotli module mitmproxy 11 allows (<= 1.1) has no output limit, and a few bytes of brotli can
stand for 16 MiB; so `decoder` says None for br, as for an unknown or stacked coding, and the
caller must not pass such a body on.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from typing import Protocol

import zstandard

REDACTED = b"[REDACTED]"

# A mitmproxy stream function. It returns a list, never b"" for "nothing yet": mitmproxy sends
# each bytes value it gets as a chunk, and an empty chunk ends a chunked HTTP/1 body early.
Stream = Callable[[bytes], list[bytes]]


# Most bytes one decompress call may produce: a buffered body's whole, or what one streamed
# chunk expands to. A body that needs more is refused, not passed on unscrubbed.
DECODED_LIMIT = 32 << 20
# RFC 9659: the zstd content coding uses at most an 8 MiB window; a frame may otherwise declare
# one of gigabytes, which the decoder would allocate.
_ZSTD_WINDOW = 8 << 20
# zstd input is fed in slices this long: a block takes at least 4 bytes and decodes to at most
# 128 KiB, so one slice stands for at most 8 MiB, and the limit is checked between slices.
_ZSTD_SLICE = 256


class Undecodable(Exception):
    """A compressed body that cannot be scrubbed: corrupt, cut short, or decoding past
    `DECODED_LIMIT`. `reason` is the audit reason code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _too_large() -> Undecodable:
    return Undecodable("decoded_too_large", f"decodes to more than {DECODED_LIMIT} bytes")


class Decoder(Protocol):
    def decompress(self, data: bytes) -> bytes:
        """The decoded bytes `data` completes; raises Undecodable."""
        ...

    def flush(self) -> bytes:
        """What is left at the end; raises Undecodable if the stream ended inside a member."""
        ...


class _Zlib:
    """gzip members (or deflate streams) one after another, as mitmproxy's own decoders read
    them, each call's output bounded with zlib's max_length."""

    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._part = zlib.decompressobj(wbits)
        self._seen = False

    def decompress(self, data: bytes) -> bytes:
        self._seen = self._seen or bool(data)
        out: list[bytes] = []
        room = DECODED_LIMIT
        while data:
            if self._part.eof:
                self._part = zlib.decompressobj(self._wbits)
            try:
                piece = self._part.decompress(data, room + 1)
            except zlib.error as exc:
                raise Undecodable("decode_failed", str(exc)) from None
            room -= len(piece)
            if room < 0:
                raise _too_large()
            out.append(piece)
            rest = self._part.unused_data if self._part.eof else self._part.unconsumed_tail
            if rest == data and not piece:
                raise Undecodable("decode_failed", "compressed stream makes no progress")
            data = rest
        return b"".join(out)

    def flush(self) -> bytes:
        # An empty body holds nothing to find, whatever coding it claims.
        if self._seen and not self._part.eof:
            raise Undecodable("decode_failed", "compressed stream ended early")
        return b""


class _Deflate:
    """`deflate` is zlib-wrapped by the standard and raw in some servers' hands; which one is
    told by the first two bytes (a zlib header is a multiple of 31, method 8)."""

    def __init__(self) -> None:
        self._head = b""
        self._inner: _Zlib | None = None

    def decompress(self, data: bytes) -> bytes:
        if self._inner is None:
            self._head += data
            if len(self._head) < 2:
                return b""
            wrapped = self._head[0] & 0x0F == 8 and int.from_bytes(self._head[:2]) % 31 == 0
            self._inner = _Zlib(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            data, self._head = self._head, b""
        return self._inner.decompress(data)

    def flush(self) -> bytes:
        if self._inner is None:
            if self._head:
                raise Undecodable("decode_failed", "compressed stream ended early")
            return b""
        return self._inner.flush()


class _Zstd:
    """zstd frames one after another, fed in slices so that the output limit holds."""

    def __init__(self) -> None:
        self._frame = self._new()
        self._seen = False

    @staticmethod
    def _new() -> zstandard.ZstdDecompressionObj:
        return zstandard.ZstdDecompressor(max_window_size=_ZSTD_WINDOW).decompressobj()

    def decompress(self, data: bytes) -> bytes:
        self._seen = self._seen or bool(data)
        out: list[bytes] = []
        size = at = 0
        while at < len(data):
            if self._frame.eof:
                self._frame = self._new()
            piece, at = data[at : at + _ZSTD_SLICE], at + _ZSTD_SLICE
            try:
                out.append(self._frame.decompress(piece))
            except zstandard.ZstdError as exc:
                raise Undecodable("decode_failed", str(exc)) from None
            size += len(out[-1])
            if size > DECODED_LIMIT:
                raise _too_large()
            if self._frame.eof and self._frame.unused_data:
                # The next frame began inside this slice.
                data, at = self._frame.unused_data + data[at:], 0
        return b"".join(out)

    def flush(self) -> bytes:
        if self._seen and not self._frame.eof:
            raise Undecodable("decode_failed", "compressed stream ended early")
        return b""


def decoder(encoding: str) -> Decoder | None:
    """A bounded decoder for one content-coding; None for one that cannot be scrubbed (br, an
    unknown coding, or several stacked)."""
    match encoding.strip().lower():
        case "gzip" | "x-gzip":
            return _Zlib(zlib.MAX_WBITS | 16)
        case "deflate":
            return _Deflate()
        case "zstd":
            return _Zstd()
        case _:
            return None


def decode_whole(encoding: str, body: bytes) -> bytes:
    """A buffered body, decoded within the same bounds; raises Undecodable."""
    decode = decoder(encoding)
    if decode is None:
        raise Undecodable("encoding_unscrubbable", f"cannot decode {encoding[:64]!r}")
    return decode.decompress(body) + decode.flush()


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

    def held(self, data: bytes) -> int:
        """How many bytes at the end of `data` could be the start of a needle the next chunk
        completes: the longest suffix that is a proper prefix of a needle. Nearly always 0, so
        a stream is held back only where a secret might be split, never by a fixed amount (an
        event stream's closing blank line must go out with its event)."""
        longest = 0
        for needle in self.needles:
            first = needle[:1]
            # Only positions that could start a longer hold than found so far are tried.
            at = data.find(first, max(len(data) - len(needle) + 1, 0))
            while 0 <= at < len(data) - longest:
                if needle.startswith(data[at:]):
                    longest = len(data) - at
                    break
                at = data.find(first, at + 1)
        return longest

    def stream(self, decode: Decoder | None = None) -> Stream:
        """A mitmproxy stream function, decoding first if given a decoder. Each chunk goes out
        scrubbed at once, but for a tail that could begin a needle (`held`), which waits for
        the next chunk so that a needle split across two is still found; b"" (the end)
        flushes."""
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
            keep = self.held(data)
            carry = data[len(data) - keep :]
            return [data[: len(data) - keep]] if keep < len(data) else []

        return scrub
