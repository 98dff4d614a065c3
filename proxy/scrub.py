"""Response scrubbing: an upstream that echoes an injected credential must not hand it to the
sandbox (debug endpoints, error pages and request-echo services all do).

The needles are the secret itself and every header value the injection produced (a Basic
credential's base64 form, say). Requests that carry an injected credential ask the upstream for
an identity encoding, so the body can be scrubbed byte for byte: whole when it was buffered, and
chunk by chunk, with a carry-over of one needle's length, when it streams. The mask has the
needle's length, so the response keeps its framing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

REDACTED = b"[REDACTED]"


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

    def stream(self) -> Callable[[bytes], bytes]:
        """A mitmproxy stream function. It holds back the last (longest needle - 1) bytes of
        each chunk, so a needle split across two chunks is still found; b"" flushes."""
        keep = max(len(n) for n in self.needles) - 1
        carry = b""

        def scrub(chunk: bytes) -> bytes:
            nonlocal carry
            if not chunk:
                out, carry = self.data(carry), b""
                return out
            data = self.data(carry + chunk)
            if len(data) <= keep:
                carry = data
                return b""
            carry = data[len(data) - keep :] if keep else b""
            return data[: len(data) - keep] if keep else data

        return scrub
