"""What a sandbox keeps of its ended background processes' output (`Processes`, fed by
stand-ins for their execs' events): within one budget for all of them, the latest ended
keeping theirs, the oldest's said lost with their status still readable; running ones are not
touched; and one no longer listed keeps none, though an Idempotency-Key may still hold it."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncGenerator
from typing import Any

from sealgate.sandbox.daemon.background import ENDED_OUTPUT, RING, Background, Processes
from tests.unit.test_background_ring import _accounted, _events, _read_from


def _start(processes: Processes, events: AsyncGenerator[tuple[str, Any], None]) -> Background:
    return processes.add(["x"], events, asyncio.Queue(), lambda op, **fields: None)


async def _held_until(release: asyncio.Event) -> AsyncGenerator[tuple[str, Any], None]:
    """A process that writes a full ring and runs until `release` is set."""
    yield "stdout", b"r" * RING
    await release.wait()
    yield "exit", {"exit": 0, "ending": "exit"}


async def _many_ended() -> None:
    processes = Processes()
    release = asyncio.Event()
    running = _start(processes, _held_until(release))
    ended = []
    for i in range(12):  # a full ring each, one after another: 12 MiB written
        ended.append(_start(processes, _events([("stdout", bytes([i]) * RING)])))
        await ended[-1].wait()
    assert sum(p.held for p in ended) <= ENDED_OUTPUT
    assert running.running and running.held == RING  # a running one's ring is its own
    # The latest ended keeps all it wrote; the oldest is still listed, its output said lost.
    latest = await _read_from(ended[-1], 0)
    assert "lost" not in latest[0] and _accounted(latest) == RING
    assert base64.b64decode(latest[0]["stdout"]) == bytes([11]) * RING
    oldest = await _read_from(ended[0], 0)
    assert oldest[0] == {"lost": RING, "offset": RING} and oldest[-1]["exit"] == 0
    assert processes.table[ended[0].pid].info()["state"] == "exited"
    release.set()
    await running.wait()
    assert sum(p.held for p in processes.table.values()) <= ENDED_OUTPUT


async def _one_beyond_the_listed() -> None:
    processes = Processes()
    first = _start(processes, _events([("stdout", b"f" * 1000)]))
    await first.wait()
    for _ in range(70):  # more ended than are listed: the first is dropped from the table
        await _start(processes, _events([("stdout", b"n" * 1000)])).wait()
    assert first.pid not in processes.table
    assert first.held == 0  # its output cannot be asked for any more


def test_ended_processes_output_is_bounded_together() -> None:
    asyncio.run(_many_ended())


def test_a_process_no_longer_listed_keeps_no_output() -> None:
    asyncio.run(_one_beyond_the_listed())
