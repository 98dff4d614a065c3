"""The proxy's metrics in Prometheus' exposition format, with prometheus-client: every live
worker's snapshot (proxy/request/metrics.py) summed into one series per label set.

The workers are summed, not labelled: a worker's pid as a label would make new series at every
restart and tell an operator nothing they act on. A restarted worker counts from zero, so a sum
can drop; Prometheus' rate() and increase() read that as the counter reset it is. Names follow
Prometheus' conventions: base units (`_seconds`, `_bytes`), counters ending `_total`, help text
on every family.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from ..request.metrics import BUCKETS, HISTOGRAMS, fresh, snapshots

PREFIX: Final = "sealgate_"
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

# name (counters without `_total`, which the client adds) -> (help, label names)
COUNTERS: Final = {
    "requests": ("Requests decided, by decision and reason (reason empty: allowed and "
                 "answered).", ("decision", "reason")),
    "injections": ("Credentials injected into requests, by where they came from (broker: a "
                   "secret store; token: a sealed token).", ("source",)),
    "connections_closed": ("Client connections that ended.", ()),
    "connections_refused": ("Client connections closed as they were accepted, by reason.",
                            ("reason",)),
    "handshake_timeouts": ("Connections closed at their TLS handshake deadline.", ()),
    "tls_denied": ("ClientHellos refused, by reason.", ("reason",)),
    "events": ("Other audit events (reloads, drains, ...), by event.", ("event",)),
    "upstream_tls_offered": ("Upstream TLS handshakes that offered a cached session.", ()),
    "upstream_tls_resumed": ("Upstream TLS handshakes that resumed a session.", ()),
    "upstream_connections": ("Upstream connections a request rode, by how it was had (dialed: "
                             "new; reused: kept from an earlier client connection).",
                             ("how",)),
    "fast_path_connections": ("Client connections the fast path served (taken) or gave to "
                              "mitmproxy's layers (handed_over).", ("outcome",)),
    "secret_lookups": ("Secrets looked up for injection, by store and how each was served "
                       "(hit: cached; miss: fetched; stale: cached past its time while the "
                       "store is down; refused; unavailable).", ("store", "result")),
    "secret_fetches": ("Fetches from secret stores, by store and outcome (ok, refused, "
                       "unavailable).", ("store", "outcome")),
    "token_exchanges": ("Calls to token endpoints (oauth2, github-app, gcp-service-account, "
                        "aws-sts), by processor type and outcome (obtained, failed).",
                        ("kind", "outcome")),
}
# name -> (help, label names, the counters holding its sum and count)
SUMMARIES: Final = {
    "secret_fetch_duration_seconds": ("Time secret stores took to answer a fetch, by store.",
                                      ("store",), "secret_fetch_seconds", "secret_fetch_count"),
}
GAUGES: Final = {
    "connections_open": "Client connections open now.",
    "upstream_connections_open": "Upstream connections open now.",
    "upstream_dials_pinned": "Upstream dials pinned to a checked address, not yet connected "
                             "or failed.",
    "requests_in_flight": "Requests decided and not yet answered.",
    "resident_bytes": "The workers' resident memory.",
    "response_deadlines_pending": "Requests sent upstream in full, waiting for a response head.",
    "upstream_tls_sessions": "Upstream TLS sessions cached for resumption.",
    "upstream_connections_idle": "Upstream connections kept idle for a later client "
                                 "connection of the same sandbox.",
    "audit_backlog_bytes": "Audit lines waiting to be written.",
}
HISTOGRAM_HELP: Final = {
    "request_duration_seconds": "Time from a request's head to its audit line.",
    "dns_duration_seconds": "The guard's lookup of a request's name (cached answers included).",
    "upstream_connect_duration_seconds": "TCP connect to the upstream, for requests that "
                                         "opened a connection.",
}


class _Workers(Collector):
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def collect(self) -> Iterator[Metric]:
        every = snapshots(self.directory)
        found, now = [snap for _, _, snap in every], fresh(every)
        # Counts from every live worker (a hung one's are still true, and dropping them would
        # read as a reset); what is now (gauges, reporting) only from those still reporting.
        workers = GaugeMetricFamily(f"{PREFIX}workers",
                                    "Worker processes reporting (a snapshot within 3 s).")
        workers.add_metric([], len(now))
        yield workers
        yield from _counters(found)
        for name, help_text in GAUGES.items():
            gauge = GaugeMetricFamily(f"{PREFIX}{name}", help_text)
            gauge.add_metric([], sum(float(s.get("gauges", {}).get(name, 0)) for s in now))
            yield gauge
        for name in HISTOGRAMS:
            yield _histogram(name, found)
        yield from _summaries(found)


def _counters(found: list[dict[str, Any]]) -> Iterator[Metric]:
    sums: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in COUNTERS}
    for snap in found:
        for name, labels, value in snap.get("counters", ()):
            if name in sums:
                key = tuple(str(labels.get(label, "")) for label in COUNTERS[name][1])
                sums[name][key] = sums[name].get(key, 0.0) + float(value)
    for name, (help_text, labels) in COUNTERS.items():
        family = CounterMetricFamily(f"{PREFIX}{name}", help_text, labels=list(labels))
        for values, total in sorted(sums[name].items()):
            family.add_metric(list(values), total)
        yield family


def _summaries(found: list[dict[str, Any]]) -> Iterator[Metric]:
    for name, (help_text, labels, sum_name, count_name) in SUMMARIES.items():
        sums: dict[tuple[str, ...], list[float]] = {}
        for snap in found:
            for counter, values, value in snap.get("counters", ()):
                if counter in (sum_name, count_name):
                    key = tuple(str(values.get(label, "")) for label in labels)
                    pair = sums.setdefault(key, [0.0, 0.0])
                    pair[counter == count_name] += float(value)
        family = SummaryMetricFamily(f"{PREFIX}{name}", help_text, labels=list(labels))
        for key, (total, count) in sorted(sums.items()):
            family.add_metric(list(key), count_value=int(count), sum_value=total)
        yield family


def _histogram(name: str, found: list[dict[str, Any]]) -> Metric:
    counts = [0.0] * (len(BUCKETS) + 2)
    for snap in found:
        for i, value in enumerate(snap.get("histograms", {}).get(name, ())[:len(counts)]):
            counts[i] += float(value)
    cumulative, buckets = 0.0, []
    for bound, count in zip((*map(str, BUCKETS), "+Inf"), counts, strict=False):
        cumulative += count
        buckets.append((bound, cumulative))
    family = HistogramMetricFamily(f"{PREFIX}{name}", HISTOGRAM_HELP[name])
    family.add_metric([], buckets, sum_value=counts[-1])
    return family


def exposition(directory: Path) -> bytes:
    """Every live worker's snapshot in `directory`, summed, in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Workers(directory))
    return generate_latest(registry)
