"""`sealgate kube identity`: the pod watcher beside a proxy (its control socket shared), telling
it which sandbox each pod address is. Only argparse at import; kubernetes-asyncio when it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from sealgate import oplog
from sealgate.clikit import Subcommands, env_option
from sealgate.hostport import parse_hostport

_LOG = logging.getLogger("sealgate.kube")


def register(sub: Subcommands) -> None:
    p = sub.add_parser("kube", help="sealgate on Kubernetes: identity by pod, "
                                              "transparent mode in a pod")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    i = actions.add_parser("identity", help="watch the pods and tell the proxy each pod "
                                            "address's sandbox (from a label)")
    env_option(i, "--state", env="SEALGATE_STATE", default="var", type=Path,
               help="the proxy's state directory: its control socket")
    env_option(i, "--kubeconfig", env="KUBECONFIG", metavar="FILE",
               help="a kubeconfig file (default: the pod's service account, in-cluster)")
    i.add_argument("--namespace",
                   help="watch one namespace only (default: every namespace: an address a "
                        "sandbox pod had can be reused by a pod of any namespace, and only "
                        "seeing that pod withdraws it)")
    i.add_argument("--label", default="sealgate.dev/sandbox",
                   help="the pod label whose value is the sandbox id the rules name (default "
                        "sealgate.dev/sandbox)")
    i.add_argument("--stale-after", type=float, default=30.0, metavar="SECONDS",
                   help="withdraw every registration once the API has not answered for this "
                        "long (default 30)")
    env_option(i, "--admin", env="SEALGATE_KUBE_ADMIN", metavar="HOST:PORT",
               help="serve /healthz, /readyz and /metrics there (plain HTTP; off by default)")
    oplog.add_flags(i)
    i.set_defaults(func=_identity)

    # Transparent mode in a pod: the init container's table and the sidecar it sends to.
    r = actions.add_parser("redirect", help="(init container) send this network namespace's "
                                            "TCP egress to the forwarder; drop the rest")
    r.add_argument("--port", type=int, default=15001,
                   help="the forwarder's port on the loopback (default 15001)")
    r.add_argument("--exempt-uid", type=int, default=1337, metavar="UID",
                   help="the forwarder's uid, whose connections leave as they are (default "
                        "1337; no other container of the pod may run as it)")
    r.add_argument("--dns", action="store_true",
                   help="let the pod ask its resolver (port 53); off by default")
    r.add_argument("--print", action="store_true",
                   help="print the nftables script instead of installing it")
    r.set_defaults(func=_redirect)
    f = actions.add_parser("forward", help="(sidecar) send each redirected connection to the "
                                           "proxy as a CONNECT to the name it is for")
    env_option(f, "--proxy", env="SEALGATE_PROXY_ADDR", metavar="HOST:PORT",
               help="the proxy's explicit listener (its Service)")
    f.add_argument("--port", type=int, default=15001,
                   help="listen on 127.0.0.1 and ::1 at this port (default 15001)")
    oplog.add_flags(f)
    f.set_defaults(func=_forward)


def _identity(args: argparse.Namespace) -> int:
    if not args.stale_after > 0:
        print("sealgate kube: --stale-after must be more than 0", file=sys.stderr)
        return 2
    try:
        args.admin = parse_hostport(args.admin) if args.admin else None
    except ValueError as exc:
        print(f"sealgate kube: --admin: {exc}", file=sys.stderr)
        return 2
    oplog.configure(args.log_format, args.log_level)
    try:
        return asyncio.run(_watch(args))
    except KeyboardInterrupt:
        return 130


async def _watch(args: argparse.Namespace) -> int:
    from sealgate.clusterapi import KubeApiError, configuration

    try:
        made = await configuration(args.kubeconfig)
    except KubeApiError as exc:
        _LOG.error("no Kubernetes API to watch", extra={"error": str(exc)})
        return 2
    from kubernetes_asyncio import client

    from sealgate.proxy import control_socket

    from . import admin
    from .podwatch import Settings, Watcher

    settings = Settings(control_socket(args.state), args.label, args.namespace,
                        args.stale_after)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with client.ApiClient(made) as api:
        watcher = Watcher(client.CoreV1Api(api), settings)
        served = None
        if args.admin is not None:
            try:
                served = await admin.start(watcher, stop, args.admin)
            except OSError as exc:
                _LOG.error("admin listener failed", extra={
                    "admin": f"{args.admin[0]}:{args.admin[1]}", "error": exc.strerror or str(exc)})
                return 2
        _LOG.info("watching pods", extra={"namespace": args.namespace, "label": args.label,
                                          "control": str(settings.control)})
        task = asyncio.create_task(watcher.run(stop))
        await stop.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if served is not None:
            await served.cleanup()
    return 0


def _redirect(args: argparse.Namespace) -> int:
    from .redirect import Redirect, RedirectError

    table = Redirect(args.port, args.exempt_uid, args.dns)
    if args.print:
        sys.stdout.write(table.ruleset())
        return 0
    try:
        table.install()
    except RedirectError as exc:
        print(f"sealgate kube redirect: {exc}", file=sys.stderr)
        return 1
    print(f"sealgate kube redirect: TCP egress to 127.0.0.1:{args.port} and [::1]:{args.port}, "
          f"uid {args.exempt_uid} exempt, everything else dropped"
          f"{' but DNS' if args.dns else ''}", file=sys.stderr)
    return 0


def _forward(args: argparse.Namespace) -> int:
    try:
        if not args.proxy:
            raise ValueError("required (or SEALGATE_PROXY_ADDR)")
        proxy = parse_hostport(args.proxy)
    except ValueError as exc:
        print(f"sealgate kube forward: --proxy: {exc}", file=sys.stderr)
        return 2
    oplog.configure(args.log_format, args.log_level)
    try:
        return asyncio.run(_forwarding(proxy, args.port))
    except KeyboardInterrupt:
        return 130


async def _forwarding(proxy: tuple[str, int], port: int) -> int:
    from .forward import Forwarder

    forwarder = Forwarder(proxy, port)
    try:
        server = await forwarder.serve()
    except OSError as exc:
        _LOG.error("cannot listen", extra={"port": port, "error": exc.strerror or str(exc)})
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _LOG.info("forwarding", extra={"port": port, "proxy": f"{proxy[0]}:{proxy[1]}"})
    await stop.wait()
    await forwarder.close(server)
    _LOG.info("stopped", extra={"served": forwarder.served, "refused": forwarder.refused})
    return 0
