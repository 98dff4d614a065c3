"""Bounded decoding of a response the upstream compressed although asked not to.

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
from typing import Protocol

import zstandard

from sealgate.reasons import Reason

from ..errors import ProxyError

# Most bytes one decompress call may produce: a buffered body's whole, or what one streamed
# chunk expands to. A body that needs more is refused, not passed on unscrubbed.
DECODED_LIMIT = 32 << 20
# RFC 9659: the zstd content coding uses at most an 8 MiB window; a frame may otherwise declare
# one of gigabytes, which the decoder would allocate.
_ZSTD_WINDOW = 8 << 20
# zstd input is fed in slices this long: a block takes at least 4 bytes and decodes to at most
# 128 KiB, so one slice stands for at most 8 MiB, and the limit is checked between slices.
_ZSTD_SLICE = 256


class Undecodable(ProxyError):
    """A compressed body that cannot be scrubbed: corrupt, cut short, or decoding past
    `DECODED_LIMIT`."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail, reason=reason)


def _too_large() -> Undecodable:
    return Undecodable(Reason.DECODED_TOO_LARGE, f"decodes to more than {DECODED_LIMIT} bytes")


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
                raise Undecodable(Reason.DECODE_FAILED, str(exc)) from None
            room -= len(piece)
            if room < 0:
                raise _too_large()
            out.append(piece)
            rest = self._part.unused_data if self._part.eof else self._part.unconsumed_tail
            if rest == data and not piece:
                raise Undecodable(Reason.DECODE_FAILED, "compressed stream makes no progress")
            data = rest
        return b"".join(out)

    def flush(self) -> bytes:
        # An empty body holds nothing to find, whatever coding it claims.
        if self._seen and not self._part.eof:
            raise Undecodable(Reason.DECODE_FAILED, "compressed stream ended early")
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
                raise Undecodable(Reason.DECODE_FAILED, "compressed stream ended early")
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
                raise Undecodable(Reason.DECODE_FAILED, str(exc)) from None
            size += len(out[-1])
            if size > DECODED_LIMIT:
                raise _too_large()
            if self._frame.eof and self._frame.unused_data:
                # The next frame began inside this slice.
                data, at = self._frame.unused_data + data[at:], 0
        return b"".join(out)

    def flush(self) -> bytes:
        if self._seen and not self._frame.eof:
            raise Undecodable(Reason.DECODE_FAILED, "compressed stream ended early")
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
        raise Undecodable(Reason.ENCODING_UNSCRUBBABLE, f"cannot decode {encoding[:64]!r}")
    return decode.decompress(body) + decode.flush()


# CPython's bytes.find (3.11, Objects/stringlib/fastsearch.h) is linear, with the two-way
# algorithm, only for a haystack of 2500 bytes or more and over three times the needle's length,
# and for a needle under 100 bytes only from 30000 bytes on. Otherwise it may compare up to the
# needle's length at every position: a 99-byte needle over a 16 KiB chunk of the right bytes
# takes 270 µs instead of 1, and needle and bytes are both a sandbox's to choose. So a search
# that could be slow first looks for the needle's first _PROBE bytes (at most that many
# comparisons a position; nearly always not there, and that is all), and if they are there,
# searches a copy padded to the sizes where the search is linear.
