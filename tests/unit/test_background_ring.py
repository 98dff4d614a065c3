"""A background process's output ring (`sandbox.daemon.background`), fed by a stand-in for its
exec's events: bounded in bytes and in pieces however the output comes, and never a byte lost
without saying so."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncGenerator
from typing import Any

from sealgate.sandbox.daemon.background import RING, Background


async def _events(pieces: list[tuple[str, bytes]]) -> AsyncGenerator[tuple[str, Any], None]:
    for name, data in pieces:
        yield name, data
        await asyncio.sleep(0)
    yield "exit", {"exit": 0, "ending": "exit"}


async def _drained(pieces: list[tuple[str, bytes]]) -> tuple[Background, list[dict[str, Any]]]:
    process = Background(1, ["x"], _events(pieces), asyncio.Queue(), lambda op, **fields: None)
    await process.wait()
    return process, [event async for event in process.output(0, follow=False)]


def _accounted(events: list[dict[str, Any]]) -> int:
    """Bytes said lost plus bytes given: all of the output, if nothing was skipped unsaid."""
    lost = sum(e.get("lost", 0) for e in events)
    given = sum(len(base64.b64decode(e[k])) for e in events for k in ("stdout", "stderr")
                if k in e)
    return lost + given


def test_tiny_writes_of_one_stream_are_coalesced() -> None:
    process, events = asyncio.run(_drained([("stdout", b"x")] * 100_000))
    assert len(process._chunks) <= 2  # 100,000 bytes in 64 KiB pieces
    assert _accounted(events) == 100_000 and events[-1]["exit"] == 0


def test_interleaved_tiny_writes_are_bounded_in_pieces_and_said_lost() -> None:
    pieces = [("stdout" if i % 2 else "stderr", b"y") for i in range(20_000)]
    process, events = asyncio.run(_drained(pieces))
    assert len(process._chunks) <= 4096
    assert events[0]["lost"] > 0
    assert _accounted(events) == 20_000


def test_more_than_the_ring_is_said_lost_not_skipped() -> None:
    pieces = [("stdout", bytes([i % 256]) * 50_000) for i in range(60)]  # 3 MB in all
    process, events = asyncio.run(_drained(pieces))
    given = b"".join(base64.b64decode(e["stdout"]) for e in events if "stdout" in e)
    assert len(given) <= RING and given == b"".join(d for _, d in pieces)[-len(given):]
    assert _accounted(events) == 3_000_000
    # A reader from inside the kept part gets exactly the rest.
    middle = 3_000_000 - 1000
    tail = asyncio.run(_read_from(process, middle))
    assert b"".join(base64.b64decode(e["stdout"]) for e in tail if "stdout" in e) == given[-1000:]


async def _read_from(process: Background, offset: int) -> list[dict[str, Any]]:
    return [event async for event in process.output(offset, follow=False)]
