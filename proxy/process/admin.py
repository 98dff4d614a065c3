"""The admin listener (`--admin HOST:PORT`): what an orchestrator and a scraper ask, over TCP,
with nothing else of the proxy reachable there (the control API stays on its unix socket).

    GET /healthz   200 {"ok": true}: the process answers (a liveness probe)
    GET /readyz    200 {"ready": true, "workers": N}, or 503 {"ready": false, "unready":
                   [...]} naming each reason: draining; a worker not reporting (starting, hung
                   or dead: its snapshot older than `metrics.STALE_SECONDS`); in any worker,
                   no rules loaded, an audit log that cannot be written, a secret store
                   unavailable past its grace
    GET /metrics   the workers' metrics, summed, in Prometheus' text format (exposition.py)

Readiness is read from the snapshots every worker writes each second (with what keeps it from
being ready), so the process that answers -- the supervisor, or the one serving process -- sees
the workers' own state, not a guess. It turns false the moment a drain starts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from ..request import metrics
from . import exposition
from .drain import Health


def readiness(directory: Path, workers: int, health: Health) -> list[str]:
    """Why the proxy is not ready; empty when it is."""
    if health.draining:
        return ["draining"]
    fresh = metrics.fresh(metrics.snapshots(directory))
    unready = []
    if len(fresh) < workers:
        unready.append(f"workers: {len(fresh)} of {workers} reporting")
    for snap in fresh:
        unready += [str(reason) for reason in snap.get("unready", ())
                    if str(reason) not in unready]
    return unready


def make_app(directory: Path, workers: int, health: Health) -> web.Application:
    app = web.Application(client_max_size=1024)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(_: web.Request) -> web.Response:
        if unready := readiness(directory, workers, health):
            return web.json_response({"ready": False, "unready": unready}, status=503)
        return web.json_response({"ready": True, "workers": workers})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler(directory))
    return app


def metrics_handler(directory: Path) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def serve_metrics(_: web.Request) -> web.Response:
        return web.Response(body=exposition.exposition(directory),
                            headers={"Content-Type": exposition.CONTENT_TYPE})

    return serve_metrics


async def start(host: str, port: int, directory: Path, workers: int,
                health: Health) -> web.AppRunner:
    runner = web.AppRunner(make_app(directory, workers, health), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
