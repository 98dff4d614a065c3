"""Counters an operator graphs and alerts on, from the same events as the audit log.

Every audit line a worker writes is also counted here (`count`), by event and, for requests, by
decision and reason: the reasons are the enum the refusals and the log use, so a dashboard, a
log search and a client's error all name a refusal the same way. Gauges (connections open,
requests in flight, RSS) are read when a snapshot is taken. Each worker writes its snapshot once
a second to `<state>/metrics/<pid>.json` (written whole, then renamed into place); the process
that serves the control API reads them all for `GET /v1/metrics` and `--metrics-listen`, in
Prometheus' text format, each worker's series labelled with its pid. A worker's counters start
from zero when it is restarted, which Prometheus' rate() reads as the reset it is.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

PREFIX: Final = "sealgate_"
# Upper bounds of the request duration histogram, in milliseconds.
BUCKETS_MS: Final = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)

_Key = tuple[str, tuple[tuple[str, str], ...]]

_HELP: Final = {
    "requests_total": "Requests decided, by decision and reason (empty: allowed and answered).",
    "request_duration_ms": "Time from a request's head to its audit line, in milliseconds.",
    "connections_closed_total": "Client connections that ended.",
    "connections_refused_total": "Client connections closed as they were accepted, by reason.",
    "handshake_timeouts_total": "Connections closed at their TLS handshake deadline.",
    "tls_denied_total": "ClientHellos refused, by reason.",
    "events_total": "Other audit events, by event.",
    "connections_open": "Client connections open now.",
    "requests_in_flight": "Requests decided and not yet answered.",
    "resident_bytes": "The worker's resident memory.",
    "response_deadlines_pending": "Requests sent upstream in full, waiting for a response head.",
    "upstream_tls_offered_total": "Upstream TLS handshakes that offered a cached session.",
    "upstream_tls_resumed_total": "Upstream TLS handshakes that resumed a session.",
    "upstream_tls_sessions": "Upstream TLS sessions cached for resumption.",
}
_GAUGES: Final = frozenset({"connections_open", "requests_in_flight", "resident_bytes",
                            "response_deadlines_pending", "upstream_tls_sessions"})


class Metrics:
    def __init__(self) -> None:
        self.counters: dict[_Key, float] = {}
        self.buckets = [0] * (len(BUCKETS_MS) + 1)  # the last is +Inf
        self.duration_sum = 0.0

    def count(self, event: str, fields: Mapping[str, Any]) -> None:
        """Count one audit event."""
        if event == "request":
            self._add("requests_total", 1, decision=str(fields.get("decision") or ""),
                      reason=str(fields.get("reason") or ""))
            if isinstance(ms := fields.get("total_ms"), int | float):
                self._observe(float(ms))
        elif event == "connection_closed":
            self._add("connections_closed_total", 1)
        elif event == "connections_refused":
            self._add("connections_refused_total", float(fields.get("count", 1)),
                      reason=str(fields.get("reason", "")))
        elif event == "handshake_timeout":
            self._add("handshake_timeouts_total", float(fields.get("count", 1)))
        elif event == "tls_denied":
            self._add("tls_denied_total", 1, reason=str(fields.get("reason", "")))
        else:
            self._add("events_total", 1, event=event)

    def total(self, name: str, value: float) -> None:
        """A counter kept elsewhere (the running total, not an increment)."""
        self.counters[(name, ())] = value

    def snapshot(self, **gauges: float) -> dict[str, Any]:
        return {
            "counters": [[name, dict(labels), value]
                         for (name, labels), value in sorted(self.counters.items())],
            "buckets": self.buckets, "duration_sum": self.duration_sum, "gauges": gauges,
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

    def _observe(self, ms: float) -> None:
        self.duration_sum += ms
        # The first bound at or above `ms`; past the last, the +Inf bucket.
        self.buckets[bisect.bisect_left(BUCKETS_MS, ms)] += 1


def snapshots(directory: Path) -> list[tuple[str, float, dict[str, Any]]]:
    """Every live worker's last snapshot in `directory`: its pid, when it was written (epoch
    seconds) and what it says. A snapshot of a process that is gone is removed: its successor
    counts from zero under its own pid."""
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


def exposition(directory: Path) -> str:
    """Every live worker's snapshot in `directory`, in Prometheus' text format."""
    found = [(pid, snap) for pid, _, snap in snapshots(directory)]
    return "".join(_family(name, found) for name in _HELP)


def _family(name: str, snapshots: Iterable[tuple[str, dict[str, Any]]]) -> str:
    kind = "gauge" if name in _GAUGES else "histogram" if name == "request_duration_ms" \
        else "counter"
    lines = [f"# HELP {PREFIX}{name} {_HELP[name]}", f"# TYPE {PREFIX}{name} {kind}"]
    for pid, snap in snapshots:
        worker = {"worker": pid}
        if name in _GAUGES:
            if name in snap.get("gauges", {}):
                lines.append(_sample(name, worker, snap["gauges"][name]))
        elif name == "request_duration_ms":
            total = 0
            for bound, n in zip((*BUCKETS_MS, "+Inf"), snap.get("buckets", ()), strict=False):
                total += n
                lines.append(_sample(f"{name}_bucket", {**worker, "le": str(bound)}, total))
            lines.append(_sample(f"{name}_sum", worker, snap.get("duration_sum", 0)))
            lines.append(_sample(f"{name}_count", worker, total))
        else:
            for counter, labels, value in snap.get("counters", ()):
                if counter == name:
                    lines.append(_sample(name, {**worker, **labels}, value))
    return "\n".join(lines) + "\n"


def _sample(name: str, labels: Mapping[str, str], value: float) -> str:
    text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return f"{PREFIX}{name}{{{text}}} {value:g}" if text else f"{PREFIX}{name} {value:g}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
