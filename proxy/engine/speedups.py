"""Replacements for per-request conveniences mitmproxy has for its own developers.

The lean master (mitm.py installs them) leaves out what profiling found among the largest
costs of a request; docs/performance.md, "Why the lean master", has the measurements. Nothing
here imports mitmproxy: these are the plain functions put in its place.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

_IDS_PER_FILL = 256


class RandomIds:
    """`uuid.uuid4()` as text, without a system call and a UUID object per id.

    The ids stay random (122 random bits from `os.urandom`, the same format): a denial shows the
    sandbox its request id, and a counter would tell it how much traffic other sandboxes send.
    """

    def __init__(self) -> None:
        self._hex = ""
        self._at = 0

    def uuid4(self) -> str:
        if self._at >= len(self._hex):
            self._hex, self._at = os.urandom(16 * _IDS_PER_FILL).hex(), 0
        h, self._at = self._hex[self._at : self._at + 32], self._at + 32
        # Version 4, RFC 4122 variant: the two fixed nibbles of uuid.uuid4().
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


def name_task(task: asyncio.Task[Any], *, name: str, client: tuple[Any, ...] | None = None) -> None:
    """mitmproxy's task tagging without the `os.environ` read it does for every hook task."""
    task.set_name(name)
