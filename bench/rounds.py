"""Measuring in rounds, and the numbers taken from them.

Every configuration is measured once per round, rounds interleave the configurations in an
order that rotates, and each ratio is taken within a round: the machine drifts by tens of
percent over minutes, and a ratio of two runs seconds apart cancels most of that. Each result
also carries the proxy's CPU time and the CPU time other work on the machine took meanwhile.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from loadgen import (
    LoadError,
    Sample,
    group_cpu_seconds,
    machine_busy_seconds,
    run_hey,
    run_wrk,
    self_cpu_seconds,
)
from services import LOAD_CPU, BenchError, Setup

WARM_UP_CONCURRENCY = 8


@dataclass(frozen=True)
class Cell:
    """One measurement: a kind of load ("http", "https" or "newconn"), at a concurrency,
    through a lane."""

    kind: str
    concurrency: int
    lane: str


@dataclass
class Result:
    cell: Cell
    round: int
    sample: Sample | None
    proxy_cpu_s: float | None = None
    foreign_cpu_s: float = 0.0
    failure: str | None = None


def measure(setup: Setup, cell: Cell, seconds: int, round_: int) -> Result:
    lane = setup.lanes[cell.lane]
    pgids = [s.pgid for s in setup.services.started]
    cpu0, busy0, self0 = group_cpu_seconds(pgids), machine_busy_seconds(), self_cpu_seconds()
    try:
        if cell.kind == "http":
            sample = run_wrk(lane.target("http"), cell.concurrency, seconds,
                             setup.prefix(LOAD_CPU))
        else:
            sample = run_hey(lane.target("https"), cell.concurrency, seconds,
                             setup.prefix(LOAD_CPU), keepalive=cell.kind == "https")
    except LoadError as exc:
        return Result(cell, round_, None, failure=str(exc)[:500])
    cpu1, busy1, self1 = group_cpu_seconds(pgids), machine_busy_seconds(), self_cpu_seconds()
    ours = sum(cpu1[p] - cpu0[p] for p in pgids) + sample.loadgen_cpu_s + (self1 - self0)
    proxy_cpu = None
    if lane.service is not None:
        proxy_cpu = cpu1[lane.service.pgid] - cpu0[lane.service.pgid]
    return Result(cell, round_, sample, proxy_cpu, max(0.0, (busy1 - busy0) - ours))


class Progress:
    """One live line on stderr: where we are, how long it has taken, how long it will."""

    def __init__(self, total_cells: int, seconds: int) -> None:
        self.total = total_cells
        self.done = 0
        self.start = time.monotonic()
        self.guess = seconds + 0.6
        self.tty = sys.stderr.isatty()

    def show(self, what: str) -> None:
        elapsed = time.monotonic() - self.start
        per_cell = elapsed / self.done if self.done else self.guess
        total = elapsed + per_cell * (self.total - self.done)
        line = (f"[{self.done + 1:>3}/{self.total}] {what:<46} "
                f"elapsed {_clock(elapsed)} / ~{_clock(total)}")
        if self.tty:
            sys.stderr.write("\r" + line + "\x1b[K")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def note(self, text: str) -> None:
        sys.stderr.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        sys.stderr.flush()


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def warm_up(setup: Setup, groups: list[list[Cell]]) -> None:
    """Each lane once per kind before measuring (leaf certificates, DNS, caches, code paths);
    and a load that fails here stops the run instead of producing numbers for error pages."""
    seen: set[tuple[str, str]] = set()
    for group in groups:
        for cell in group:
            if (cell.kind, cell.lane) in seen:
                continue
            seen.add((cell.kind, cell.lane))
            result = measure(setup, Cell(cell.kind, WARM_UP_CONCURRENCY, cell.lane), 1, 0)
            sample = result.sample
            if sample is None or sample.requests == 0 or sample.errors > sample.requests * 0.01:
                service = setup.lanes[cell.lane].service
                detail = result.failure or f"{sample}"
                raise BenchError(f"warm-up {cell.kind} via {cell.lane} failed: {detail}\n"
                                 f"{service.tail() if service else ''}")


def run_rounds(
    setup: Setup, groups: list[list[Cell]], rounds: int, seconds: int,
    round_note: Callable[[list[Result], int], str],
    warmed: Callable[[], object] | None = None,
) -> list[Result]:
    """Warm up, call `warmed` (a check that may raise BenchError), then measure every cell of
    `groups` once per round, a group's cells back to back; after each round print
    `round_note(results, round)`."""
    progress = Progress(rounds * sum(len(g) for g in groups), seconds)
    progress.note(f"warming up {len(setup.lanes)} configurations ...")
    warm_up(setup, groups)
    if warmed is not None:
        warmed()
    progress.start = time.monotonic()
    results: list[Result] = []
    for r in range(1, rounds + 1):
        for group in groups:
            # Rotate the order each round so no configuration always follows the same one.
            shift = (r - 1) % len(group)
            for cell in group[shift:] + group[:shift]:
                progress.show(f"round {r}/{rounds}  {cell.kind:<7} c={cell.concurrency:<3} "
                              f"{cell.lane}")
                result = measure(setup, cell, seconds, r)
                if result.failure:
                    progress.note(f"  {cell.kind} c={cell.concurrency} {cell.lane}: FAILED "
                                  f"{result.failure.splitlines()[0]}")
                results.append(result)
                progress.done += 1
        progress.note(f"round {r}/{rounds} done: {round_note(results, r)}")
    return results


# -- numbers ----------------------------------------------------------------------------------


def _pairs(
    results: list[Result], kind: str, c: int, num: str, den: str, rounds: list[int] | None
) -> Iterator[tuple[Result, Result]]:
    """num's and den's result in each round (of `rounds`, default all) that has both."""
    index = {(r.round, r.cell.kind, r.cell.concurrency, r.cell.lane): r for r in results}
    for r in rounds or sorted({x.round for x in results}):
        a, b = index.get((r, kind, c, num)), index.get((r, kind, c, den))
        if a is not None and b is not None:
            yield a, b


def ratios(
    results: list[Result], kind: str, c: int, num: str, den: str, rounds: list[int] | None = None
) -> list[float]:
    """num/den req/s within each round where both were measured."""
    return [a.sample.rps / b.sample.rps for a, b in _pairs(results, kind, c, num, den, rounds)
            if a.sample and b.sample and b.sample.rps > 0]


def cpu_ratios(results: list[Result], kind: str, c: int, num: str, den: str) -> list[float]:
    """den's proxy CPU per request over num's, within each round: the capacity ratio of two
    single-process proxies, which time slices taken by other work on the machine do not bend."""
    out = []
    for a, b in _pairs(results, kind, c, num, den, None):
        cost_a, cost_b = cpu_per_request(a), cpu_per_request(b)
        if cost_a and cost_b:
            out.append(cost_b / cost_a)
    return out


def extra_cpu_us(results: list[Result], kind: str, c: int, num: str, den: str) -> list[float]:
    """num's proxy CPU µs per request minus den's, within each round."""
    out = []
    for a, b in _pairs(results, kind, c, num, den, None):
        cost_a, cost_b = cpu_per_request(a), cpu_per_request(b)
        if cost_a is not None and cost_b is not None:
            out.append((cost_a - cost_b) * 1e6)
    return out


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (q in 0-100), linear between samples (NaN for none). Every
    benchmark's p50 and p95 come from here, so two documents give the same figure for the same
    samples."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def cpu_per_request(result: Result) -> float | None:
    if result.sample is None or result.proxy_cpu_s is None or not result.sample.requests:
        return None
    return result.proxy_cpu_s / result.sample.requests


# A target is judged on its median to this many digits, which is how a report prints a median
# near its target (report.fmt_x): the verdict must agree with the figure printed beside it.
VERDICT_DIGITS = 3


def reaches(median: float, need: float) -> bool:
    """Whether a median ratio meets `need`, to VERDICT_DIGITS digits."""
    return round(median, VERDICT_DIGITS) >= need


@dataclass(frozen=True)
class Goal:
    """A target from the issue: `num`'s req/s over `den`'s, within a round, at least `need`."""

    label: str
    short: str
    kind: str
    concurrency: int
    num: str
    den: str
    need: float

    def ratios(self, results: list[Result], rounds: list[int] | None = None) -> list[float]:
        return ratios(results, self.kind, self.concurrency, self.num, self.den, rounds)

    def cpu_ratios(self, results: list[Result]) -> list[float]:
        return cpu_ratios(results, self.kind, self.concurrency, self.num, self.den)

    def met(self, results: list[Result]) -> bool | None:
        """Whether the median ratio reaches `need`; None when nothing was measured."""
        values = self.ratios(results)
        return reaches(statistics.median(values), self.need) if values else None


@dataclass
class Row:
    """A cell's medians over rounds."""

    kind: str
    concurrency: int
    lane: str
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_req: float | None
    proxy_util: float | None
    errors: int
    requests: int
    runs: int
    failures: int


def rows(results: list[Result]) -> list[Row]:
    cells: dict[Cell, list[Result]] = {}
    for r in results:
        cells.setdefault(r.cell, []).append(r)
    out = []
    for cell, rs in cells.items():
        ok = [r for r in rs if r.sample is not None]
        samples = [r.sample for r in ok if r.sample is not None]
        cpu = [r.proxy_cpu_s / r.sample.requests for r in ok
               if r.proxy_cpu_s is not None and r.sample is not None and r.sample.requests]
        util = [r.proxy_cpu_s / r.sample.wall_s for r in ok
                if r.proxy_cpu_s is not None and r.sample is not None]
        nan = float("nan")
        out.append(Row(
            cell.kind, cell.concurrency, cell.lane,
            statistics.median(s.rps for s in samples) if samples else nan,
            statistics.median(s.p50_ms for s in samples) if samples else nan,
            statistics.median(s.p99_ms for s in samples) if samples else nan,
            statistics.median(cpu) * 1e6 if cpu else None,
            statistics.median(util) if util else None,
            sum(s.errors for s in samples), sum(s.requests for s in samples),
            len(samples), len(rs) - len(ok),
        ))
    return out
