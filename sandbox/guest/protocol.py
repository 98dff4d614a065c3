"""The guest agent's channel's frames, for both its ends (`guestagent` in the guest,
`channel` and `hostserve` on the host): a 4-byte big-endian length, then a JSON header line (an
object), then the raw payload. Standard library only, and light: the guest imports it at
every boot.
"""

from __future__ import annotations

import json
import re
import struct

TYPE_CHECKING = False  # typing costs the guest's start; type checkers take this as true
if TYPE_CHECKING:
    from typing import Any

MAX_FRAME = 64 << 20
_MAX_DEPTH = 16  # a header's nesting; exec's, the deepest, is 2 (its argv and env)
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_NESTING = re.compile(rb"[^\[\]{}]+")


def encode(header: dict[str, Any], payload: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode() + b"\n"
    return struct.pack(">I", len(head) + len(payload)) + head + payload


def decode(frame: bytes, max_header: int = MAX_FRAME) -> tuple[dict[str, Any], bytes]:
    """A frame's header (a JSON object) and payload; ValueError for anything else. The
    header's size and nesting are bounded before it is parsed: json's parser recurses, and a
    deeply nested header would raise RecursionError, which no caller expects."""
    end = frame.find(b"\n", 0, max_header + 1)
    if end < 0:
        raise ValueError(f"a frame without a header line of at most {max_header} bytes")
    head = frame[:end]
    if _nesting(head) > _MAX_DEPTH:
        raise ValueError(f"a frame's header nests deeper than {_MAX_DEPTH}")
    header = json.loads(head)  # bad JSON, bad UTF-8, a number too long: all ValueErrors
    if not isinstance(header, dict):
        raise ValueError("a frame's header is not an object")
    return header, frame[end + 1:]


def _nesting(head: bytes) -> int:
    """How deep a header's arrays and objects nest, counted past its strings (an unterminated
    one's brackets are counted too, which can only overstate it)."""
    depth = deepest = 0
    for byte in _NOT_NESTING.sub(b"", _STRINGS.sub(b"", head)):
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


class Frames:
    """Frames out of a byte stream fed in pieces; a header over `max_header` bytes is refused
    without being parsed."""

    def __init__(self, max_header: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max_header = max_header

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes]]:
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (size,) = struct.unpack(">I", self._buf[:4])
            if size > MAX_FRAME:
                raise ValueError(f"a frame of {size} bytes")
            if len(self._buf) < 4 + size:
                break
            out.append(decode(bytes(self._buf[4:4 + size]), self._max_header))
            del self._buf[:4 + size]
        return out
