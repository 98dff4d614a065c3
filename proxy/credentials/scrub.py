"""Response scrubbing: an upstream that echoes an injected credential must not hand it to the
sandbox (debug endpoints, error pages and request-echo services all do).

The needles are the forms an echo of a secret can take (credentials/inject.py: the secret, its
percent-encoded or base64 forms, the header value written). Requests that carry an injected
credential ask the upstream for an identity encoding, so the body can be scrubbed byte for byte:
whole when it was buffered, and chunk by chunk when it streams, each chunk passed on at once but
for a tail that could be the start of a needle (server-sent events and token streams must not
wait for the next chunk). Every occurrence of every needle is found in the bytes as they came,
overlapping ones too, and the union of their spans is masked: a sandbox that may send sealed
tokens chooses some needles (anyone with the proxy's public key can mint one), and a needle that
overlaps an echo of a real secret must not keep that one from being found. A mask has the
length of what it covers, so the response keeps its framing; streamed, the output is the same,
byte for byte, as the whole body's. The work is linear in the bytes and the needles, whatever
either holds (see `_find`, `_occurrences`, `_overlap`), and `Injected.scrubber` bounds the
needles of one request.

An upstream that compresses anyway has its body decoded first (credentials/decode.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from itertools import chain, islice

from .decode import Decoder

REDACTED = b"[REDACTED]"
_PATTERN = REDACTED * 410  # masks up to 4 KiB are sliced from it

# A mitmproxy stream function. It returns a list, never b"" for "nothing yet": mitmproxy sends
# each bytes value it gets as a chunk, and an empty chunk ends a chunked HTTP/1 body early.
Stream = Callable[[bytes], list[bytes]]


_PROBE = 16
_SMALL = 1 << 14  # positions times needle length below which any search is cheap
_DIRECT = 4  # candidate starts `_overlap` compares before it works in bands


def _linear(n: int, m: int) -> bool:
    """Whether searching an m-byte needle in n bytes is linear (or small) in CPython."""
    return (
        m <= _PROBE
        or (n - m + 1) * m <= _SMALL
        or (n >= 2500 and (m >= 100 or n >= 30000) and (m >> 2) * 3 < (n >> 2))
    )


def _padding(m: int) -> int:
    # A haystack at least this long is searched for an m-byte needle in linear time.
    return max(2500 if m >= 100 else 30000, 4 * m + 16)


_ZEROS = memoryview(bytes(_padding(1 << 15)))  # padding for needles up to 32 KiB, shared


def _zeros(n: int) -> memoryview | bytes:
    return _ZEROS[:n] if n <= len(_ZEROS) else bytes(n)


def _find(data: bytes, needle: bytes, start: int = 0) -> int:
    """data.find(needle, start), in time linear in len(data) - start and len(needle)."""
    n, m = len(data) - start, len(needle)
    if _linear(n, m):
        return data.find(needle, start)
    start = data.find(needle[:_PROBE], start)
    if start < 0:
        return -1
    n = len(data) - start
    if _linear(n, m):
        return data.find(needle, start)
    # Zero bytes after the data: a match that reaches into them is no match, and then there is
    # none further on either.
    found = (data[start:] + _zeros(_padding(m) - n)).find(needle)
    return start + found if 0 <= found <= n - m else -1


def _mask(length: int, phase: int = 0) -> bytes:
    # As long as what it replaces: Content-Length and offsets stay true, so scrubbing never
    # has to re-frame a response. `phase` is where in the pattern a run split by a streamed
    # chunk's end goes on.
    return (REDACTED * ((phase + length) // len(REDACTED) + 1))[phase : phase + length]


def _run_end(data: bytes, period: int, end: int, stop: int | None = None) -> int:
    """Where `data` stops repeating with `period`: the first position from `end` on with
    data[i] != data[i - period], or `stop` (default len(data)) if there is none before it. The
    caller knows that data[:end] repeats up to there. Slices compared in doubling then halving
    steps: the bytes are compared in C, in O(log) Python steps."""
    stop = len(data) if stop is None else min(stop, len(data))
    step = 1
    while end < stop:
        span = min(step, stop - end)
        if data[end : end + span] != data[end - period : end - period + span]:
            while span > 1:
                half = span // 2
                if data[end : end + half] == data[end - period : end - period + half]:
                    end, span = end + half, span - half
                else:
                    span = half
            return end
        end, step = end + span, step * 2
    return stop


# One needle's occurrences that overlap or touch: (first, step, count) is an occurrence at
# first, first + step, ... (count of them, step at most the needle's length).
Progression = tuple[int, int, int]


def _occurrences(data: bytes, needle: bytes) -> tuple[list[int], list[Progression]]:
    """Every occurrence of `needle` in `data`: those that neither overlap nor touch the next
    one, and progressions of those that do. A repeating stretch (a needle that overlaps
    itself, or one echoed again and again) is one progression found with a few slice
    comparisons, not an occurrence at a time, so the Python work stays proportional to the
    occurrences that stand apart, which are at least a needle's length each."""
    alone: list[int] = []
    runs: list[Progression] = []
    size, last = len(needle), len(data) - len(needle)  # an occurrence starts at `last` at most
    # Searched from ever later starts, so padded unless even the whole is small (see _find).
    small = size <= _PROBE or (len(data) - size + 1) * size <= _SMALL
    hay = data if small else data + _zeros(_padding(size))
    find = hay.find
    at = find(needle)
    while 0 <= at <= last:
        after = find(needle, at + 1)
        if not 0 <= after <= last:
            alone.append(at)
            break
        step = after - at
        if step > size:
            alone.append(at)
            at = after
            continue
        # The two make data[at : after + size] repeat with `step`, and inside a repeating
        # stretch the occurrences are exactly at + k * step (another one would have one
        # between `at` and `after`, which is the next).
        end = _run_end(data, step, after + size)
        count = (end - size - at) // step + 1
        runs.append((at, step, count))
        # The next occurrence ends past the stretch; one that starts inside it starts within
        # `step` of its end (step is a period of the needle, and the stretch's break would
        # be inside it).
        at = find(needle, end - step + 1)
    return alone, runs


def _overlap(data: bytes, needle: bytes, first: int, floor: int) -> int:
    """The longest suffix of `data` that is a proper prefix of `needle`, if longer than
    `floor`; else 0 or anything not above `floor`. `first` is where the needle's first byte
    is first found in the last len(needle) - 1 bytes of `data`.

    A few starts are compared directly. Past them the work is linear in the bytes compared (in
    C) and logarithmic in Python steps, whatever the data: candidate lengths k are tried in
    bands [x, 2x) for x = 2^j, longest first. A suffix in the band starts with needle[:x], and
    the band's starts lie in a window shorter than 2x, where needle[:x] occurs at most twice,
    or at an arithmetic progression whose step d is needle[:x]'s period, the data repeating
    with d all along (two occurrences less than x apart are a period apart; with a third in
    the window, Fine and Wilf's lemma makes the step the smallest period). Then a start i of
    the progression is the answer if the data repeats with d to its end and the needle at
    least as far (len - i <= b, b how far the needle repeats with d), or if both stop
    repeating at the same place and the rest agrees: only one start needs comparing."""
    length = len(data)
    # The first few starts, compared directly: nearly always one is the answer, or there is
    # none; the bands below bound the work when there are many.
    for _ in range(_DIRECT):
        if needle.startswith(data[first:]):
            return length - first
        first = data.find(needle[0], first + 1)
        if first < 0 or length - first <= floor:
            return 0
    most = length - first  # the longest suffix that could begin the needle
    x = 1 << (most.bit_length() - 1)
    while x and min(2 * x - 1, most) > floor:
        lo = length - min(2 * x - 1, most)
        prefix = needle[:x]
        starts: list[int] = []
        at = _find(data, prefix, lo)
        while at >= 0 and len(starts) < 3:
            starts.append(at)
            at = _find(data, prefix, at + 1)
        if len(starts) < 3 or starts[2] - starts[1] != starts[1] - starts[0]:
            # (The second test never holds, as said above; if it did, this stays exact.)
            while at >= 0:
                starts.append(at)
                at = _find(data, prefix, at + 1)
            for at in starts:
                if needle.startswith(data[at:]):
                    return length - at
        else:
            one, step = starts[0], starts[1] - starts[0]
            ends = _run_end(data, step, one + x)
            # How far the needle repeats with step; a run past 2x decides nothing here.
            reach = _run_end(needle, step, x, 2 * x)
            if ends == length:
                at = max(one, length - reach)
                at += -(at - one) % step
                if at + x <= length:
                    return length - at
            else:
                at = ends - reach
                if at >= one and (at - one) % step == 0 and needle.startswith(data[at:]):
                    return length - at
        x //= 2
    return 0


class Scrubber:
    """Masks every needle wherever it occurs: all occurrences are found in the original bytes,
    overlapping ones too, and the union of their spans is masked, each run of masked bytes
    with the `[REDACTED]` pattern from its start. So no needle can hide another: a longer one
    that overlaps an echo (a sandbox can mint a token whose secret is the text around a real
    secret's echo) masks its own bytes, and the real one still masks all of its own."""

    def __init__(self, needles: Iterable[str]) -> None:
        unique = {n.encode() for n in needles if len(n) >= 4}
        self.needles = sorted(unique, key=len, reverse=True)
        self.hits = 0  # occurrences masked, overlapping ones each counted

    def __bool__(self) -> bool:
        return bool(self.needles)

    def fields(
        self, fields: tuple[tuple[bytes, bytes], ...]
    ) -> tuple[tuple[bytes, bytes], ...]:
        """Header fields with every value scrubbed; the same tuple when nothing was echoed."""
        # One search over all values first: nearly always there is nothing to replace.
        joined = b"\n".join(value for _, value in fields)
        if all(_find(joined, needle) < 0 for needle in self.needles):
            return fields
        return tuple((name, self.data(value)) for name, value in fields)

    def data(self, data: bytes) -> bytes:
        for needle in self.needles:
            if _find(data, needle) >= 0:
                return self._scrub(data, len(data), None)[0]
        return data  # nearly always: one search in C per needle, and that is all

    def _scrub(
        self, data: bytes, cut: int, run: tuple[int, int] | None
    ) -> tuple[bytes, tuple[int, int] | None]:
        """data[:cut] masked, and the masked run that reaches `cut` (start and end relative to
        it; the start is where its pattern began). `run` is such a run from the last chunk,
        relative to data[0]: its occurrences started before `data`, so they cannot be found in
        it. Counts the occurrences that start before `cut`: one in the rest starts in the next
        call's data, which begins there."""
        spans: list[tuple[int, int]] = [] if run is None else [run]
        for needle in self.needles:
            if _find(data, needle) < 0:
                continue
            size = len(needle)
            alone, runs = _occurrences(data, needle)
            self.hits += bisect_left(alone, cut)
            spans += [(at, at + size) for at in alone]
            for at, step, count in runs:
                if at < cut:
                    self.hits += min(count, (cut - 1 - at) // step + 1)
                spans.append((at, at + (count - 1) * step + size))
        if not spans:
            return (data if cut == len(data) else data[:cut]), None
        spans.sort()
        out: list[bytes] = []
        append, pattern = out.append, _PATTERN
        done = 0  # data[:done] is in `out`
        start, end = spans[0]
        carried = None
        for s, e in chain(islice(spans, 1, None), ((len(data) + 1, 0),)):
            if s <= end:  # overlapping or touching: one run
                end = max(end, e)
                continue
            if start >= 0 and end < cut:  # a run of this chunk's own
                size = end - start
                append(data[done:start])
                append(pattern[:size] if size <= len(pattern) else _mask(size))
                done, start, end = end, s, e
                continue
            if start >= cut:
                break
            # The run from the last chunk, its pattern going on, or the one reaching the cut.
            hi = min(end, cut)
            if start >= 0:
                out += (data[done:start], _mask(hi - start))
            else:
                append(_mask(hi, -start % len(REDACTED)))
            done = hi
            if end >= cut:
                carried = (start - cut, end - cut)
                break
            start, end = s, e
        append(data[done:cut])
        return b"".join(out), carried

    def held(self, data: bytes) -> int:
        """How many bytes at the end of `data` could be the start of a needle the next chunk
        completes: the longest suffix that is a proper prefix of a needle. Nearly always 0, so
        a stream is held back only where a secret might be split, never by a fixed amount (an
        event stream's closing blank line must go out with its event). Linear in the needles'
        length, in C (`_overlap`)."""
        longest, size = 0, len(data)
        for needle in self.needles:
            # Most often the needle's first byte is not in the tail, and that is all.
            first = data.find(needle[0], max(size - len(needle) + 1, 0))
            if 0 <= first < size - longest:
                longest = max(longest, _overlap(data, needle, first, longest))
        return longest

    def stream(self, decode: Decoder | None = None) -> Stream:
        """A mitmproxy stream function, decoding first if given a decoder. Each chunk goes out
        scrubbed at once, but for a tail that could begin a needle (`held`), which waits for
        the next chunk so that a needle split across two is still found; b"" (the end)
        flushes. The tail is kept as it came, with the masked run that reaches into it, so the
        stream masks exactly what `data` would mask in the whole body, with the same bytes."""
        carry = b""
        run: tuple[int, int] | None = None

        def scrub(chunk: bytes) -> list[bytes]:
            nonlocal carry, run
            if chunk:
                data = carry + (decode.decompress(chunk) if decode is not None else chunk)
                cut = len(data) - self.held(data)
            else:
                data = carry + (decode.flush() if decode is not None else b"")
                cut = len(data)
            out, run = self._scrub(data, cut, run)
            carry = data[cut:]
            return [out] if out else []

        return scrub
