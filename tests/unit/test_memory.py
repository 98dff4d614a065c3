"""The reclaimer: a full collection after enough closed connections or seconds, the allocator
trimmed only once nothing is in flight."""

from __future__ import annotations

import gc

import pytest

from sealgate.proxy.engine import memory


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_collects_after_enough_closed_connections_and_trims_when_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    collected, trimmed = [], []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or 0)
    clock = Clock()
    r = memory.Reclaimer(clock, trim=lambda: trimmed.append(1))
    r.tick(idle=True)
    assert (collected, trimmed) == ([], [])  # nothing closed: nothing to do
    for _ in range(memory._EVERY_CLOSED):
        r.closed()
    r.tick(idle=False)
    assert (len(collected), trimmed) == (1, [])  # busy: collected, not trimmed yet
    r.tick(idle=True)
    assert (len(collected), len(trimmed)) == (1, 1)
    r.closed()
    clock.now += memory._EVERY_SECONDS - 0.1
    r.tick(idle=True)
    assert len(collected) == 1  # one closed, not long enough
    clock.now += 0.2
    r.tick(idle=True)
    assert (len(collected), len(trimmed)) == (2, 2)


def test_requests_ending_on_open_connections_are_collected_every_few_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keep-alive load closes no connection; each request still leaves cycles."""
    collected: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or 0)
    clock = Clock()
    r = memory.Reclaimer(clock, trim=lambda: None)
    for _ in range(10_000):
        r.finished()
    r.tick(idle=False)
    assert collected == []  # not by count: a full collection per few hundred would cost
    clock.now += memory._EVERY_SECONDS
    r.tick(idle=False)
    assert collected == [1]
    clock.now += memory._EVERY_SECONDS
    r.tick(idle=False)
    assert collected == [1]  # nothing ended since


def test_cycles_of_a_closed_connection_are_freed() -> None:
    """What the reclaimer is for: objects in a cycle outlive their last reference until a
    collection of their generation."""
    gc.collect()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    import weakref

    alive = weakref.ref(a)
    del a, b
    assert alive() is not None
    r = memory.Reclaimer()
    for _ in range(memory._EVERY_CLOSED):
        r.closed()
    r.tick(idle=True)
    assert alive() is None


def test_collections_are_spaced_by_their_own_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full collection's cost is the live heap's: at a flood of new connections, one per 500
    closed took a tenth of the worker. The next waits _SPACING times the last one's time, and
    never more than _MOST_SECONDS."""
    clock = Clock()
    collected: list[float] = []

    def collecting(took: float) -> None:
        def collect(*_: object) -> int:
            collected.append(clock.now)
            clock.now += took
            return 0

        monkeypatch.setattr(gc, "collect", collect)

    def flood(r: memory.Reclaimer, seconds: int) -> None:
        start = clock.now
        for k in range(seconds):  # a tick a second, 500 connections closed before each
            clock.now = start + k
            for _ in range(memory._EVERY_CLOSED):
                r.closed()
            r.tick(idle=False)

    collecting(0.0625)  # about as long as a worker's heap took here: 3.1 s to the next
    flood(memory.Reclaimer(clock, trim=lambda: None), 20)
    assert collected == [0, 4, 8, 12, 16]
    collected.clear()
    collecting(1.0)  # 50 s by its cost: 10 s at most
    flood(memory.Reclaimer(clock, trim=lambda: None), 25)
    assert [t - collected[0] for t in collected] == [0, 10, 20]
