"""A watch's queue for a caller that stops reading is bounded in bytes as well as in events
(sandbox/daemon/workspace.py `events`): review found events of 60 KB paths let 4096 of them
hold a quarter of a GiB per watch. The shim's lines come from a stand-in for its pipe; the
function under test is the daemon's own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from sealgate.sandbox.daemon.workspace import WATCH_QUEUE_BYTES, events


class Lines:
    """What the watch shim's pipe delivers: `n` modify events of a long path, then its end."""

    def __init__(self, n: int, path_bytes: int) -> None:
        self.n, self.path = n, "/workspace/" + "d" * path_bytes

    async def chunks(self, stall: bool = True) -> AsyncIterator[bytes]:
        for _ in range(self.n):
            yield json.dumps({"event": "modify", "path": self.path}).encode() + b"\n"
            await asyncio.sleep(0)

    async def aclose(self) -> None:
        return None


async def _slow_reader(n: int, path_bytes: int) -> list[dict[str, object]]:
    got = []
    stream = Lines(n, path_bytes)
    watched = events(stream)  # type: ignore[arg-type]
    first = await anext(watched)  # the caller takes one, then stops while the shim goes on
    got.append(json.loads(first))
    await asyncio.sleep(0.5)
    async for line in watched:
        got.append(json.loads(line))
    return got


def test_long_events_are_held_by_bytes_not_only_by_count() -> None:
    got = asyncio.run(_slow_reader(400, 60_000))
    kept = [e for e in got if e["event"] == "modify"]
    overflow = [e for e in got if e["event"] == "overflow"]
    # 400 events of 60 KB are 24 MB: far fewer than 4096 events, yet they must not all be held.
    assert len(kept) * 60_000 <= WATCH_QUEUE_BYTES + 2 * 60_000, len(kept)
    assert overflow and sum(int(e["dropped"]) for e in overflow) == 400 - len(kept)  # type: ignore[call-overload]


def test_short_events_are_all_kept() -> None:
    got = asyncio.run(_slow_reader(400, 50))
    assert [e["event"] for e in got] == ["modify"] * 400
