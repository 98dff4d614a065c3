"""The control API: how the sandbox runtime tells the proxy which address is which sandbox.

HTTP over a unix socket that only the proxy's owner can open (mode 0600 in a 0700 directory):
a sandbox that could reach it could claim another sandbox's address. Endpoints:

    GET    /v1/health                 {"ok": true}; 503 {"ok": false, "draining": true} when
                                      stopping (a readiness probe takes it out of rotation)
    GET    /v1/metrics                every worker's counters, Prometheus text
                                      (proxy/request/metrics.py)
    GET    /v1/sources                {"sources": {"10.200.0.2": "bot-1", ...}}
    PUT    /v1/sources/{address}      body {"sandbox": "bot-1"}  -> 200, or 400/404 with a reason
    DELETE /v1/sources/{address}      -> 200, or 404

Sandbox ids are checked against the rules in force at the time of the call: a rules file
changed into one that does not load keeps the previous ids, as the workers keep the previous
rules.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from aiohttp import web

from sealgate.reasons import Reason
from sealgate.watch import Snapshot

from ..policy.rulesfile import RulesError, load_rules
from ..request.registry import RegistryError, SourceRegistry
from . import admin

_MAX_BODY = 4096


def make_app(
    registry: SourceRegistry, rules_path: Path, draining: Callable[[], bool] = lambda: False
) -> web.Application:
    app = web.Application(client_max_size=_MAX_BODY)
    in_force = _RulesInForce(rules_path)
    # The workers write their snapshots beside the registry, in the state directory.
    app.router.add_get("/v1/metrics", admin.metrics_handler(registry.path.parent / "metrics"))

    async def health(_: web.Request) -> web.Response:
        if draining():
            return web.json_response({"ok": False, "draining": True}, status=503)
        return web.json_response({"ok": True})

    async def list_sources(_: web.Request) -> web.Response:
        return web.json_response({"sources": dict(registry.entries())})

    async def put_source(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, web.HTTPRequestEntityTooLarge):
            return _error(Reason.BAD_JSON, "body must be JSON: {\"sandbox\": \"<id>\"}")
        sandbox = body.get("sandbox") if isinstance(body, dict) else None
        if not isinstance(sandbox, str):
            return _error(Reason.BAD_REQUEST, "field 'sandbox' (string) is required")
        try:
            known = in_force.sandboxes()
        except RulesError as exc:
            return _error(Reason.RULES_UNAVAILABLE, str(exc))
        if sandbox not in known:
            return _error(Reason.UNKNOWN_SANDBOX, f"no sandbox {sandbox[:64]!r} in the rules")
        try:
            registry.register(request.match_info["address"], sandbox)
        except RegistryError as exc:
            return _error(exc.reason, str(exc))
        except OSError as exc:  # a full or read-only disk: nothing was registered
            return _error(Reason.REGISTRY_UNAVAILABLE, f"cannot write the registry: {exc.strerror}")
        return web.json_response({"address": request.match_info["address"], "sandbox": sandbox})

    async def delete_source(request: web.Request) -> web.Response:
        try:
            found = registry.unregister(request.match_info["address"])
        except RegistryError as exc:
            return _error(exc.reason, str(exc))
        except OSError as exc:
            return _error(Reason.REGISTRY_UNAVAILABLE, f"cannot write the registry: {exc.strerror}")
        if not found:
            return _error(Reason.NOT_REGISTERED, "no sandbox registered for that address")
        return web.json_response({"removed": request.match_info["address"]})

    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/sources", list_sources)
    app.router.add_put("/v1/sources/{address}", put_source)
    app.router.add_delete("/v1/sources/{address}", delete_source)
    return app


class _RulesInForce:
    """The sandbox ids of the rules in force, as the workers hold them: read again once their
    files changed, and the previous ones kept while what changed does not load (a broken
    update must not stop sandboxes from starting while every worker serves the rules before
    it). RulesError only while no rules have ever loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen = Snapshot.unread((path,))
        self._known: Mapping[str, object] | None = None
        self._error: RulesError | None = None

    def sandboxes(self) -> Mapping[str, object]:
        if self._seen.changed():
            try:
                rules = load_rules(self.path)
            except RulesError as exc:
                self._error = exc
                self._seen = self._seen.retake()
            else:
                self._known, self._error = rules.sandboxes, None
                self._seen = Snapshot.take((self.path, *rules.sources))
        if self._known is None:
            assert self._error is not None
            raise self._error
        return self._known


def _error(reason: Reason, detail: str) -> web.Response:
    return web.Response(
        status=reason.status,
        text=json.dumps({"error": reason, "detail": detail}),
        content_type="application/json",
    )


async def start(
    socket_path: Path, registry: SourceRegistry, rules_path: Path,
    draining: Callable[[], bool] = lambda: False,
) -> web.AppRunner:
    socket_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if socket_path.exists():
        socket_path.unlink()
    runner = web.AppRunner(make_app(registry, rules_path, draining), access_log=None)
    await runner.setup()
    # umask, not chmod after bind: there must be no moment when others can connect.
    old = os.umask(0o177)
    try:
        await web.UnixSite(runner, str(socket_path)).start()
    finally:
        os.umask(old)
    return runner
