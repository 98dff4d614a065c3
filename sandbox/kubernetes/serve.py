"""Running sandboxd with the Kubernetes backend (`sealgate sandboxd --backend kubernetes`): the
API (`sandbox.daemon.api`) on its unix socket and, with a key, on TCP, over a `KubeBackend`,
until SIGTERM or SIGINT, when every sandbox it holds is deleted (its claim with it).

Nothing of the host is needed (no root, namespaces or cgroups: the pods are the cluster's);
what it needs of the API is RBAC in its namespace: `sandboxclaims` create, get, list, watch,
patch, delete;
`sandboxes` get; `pods` list; `pods/exec` create (deploy/k8s/sandboxd/rbac.yaml).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import signal
import ssl
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from sealgate.clusterapi import KubeApiError, configuration

from ..daemon.api import make_app
from ..daemon.apiserver import Runner
from ..daemon.serve import api_access, listen_on
from .backend import Config, KubeBackend

_LOG = logging.getLogger("sealgate.sandbox.daemon")
_NAMESPACE = "sandboxes"
_INSTANCE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class Settings:
    config: Config
    kubeconfig: str | None
    socket: Path
    listen: tuple[str, int] | None = None
    key: bytes | None = None
    tls: ssl.SSLContext | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> Settings:
        """From the command line; ValueError saying what is wrong."""
        pools: dict[str, str] = {}
        for item in args.warm_pool or []:
            sandbox, _, pool = item.partition("=")
            if not sandbox or not pool:
                raise ValueError(f"--warm-pool {item[:64]!r}: SANDBOX=POOL")
            pools[sandbox] = pool
        if not pools:
            raise ValueError("--backend kubernetes needs --warm-pool SANDBOX=POOL (at least "
                             "one): the warm pool whose pods are that sandbox id's")
        if not 1 <= args.max_ttl <= 366 * 86400:
            raise ValueError("--max-ttl: 1 s to a year")
        listen, key, tls, admin = api_access(args)
        if admin is not None:
            raise ValueError("--admin is the host backend's alone, for now")
        agent = tuple(args.agent.split()) if args.agent else None
        if not _INSTANCE.fullmatch(args.instance):
            raise ValueError(f"--instance {args.instance[:64]!r}: a label value (letters, "
                             "digits, '-', '_', '.', at most 63, starting and ending with a "
                             "letter or digit)")
        config = Config(namespace=args.namespace or _NAMESPACE, pools=pools,
                        instance=args.instance,
                        container=args.container, max_sandboxes=args.max_sandboxes,
                        max_ttl=args.max_ttl, ready_seconds=args.ready_seconds,
                        **({"agent": agent} if agent else {}))
        return cls(config, args.kubeconfig, args.socket, listen, key, tls)


def main(settings: Settings) -> int:
    try:
        return asyncio.run(_serve(settings))
    except OSError as exc:
        _LOG.error("sandboxd stopped", extra={"error": str(exc)})
        return 1


async def _serve(settings: Settings) -> int:
    try:
        made = await configuration(settings.kubeconfig)
    except KubeApiError as exc:
        _LOG.error("start refused", extra={"error": str(exc)})
        return 2
    from kubernetes_asyncio import client
    from kubernetes_asyncio.stream import WsApiClient

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # A heartbeat on each exec's WebSocket: a link whose API server went away is seen in a
    # minute, not at the sandbox's ttl.
    async with client.ApiClient(made) as api, WsApiClient(made, heartbeat=30) as ws_api:
        backend = KubeBackend(settings.config, api, ws_api)
        await backend.start()
        runner = Runner(make_app(backend, settings.key), access_log=None,
                        handler_cancellation=True)
        await runner.setup()
        listeners = listen_on(settings.socket, settings.listen)
        try:
            await web.SockSite(runner, listeners[0]).start()
            if settings.listen is not None:
                await web.SockSite(runner, listeners[1], ssl_context=settings.tls).start()
            _LOG.info("serving", extra={"on": str(settings.socket), "backend": "kubernetes",
                                        "namespace": settings.config.namespace,
                                        "pools": dict(settings.config.pools)})
            await stop.wait()
        finally:
            await backend.close()
            await runner.cleanup()
            for listener in listeners:
                listener.close()
            with contextlib.suppress(FileNotFoundError):
                settings.socket.unlink()
    return 0
