"""The pod watcher's admin listener (`sealgate kube identity --admin HOST:PORT`), the same three
endpoints as every sealgate process (docs/operations.md): `GET /healthz` 200 `{"ok": true}`
while it answers; `GET /readyz` 200 `{"ready": true}`, or 503 `{"ready": false, "unready":
[...]}` before the first list, while every registration is withdrawn (the API unanswered past
`--stale-after`), while the proxy cannot be told, and once stopping; `GET /metrics`, what the
watcher has done (`podwatch.Counts`), read at the scrape.

As a sidecar of the proxy's pod, its readiness is the pod's: a proxy whose addresses cannot be
known serves no sandbox, so it leaves the Service's endpoints for one whose watcher can.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .podwatch import Watcher


def problems(watcher: Watcher, stopping: bool) -> list[str]:
    if stopping:
        return ["stopping"]
    found = []
    if not watcher.listed:
        found.append("api: the pods have not been listed yet")
    elif watcher.withdrawn:
        found.append("api: no answer past --stale-after: every registration withdrawn")
    if watcher.proxy_problem is not None:
        found.append(f"proxy: {watcher.proxy_problem}")
    return found


class _Watched(Collector):
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        watcher, counts = self.watcher, self.watcher.counts
        yield CounterMetricFamily("sealgate_kube_lists", "Pod lists that succeeded (at start, "
                                  "after a 410, after an outage)", value=counts.lists)
        yield CounterMetricFamily("sealgate_kube_watch_expired", "Watches ended by 410 Gone "
                                  "(listed again)", value=counts.gone)
        yield CounterMetricFamily("sealgate_kube_api_failures", "Lists or watches that "
                                  "failed (the API down, refusing or malformed)",
                                  value=counts.failures)
        events = CounterMetricFamily("sealgate_kube_watch_events", "Watch events, by type "
                                     "(ADDED, MODIFIED, DELETED, BOOKMARK, ERROR, other)",
                                     labels=["type"])
        for kind, count in sorted(counts.events.items()):
            events.add_metric([kind], count)
        yield events
        told = CounterMetricFamily("sealgate_kube_registry_changes", "Changes told to the "
                                   "proxy's source registry, by outcome: registered, withdrawn, "
                                   "refused (a label naming no sandbox), unreachable",
                                   labels=["outcome"])
        for outcome, count in sorted(counts.told.items()):
            told.add_metric([outcome], count)
        yield told
        yield CounterMetricFamily("sealgate_kube_withdrawals", "Times every registration was "
                                  "withdrawn, the API unanswered past --stale-after",
                                  value=counts.withdrawals)
        yield GaugeMetricFamily("sealgate_kube_addresses", "Pod addresses the watcher holds "
                                "as a sandbox's", value=len(watcher.claims.registered()))
        yield GaugeMetricFamily("sealgate_kube_seconds_since_sync", "Seconds since a list or "
                                "watch last succeeded", value=time.monotonic() - watcher.synced)


def make_app(watcher: Watcher, stop: asyncio.Event) -> web.Application:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Watched(watcher))
    app = web.Application(client_max_size=1024)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(_: web.Request) -> web.Response:
        unready = problems(watcher, stop.is_set())
        if unready:
            return web.json_response({"ready": False, "unready": unready}, status=503)
        return web.json_response({"ready": True})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def start(watcher: Watcher, stop: asyncio.Event, where: tuple[str, int]
                ) -> web.AppRunner:
    """Serving at `where`; OSError if it cannot listen there."""
    runner = web.AppRunner(make_app(watcher, stop), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, *where).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner
