"""The response scrubber: whole bodies and streamed chunks, however a needle is split."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from sealgate.proxy.credentials.scrub import (
    DECODED_LIMIT,
    Scrubber,
    Undecodable,
    decode_whole,
    decoder,
)

SECRET = "sk_live_0123456789abcdef"


def test_masks_keep_the_length() -> None:
    scrubber = Scrubber([SECRET])
    body = f'{{"auth": "Bearer {SECRET}", "again": "{SECRET}"}}'.encode()
    out = scrubber.data(body)
    assert SECRET.encode() not in out
    assert len(out) == len(body)
    assert b"[REDACTED]" in out
    assert scrubber.hits == 2


def test_longest_needle_first() -> None:
    value = f"Basic {SECRET}xyz"
    scrubber = Scrubber([SECRET, value])
    assert scrubber.data(value.encode()) == ("[REDACTED]" * 4)[: len(value)].encode()


def test_short_needles_are_ignored() -> None:
    assert not Scrubber(["abc", ""])


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.binary(max_size=50),
    suffix=st.binary(max_size=50),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_streamed_equals_whole(prefix: bytes, suffix: bytes, cuts: list[int]) -> None:
    body = prefix + SECRET.encode() + suffix + SECRET.encode()
    points = sorted({min(c, len(body)) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    stream = Scrubber([SECRET]).stream()
    streamed = b"".join(b"".join(stream(c)) for c in [*[c for c in chunks if c], b""])
    assert streamed == Scrubber([SECRET]).data(body)
    assert SECRET.encode() not in streamed


NEEDLES = [SECRET, "Basic c2stbGl2ZQ==", "aaab"]
_pieces = st.one_of(
    st.binary(max_size=12),
    st.sampled_from(NEEDLES).flatmap(lambda n: st.integers(1, len(n)).map(lambda k: n[:k])).map(
        str.encode
    ),
)


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(_pieces, max_size=12), cuts=st.lists(st.integers(0, 300), max_size=10))
def test_needle_prefixes_anywhere_stream_as_whole(pieces: list[bytes], cuts: list[int]) -> None:
    """Bodies made of needles' beginnings (and whole needles), cut anywhere: the stream holds
    back only what could still become a needle, and ends equal to the whole body scrubbed."""
    body = b"".join(pieces)
    points = sorted({min(c, len(body)) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    stream = Scrubber(NEEDLES).stream()
    streamed = b"".join(b"".join(stream(c)) for c in [*[c for c in chunks if c], b""])
    assert streamed == Scrubber(NEEDLES).data(body)


@pytest.mark.parametrize(
    ("data", "held"),
    [
        (b"data: {}\n\n", 0),  # an event's closing blank line is never held
        (b"data: sk_li", 5),
        (b"xx sk_live_0123456789abcde", len(SECRET) - 1),
        (b"s", 1),
        (b"aaaa", 3),  # "aaa" could begin "aaab"
        (b"", 0),
    ],
)
def test_only_a_tail_that_could_begin_a_needle_is_held(data: bytes, held: int) -> None:
    assert Scrubber(NEEDLES).held(data) == held


def test_each_event_goes_out_with_its_chunk() -> None:
    stream = Scrubber([SECRET]).stream()
    for event in (b"data: one\n\n", b"data: two\n\n"):
        assert stream(event) == [event]
    assert stream(b"") == []


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=10))
def test_streamed_chunks_are_never_empty(body: bytes, cuts: list[int]) -> None:
    # mitmproxy sends every bytes value as a chunk; an empty one ends a chunked body early.
    points = sorted({min(c, len(body)) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    stream = Scrubber([SECRET]).stream()
    out = [piece for c in [*[c for c in chunks if c], b""] for piece in stream(c)]
    assert all(out)
    assert b"".join(out) == body


def _encode(coding: str, body: bytes) -> bytes:
    if coding == "gzip":
        return gzip.compress(body)
    if coding == "deflate":
        return zlib.compress(body)
    return zstandard.ZstdCompressor().compress(body)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "zstd", "X-GZIP"])
@settings(max_examples=25, deadline=None)
@given(noise=st.binary(min_size=0, max_size=4000), size=st.integers(1, 700))
def test_compressed_stream_is_decoded_then_scrubbed(coding: str, noise: bytes, size: int) -> None:
    body = noise + SECRET.encode() + noise[::-1] + SECRET.encode()
    encoded = _encode(coding.lower().removeprefix("x-"), body)
    decode = decoder(coding)
    assert decode is not None
    stream = Scrubber([SECRET]).stream(decode)
    chunks = [encoded[i : i + size] for i in range(0, len(encoded), size)]
    out = b"".join(piece for c in [*chunks, b""] for piece in stream(c))
    assert out == Scrubber([SECRET]).data(body)
    assert SECRET.encode() not in out


@pytest.mark.parametrize("coding", ["br", "compress", "gzip, br", "identity, gzip", "x-custom", ""])
def test_codings_that_cannot_be_decoded(coding: str) -> None:
    # br among them: brotli <= 1.1 cannot bound its output (see test_bombs_are_stopped).
    assert decoder(coding) is None
    with pytest.raises(Undecodable) as caught:
        decode_whole(coding, b"anything")
    assert caught.value.reason == "encoding_unscrubbable"


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
def test_every_member_of_a_concatenated_stream_is_decoded(coding: str) -> None:
    first, second = b"one " + SECRET.encode(), b" two " + SECRET.encode()
    encoded = _encode(coding, first) + _encode(coding, second)
    decode = decoder(coding)
    assert decode is not None
    stream = Scrubber([SECRET]).stream(decode)
    out = b"".join(piece for c in [encoded[:7], encoded[7:], b""] for piece in stream(c))
    assert out == Scrubber([SECRET]).data(first + second)
    assert decode_whole(coding, encoded) == first + second


def test_a_zstd_frame_starting_inside_a_slice_is_decoded() -> None:
    # Frames shorter than the 256-byte slices the decoder feeds: several begin in one slice.
    parts = [bytes([65 + i]) * (10 + i) for i in range(30)]
    encoded = b"".join(_encode("zstd", part) for part in parts)
    assert decode_whole("zstd", encoded) == b"".join(parts)


def test_raw_deflate_is_decoded_like_wrapped_deflate() -> None:
    body = b"raw " + SECRET.encode() + b" deflate"
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw = packer.compress(body) + packer.flush()
    decode = decoder("deflate")
    assert decode is not None
    stream = Scrubber([SECRET]).stream(decode)
    out = b"".join(piece for c in [raw[:1], raw[1:], b""] for piece in stream(c))
    assert out == Scrubber([SECRET]).data(body)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "zstd"])
def test_truncated_stream_is_an_error_at_the_end(coding: str) -> None:
    encoded = _encode(coding, SECRET.encode() * 40)
    decode = decoder(coding)
    assert decode is not None
    stream = Scrubber([SECRET]).stream(decode)
    stream(encoded[: len(encoded) // 2])
    with pytest.raises(Undecodable) as caught:
        stream(b"")
    assert caught.value.reason == "decode_failed"


@pytest.mark.parametrize("coding", ["gzip", "deflate", "zstd"])
def test_corrupt_input_is_an_error(coding: str) -> None:
    encoded = bytearray(_encode(coding, SECRET.encode() * 40))
    encoded[len(encoded) // 2 :] = b"\xff" * (len(encoded) - len(encoded) // 2)
    with pytest.raises(Undecodable) as caught:
        decode_whole(coding, bytes(encoded))
    assert caught.value.reason == "decode_failed"


@pytest.mark.parametrize("coding", ["gzip", "deflate", "zstd"])
def test_bombs_are_stopped(coding: str) -> None:
    """Kilobytes that decode to 64 MiB: refused once past DECODED_LIMIT, whole or as one
    streamed chunk. Streamed in smaller chunks, each chunk's output stays within the limit (a
    long download passes, memory stays bounded)."""
    bomb = _encode(coding, bytes(64 << 20))
    assert len(bomb) < 100_000
    for attempt in (lambda: decode_whole(coding, bomb), lambda: _stream(coding)(bomb)):
        with pytest.raises(Undecodable) as caught:
            attempt()
        assert caught.value.reason == "decoded_too_large"
    stream, total = _stream(coding), 0
    for at in range(0, len(bomb), 1024):
        out = stream(bomb[at : at + 1024])
        assert sum(map(len, out)) <= DECODED_LIMIT
        total += sum(map(len, out))
    assert total + sum(map(len, stream(b""))) == 64 << 20


def _stream(coding: str) -> Callable[[bytes], list[bytes]]:
    decode = decoder(coding)
    assert decode is not None
    return Scrubber([SECRET]).stream(decode)


def test_a_zstd_frame_asking_for_a_huge_window_is_refused() -> None:
    # A 64 MiB window (RFC 9659 allows 8 MiB for HTTP): the decoder would allocate it.
    params = zstandard.ZstdCompressionParameters.from_level(
        19, window_log=26, write_content_size=False
    )
    # Compressed as a stream of unknown size, so the frame keeps the window it was given.
    packer = zstandard.ZstdCompressor(compression_params=params).compressobj()
    encoded = packer.compress(bytes(range(256)) * 40000) + packer.flush()
    assert zstandard.get_frame_parameters(encoded).window_size == 64 << 20
    with pytest.raises(Undecodable) as caught:
        decode_whole("zstd", encoded)
    assert caught.value.reason == "decode_failed"


def test_a_body_just_inside_the_limit_is_decoded() -> None:
    body = bytes(DECODED_LIMIT)
    assert decode_whole("gzip", gzip.compress(body)) == body


@pytest.mark.parametrize("coding", ["gzip", "deflate", "zstd"])
def test_an_empty_body_in_any_coding_holds_nothing_to_find(coding: str) -> None:
    assert _stream(coding)(b"") == []
    assert decode_whole(coding, b"") == b""
