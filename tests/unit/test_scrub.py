"""The response scrubber: whole bodies and streamed chunks, however a needle is split."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.scrub import Scrubber

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
    streamed = b"".join(stream(c) for c in chunks if c) + stream(b"")
    assert streamed == Scrubber([SECRET]).data(body)
    assert SECRET.encode() not in streamed
