"""Counters an operator graphs and alerts on, counted by each worker from the same events as the
audit log.

Every audit line a worker writes is also counted here (`count`), by event and, for requests, by
decision and reason: the reasons are the enum the refusals and the log use, so a dashboard, a
log search and a client's error all name a refusal the same way. A request's line also feeds
three latency histograms (the whole request, its DNS lookup, its upstream connect) and the
injections by where the credential came from. Gauges (connections open, requests in flight,
RSS, the audit backlog) are read when a snapshot is taken.

Each worker keeps its figures in plain dicts and lists and writes them once a second to
`<state>/metrics/<pid>.json` (written whole, then renamed into place); the process that serves
the control API and `--admin` sums them over the workers into Prometheus' exposition
(proxy/process/exposition.py). That keeps the request path to a dict update: prometheus-client's
own multiprocess mode would write an mmap'd file under a lock for every increment. The files
also carry each worker's readiness (proxy/process/admin.py).
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

# Upper bounds of the latency histograms, in seconds.
BUCKETS: Final = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                  30.0, 60.0)
# name -> (the audit line's field, in milliseconds)
HISTOGRAMS: Final = {
    "request_duration_seconds": "total_ms",
    "dns_duration_seconds": "dns_ms",
    "upstream_connect_duration_seconds": "connect_ms",
}

_Key = tuple[str, tuple[tuple[str, str], ...]]


class Metrics:
    def __init__(self) -> None:
        self.counters: dict[_Key, float] = {}
        # name -> one count per bucket (the last is +Inf), then the sum of what was observed
        self.histograms = {name: [0.0] * (len(BUCKETS) + 2) for name in HISTOGRAMS}

    def count(self, event: str, fields: Mapping[str, Any]) -> None:
        """Count one audit event."""
        if event == "request":
            self._add("requests", 1, decision=str(fields.get("decision") or ""),
                      reason=str(fields.get("reason") or ""))
            for name, field in HISTOGRAMS.items():
                if isinstance(ms := fields.get(field), int | float):
                    self._observe(name, ms / 1000)
            for label in fields.get("injected") or ():
                # "broker:<ref>", "token:<kid>:<jti>", ...: where it came from, never which.
                self._add("injections", 1, source=str(label).partition(":")[0])
        elif event == "connection_closed":
            self._add("connections_closed", 1)
        elif event == "connections_refused":
            self._add("connections_refused", float(fields.get("count", 1)),
                      reason=str(fields.get("reason", "")))
        elif event == "handshake_timeout":
            self._add("handshake_timeouts", float(fields.get("count", 1)))
        elif event == "tls_denied":
            self._add("tls_denied", 1, reason=str(fields.get("reason", "")))
        else:
            self._add("events", 1, event=event)

    def total(self, name: str, value: float, **labels: str) -> None:
        """A counter kept elsewhere (the running total, not an increment)."""
        self.counters[(name, tuple(sorted(labels.items())))] = value

    def snapshot(self, **gauges: float) -> dict[str, Any]:
        return {
            "counters": [[name, dict(labels), value]
                         for (name, labels), value in sorted(self.counters.items())],
            "histograms": self.histograms, "gauges": gauges,
        }

    def write(self, directory: Path, unready: Iterable[str] = (), **gauges: float) -> None:
        """This worker's snapshot, replaced whole (a reader never sees half of one), with what
        keeps it from being ready (proxy/process/admin.py)."""
        directory.mkdir(mode=0o700, exist_ok=True)
        path = directory / f"{os.getpid()}.json"
        partial = path.with_suffix(".part")
        partial.write_text(json.dumps({**self.snapshot(**gauges), "unready": list(unready)}))
        partial.replace(path)

    def _add(self, name: str, value: float, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.counters[key] = self.counters.get(key, 0.0) + value

    def _observe(self, name: str, seconds: float) -> None:
        counts = self.histograms[name]
        # The first bound at or above `seconds`; past the last, the +Inf bucket.
        counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        counts[-1] += seconds


STALE_SECONDS = 3.0  # a worker writes its snapshot every second; past this, not reporting


def fresh(found: list[tuple[str, float, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Of `snapshots`, those of workers still reporting (written within STALE_SECONDS): a hung
    worker's counters still count, but what it says of now (readiness, gauges) is not now."""
    now = time.time()
    return [snap for _, written, snap in found if now - written < STALE_SECONDS]


def snapshots(directory: Path) -> list[tuple[str, float, dict[str, Any]]]:
    """Every live worker's last snapshot in `directory`: its pid, when it was written (epoch
    seconds) and what it says. A snapshot of a process that is gone is removed."""
    found: list[tuple[str, float, dict[str, Any]]] = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        pid = path.stem
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            path.unlink(missing_ok=True)
            continue
        try:
            found.append((pid, path.stat().st_mtime, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue  # being replaced this instant: the next read has it
    return found
