"""sandboxd's admin listener (`--admin HOST:PORT`): what an orchestrator and a scraper ask,
over plain TCP, with nothing of the API reachable there (no sandbox, no key needed).

    GET /healthz   200 {"ok": true}: the process answers (a liveness probe)
    GET /readyz    200 {"ready": true, ...}, or 503 {"ready": false, "unready": [...]} naming
                   each reason: starting, stopping, handing over to a successor, the pool
                   cannot be filled, the self-test not run yet or failed
    GET /metrics   Prometheus' text format (prometheus-client)

What is counted per request (its duration by call, the requests by call and status, commands
by how they ended) is counted where the API answers, one histogram observation and one or two
counter increments each: sandboxd is one process, so prometheus-client's own registry serves,
with none of the proxy's per-worker snapshots. What is alive (sandboxes by tier and image, the
pool, slots being made and taken down, readiness, the self-test) is read from the daemon at
each scrape, so it costs the request path nothing and is never stale.

The listener binds with SO_REUSEPORT: at a hand-over (`sandboxd --adopt`) the successor binds
the same address before its predecessor lets go, and a probe meanwhile reaches either (the
predecessor answering "handing over").
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..guest.protocol import Ending
from .daemon import Daemon
from .tally import HOWS, PREPARE_BUCKETS

Handler = Callable[[web.Request], Any]
# A call, from milliseconds (an exec of `true`, a warm create) to a cold image create or a
# template's minutes.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0, 60.0, 300.0)
# A call is its method and route template (`POST /v1/sandboxes/:id/exec`): bounded, unlike
# paths; what matched no route is `other`.
_OTHER = "other"
_PARAMETER = re.compile(r"\{(\w+)(?::[^}]*)?\}")
_ENDINGS = frozenset(e.value for e in Ending)


class Metrics:
    """The daemon's registry: its counters, and a collector of what is alive at a scrape."""

    def __init__(self, daemon: Daemon) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.duration = Histogram(
            "sealgate_sandboxd_request_duration_seconds",
            "Time to answer an API call (a streamed exec: until its end), by call",
            ["call"], buckets=_BUCKETS, registry=self.registry)
        self.requests = Counter(
            "sealgate_sandboxd_requests", "API calls answered, by call and HTTP status",
            ["call", "status"], registry=self.registry)
        self.commands = Counter(
            "sealgate_sandboxd_commands_ended",
            "Foreground commands ended, by how: exit (by itself), killed (its caller left or "
            "asked), timed_out (its own limit), lost (its supervisor in the sandbox gone)",
            ["ending"], registry=self.registry)
        self.alive = _Alive(daemon)
        self.registry.register(self.alive)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response: web.StreamResponse = await handler(request)
            status = response.status
            return response
        finally:
            resource = request.match_info.route.resource
            route = _OTHER if resource is None else _call(request.method, resource.canonical)
            self.duration.labels(route).observe(time.perf_counter() - started)
            self.requests.labels(route, str(status)).inc()

    def ended(self, status: dict[str, Any]) -> None:
        """A foreground command's exit status (its `ending`), as it reaches its caller. The
        status line comes from inside the sandbox: a value that is no `Ending` is counted as
        `invalid`, never as a label of its own choosing."""
        ending = status.get("ending")
        self.commands.labels(ending if ending in _ENDINGS else "invalid").inc()


METRICS = web.AppKey("metrics", Metrics)  # the API's app holds them, where one is served


def ended(app: web.Application, status: dict[str, Any]) -> None:
    """Count a foreground command's end, if the app counts (an admin listener is served)."""
    if (metrics := app.get(METRICS)) is not None:
        metrics.ended(status)


@functools.cache
def _call(method: str, template: str) -> str:
    return method + " " + _PARAMETER.sub(r":\1", template)  # a few dozen, made once each


class _Alive(Collector):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def read_live(self) -> None:
        """The live sandboxes' limit hits, read off their cgroups in a thread before a scrape
        (a few file reads per group are too many for the event loop at 1000 sandboxes); a
        sandbox that ended meanwhile keeps its final reading (`Tally.hits_final`)."""
        daemon = self.daemon
        groups = [(ident, s.slot.group) for ident, s in list(daemon.sessions.items())]
        read = await asyncio.to_thread(lambda: [(i, g.limit_hits()) for i, g in groups])
        for ident, hits in read:
            if ident in daemon.sessions:
                daemon.tally.hits_seen(ident, hits)

    def collect(self) -> Iterator[Metric]:
        daemon = self.daemon
        status = daemon.status()
        alive = GaugeMetricFamily("sealgate_sandboxd_sandboxes",
                                  "Sandboxes alive, by tier and image (host: the host's root; "
                                  "snapshot: an image of one sandbox's own)",
                                  labels=["tier", "image"])
        counts: dict[tuple[str, str], int] = {}
        for session in list(daemon.sessions.values()):
            base = session.base
            image = "host" if base is None else "snapshot" if base.owner else base.name
            key = (session.options.isolation, image)
            counts[key] = counts.get(key, 0) + 1
        for (tier, image), count in sorted(counts.items()):
            alive.add_metric([tier, image], count)
        yield alive
        config = daemon.config
        yield _gauge("sealgate_sandboxd_pool_slots", "Slots ready in the pools",
                     status["pool"])
        yield _gauge("sealgate_sandboxd_pool_wanted", "Slots the pools are to hold",
                     config.pool + sum(config.image_pools.values()))
        yield _gauge("sealgate_sandboxd_slots_preparing", "Slots being made",
                     status["preparing"])
        yield _gauge("sealgate_sandboxd_slots_releasing", "Slots being taken down",
                     status["releasing"])
        yield _gauge("sealgate_sandboxd_max_sandboxes", "Most sandboxes alive at once",
                     config.max_sandboxes)
        yield _gauge("sealgate_sandboxd_ready", "1 while the daemon serves creates (its "
                     "pool fillable, its self-test passed)", 1 if status["ready"] else 0)
        yield _gauge("sealgate_sandboxd_selftest_passed", "1 once the last self-test passed, "
                     "0 before one ran or after one failed", 0 if daemon.unverified else 1)
        yield from _tally(daemon)
        hits = CounterMetricFamily(
            "sealgate_sandboxd_limit_hits",
            "The kernel holding sandboxes to their limits, by limit: memory (processes killed "
            "out of memory) and pids (forks refused at the process limit); bubblewrap's and "
            "gVisor's host cgroups (a microVM's guest kernel keeps its own)", labels=["limit"])
        for limit in ("memory", "pids"):
            hits.add_metric([limit], daemon.tally.limit_hits(limit))
        yield hits


def _tally(daemon: Daemon) -> Iterator[Metric]:
    tally = daemon.tally
    created = CounterMetricFamily("sealgate_sandboxd_sandboxes_created",
                                  "Sandboxes created, by how: warm (a pool's slot), cold "
                                  "(one prepared for the create) or fork (a copy resumed from "
                                  "another's memory)", labels=["how"])
    for how in HOWS:
        created.add_metric([how], tally.created[how])
    yield created
    ended = CounterMetricFamily("sealgate_sandboxd_sandboxes_ended",
                                "Sandboxes ended, by why (deleted, ttl, idle, agent ended, "
                                "...)", labels=["why"])
    for why, count in sorted(tally.ended.items()):
        ended.add_metric([why], count)
    yield ended
    buckets, total = [], 0
    for bound, count in zip((*PREPARE_BUCKETS, float("inf")), tally.prepare_buckets,
                            strict=True):
        total += count
        buckets.append(("+Inf" if bound == float("inf") else f"{bound:g}", total))
    yield HistogramMetricFamily("sealgate_sandboxd_slot_prepare_duration_seconds",
                                "Time to prepare a slot (its namespace, link, cgroups and "
                                "agent, to the agent's hello): the pools' refill, and a cold "
                                "create's", buckets=buckets, sum_value=tally.prepare_seconds)
    yield CounterMetricFamily("sealgate_sandboxd_slot_prepare_failures",
                              "Slots whose preparation failed", value=tally.prepare_failures)
    yield CounterMetricFamily("sealgate_sandboxd_leases_cleaned",
                              "Leftovers of dead runs or daemons (their leases) cleaned up at "
                              "start", value=tally.cleaned)


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


def readiness(daemon: Daemon, stopping: bool) -> list[str]:
    """Why the daemon is not ready to serve creates; empty when it is."""
    if stopping:
        return ["stopping"]
    if daemon.held:
        return ["handing over to a successor"]
    status = daemon.status()
    return [] if status["ready"] else [str(status["problem"] or "not ready")]


def make_app(daemon: Daemon, metrics: Metrics, stopping: Callable[[], bool]) -> web.Application:
    app = web.Application(client_max_size=1024)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(_: web.Request) -> web.Response:
        if unready := readiness(daemon, stopping()):
            return web.json_response({"ready": False, "unready": unready}, status=503)
        status = daemon.status()
        return web.json_response({"ready": True, "sandboxes": status["sandboxes"],
                                  "pool": status["pool"]})

    async def serve_metrics(_: web.Request) -> web.Response:
        await metrics.alive.read_live()
        return web.Response(body=generate_latest(metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", serve_metrics)
    return app


async def start(daemon: Daemon, metrics: Metrics, stopping: Callable[[], bool],
                address: tuple[str, int]) -> web.AppRunner:
    """The admin listener, serving. Raises OSError (the address taken, say)."""
    runner = web.AppRunner(make_app(daemon, metrics, stopping), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, *address, reuse_port=True).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner
