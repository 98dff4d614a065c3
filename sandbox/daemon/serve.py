"""Running the daemon: its listeners, its start (gateway, the sandboxes of a predecessor it takes
over, stale leases, pool, self-test) and a clean stop on SIGTERM or SIGINT (every sandbox
deleted, nothing left), or its exit once a successor took everything over
(`sandbox.daemon.handover`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from sealgate.hostport import parse_hostport

from .. import tiers
from ..errors import SandboxError
from ..host import firewall
from ..host.cgroup import parse_size
from ..host.network import Plan
from ..runtime import setup
from . import admin, adopt, handover, selftest, slot
from .api import make_app
from .apiserver import Runner
from .daemon import Config, Daemon
from .events import log

_LOG = logging.getLogger("sealgate.sandbox.daemon")


@dataclass(frozen=True)
class Settings:
    config: Config
    socket: Path
    listen: tuple[str, int] | None = None
    key: bytes | None = None
    tls: ssl.SSLContext | None = None
    selftest: bool = True
    adopt: str = "may"  # a predecessor's sandboxes: "must" (--adopt), "may", "never"
    admin: tuple[str, int] | None = None  # /healthz, /readyz and /metrics (`admin`)

    @classmethod
    def of(cls, args: argparse.Namespace) -> Settings:
        """From the command line; ValueError saying what is wrong."""
        try:
            plan = Plan(range=args.range, gateway=args.gateway)
            slots = slot.SlotConfig(state=args.state.resolve(), proxy_port=args.proxy_port,
                                transparent_port=args.transparent_port, plan=plan,
                                uid_base=args.uid_base, disk=parse_size(args.disk),
                                isolation=args.isolation, mcp_port=args.mcp_port)
        except SandboxError as exc:
            raise ValueError(str(exc)) from None
        if problem := tiers.available(args.isolation):
            raise ValueError(f"isolation {args.isolation} is not available: {problem}")
        pool, image_pools = _pools(args.pool or ["4"])
        if not 1 <= args.max_sandboxes <= len(plan.links):
            raise ValueError(f"--max-sandboxes 1..{len(plan.links)}")
        listen, key, tls, admin_at = api_access(args)
        if not 1 <= args.max_ttl <= 366 * 86400:
            raise ValueError("--max-ttl: 1 s to a year")
        images = (args.images or args.state / "images").resolve()
        config = Config(slots=slots, pool=pool, max_sandboxes=args.max_sandboxes,
                        max_ttl=args.max_ttl, images=images, image_pools=image_pools)
        return cls(config, args.socket, listen, key, tls, not args.no_selftest,
                   "must" if args.adopt else "never" if args.no_adopt else "may", admin_at)


def api_access(args: argparse.Namespace) -> tuple[tuple[str, int] | None, bytes | None,
                                                  ssl.SSLContext | None, tuple[str, int] | None]:
    """The API's TCP listener, its bearer key and TLS, and the admin listener, from the
    command line (both backends'). ValueError saying what is wrong."""
    listen = key = tls = admin_at = None
    if args.admin:
        try:
            admin_at = parse_hostport(args.admin)
        except ValueError as exc:
            raise ValueError(f"--admin: {exc}") from None
    if args.listen:
        try:
            listen = parse_hostport(args.listen)
        except ValueError as exc:
            raise ValueError(f"--listen: {exc}") from None
        if args.key_file is None:
            raise ValueError("--listen needs --key-file: the TCP listener takes only "
                             "requests with the bearer key")
        try:
            key = args.key_file.read_bytes().strip()
            mode = args.key_file.stat().st_mode
        except OSError as exc:
            raise ValueError(f"--key-file: {exc.strerror}") from None
        # Sandboxes see the host's /etc read-only: a key others may read could be theirs.
        if mode & 0o077:
            raise ValueError(f"--key-file {args.key_file}: readable by others (mode "
                             f"{mode & 0o777:o}); make it 0600, outside /etc")
        if len(key) < 16 or not key.isascii() or b" " in key:
            raise ValueError("--key-file: the key must be at least 16 printable ASCII "
                             "characters without spaces")
        if args.tls_cert or args.tls_key:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            try:
                tls.load_cert_chain(args.tls_cert, args.tls_key)
            except (OSError, ssl.SSLError, TypeError) as exc:
                raise ValueError(f"--tls-cert/--tls-key: {exc}") from None
    return listen, key, tls, admin_at


def _pools(items: list[str]) -> tuple[int, dict[str, int]]:
    """`--pool N` and `--pool IMAGE=N`: the host pool's size and each image's. ValueError."""
    host, images = 4, {}
    for item in items:
        name, _, count = item.rpartition("=")
        if not count.isdigit() or not 0 <= int(count) <= 1024:
            raise ValueError(f"--pool {item[:64]!r}: N or IMAGE=N, N from 0 to 1024")
        if name:
            images[name] = int(count)
        else:
            host = int(count)
    return host, images


def main(settings: Settings) -> int:
    try:
        return asyncio.run(_serve(settings))
    except (SandboxError, OSError) as exc:
        _LOG.error("sandboxd stopped", extra={"error": str(exc)})
        return 1


async def _verify(daemon: Daemon, own_socket: Path) -> list[selftest.Check]:
    """Run the self-test; the daemon creates sandboxes only while the last one passed."""
    checks = await selftest.run(daemon, own_socket)
    failed = [c for c in checks if not c.ok]
    for check in failed:
        _LOG.error("self-test failed", extra={"check": check.name, "detail": check.detail})
    daemon.unverified = ("self-test failed: " + "; ".join(c.name for c in failed)) if failed \
        else None
    if not failed:
        _LOG.info("self-test passed", extra={"checks": len(checks)})
    return checks


async def _serve(settings: Settings) -> int:
    plan = settings.config.slots.plan
    if not firewall.exists(firewall.shared_table(plan)):
        await asyncio.to_thread(setup, plan)
    daemon = Daemon(settings.config)
    if settings.selftest:
        daemon.unverified = "the self-test has not run yet"
    stop = asyncio.Event()

    def stopping(sig: signal.Signals) -> None:
        if not stop.is_set():
            log("stop_requested", signal=sig.name)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # from the first moment: see `take_over`
        loop.add_signal_handler(sig, stopping, sig)
    try:
        daemon.plan()  # all that could refuse the start, checked before anything is ours
        taken = await adopt.take_over(settings, daemon, settings.adopt, stop.is_set)
    except SandboxError as exc:
        _LOG.error("start refused", extra={"error": str(exc)})
        return 2
    if taken is not None:  # ours from here on: a stop ends them (`close`), nothing else
        daemon.take_over(taken.items, taken.ended)
        log("adopted", predecessor=taken.predecessor, slots=len(taken.items),
            sandboxes=sum(1 for item in taken.items if item[3] is not None), ms=taken.ms)
    try:
        await daemon.start()
    except (SandboxError, OSError) as exc:
        await daemon.close()
        for listener in [] if taken is None else taken.listeners:
            listener.close()
        _LOG.error("start failed", extra={"error": str(exc)})
        return 2
    app = make_app(daemon, settings.key)
    app.middlewares.append(handover.refuse_while_held(daemon))
    metrics = admin.Metrics(daemon)
    app[admin.METRICS] = metrics
    app.middlewares.insert(0, metrics.middleware)  # outermost: it times every answer

    async def selftest_call(_: web.Request) -> web.Response:
        checks = await _verify(daemon, settings.socket)
        # 200 either way: the answer is the checks; /v1/health says whether it is ready.
        return web.json_response({"ok": all(c.ok for c in checks),
                                  "checks": [dataclasses.asdict(c) for c in checks]})

    app.router.add_get("/v1/selftest", selftest_call)
    runner = Runner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    watcher = None
    if settings.admin is not None:
        try:
            watcher = await admin.start(daemon, metrics, stop.is_set, settings.admin)
        except OSError as exc:
            await runner.cleanup()
            await daemon.close()
            _LOG.error("admin listener failed", extra={
                "admin": f"{settings.admin[0]}:{settings.admin[1]}",
                "error": exc.strerror or str(exc)})
            return 2
    listeners = taken.listeners if taken is not None else []
    giver = handover.Giver(daemon, adopt.want(settings), listeners)
    try:
        if taken is None:
            listeners += _listen(settings)
        # A predecessor's listening sockets go on: what it had not accepted is ours to.
        await web.SockSite(runner, listeners[0]).start()
        where = [str(settings.socket)]
        if settings.listen is not None:
            await web.SockSite(runner, listeners[1], ssl_context=settings.tls).start()
            host, port = settings.listen
            where.append(f"{'https' if settings.tls else 'http'}://{host}:{port}")
        await giver.start(handover.path_for(settings.config.slots.state, settings.socket))
        took = {} if taken is None else {"took_over_slots": len(taken.items),
                                         "predecessor": taken.predecessor, "ms": taken.ms}
        _LOG.info("serving", extra={"on": where, "pool": settings.config.pool,
                                    "max_sandboxes": settings.config.max_sandboxes, **took})
        handed = asyncio.create_task(giver.done.wait())
        handed.add_done_callback(lambda _: stop.set())
        if settings.selftest:
            first = asyncio.create_task(_verify(daemon, settings.socket))
            await asyncio.wait([first, asyncio.create_task(stop.wait())],
                               return_when=asyncio.FIRST_COMPLETED)
        await stop.wait()
    finally:
        await giver.stop()
        if giver.done.is_set():  # the successor's now: ended by nothing of ours
            daemon.relinquish()
            _LOG.info("handed every sandbox over to its successor")
        await daemon.close()
        await runner.cleanup()
        if watcher is not None:
            await watcher.cleanup()
        for listener in listeners:
            listener.close()
        if not giver.done.is_set():
            with contextlib.suppress(FileNotFoundError):
                settings.socket.unlink()
    return 0


def _listen(settings: Settings) -> list[socket.socket]:
    return listen_on(settings.socket, settings.listen)


def listen_on(path: Path, listen: tuple[str, int] | None) -> list[socket.socket]:
    """The API's listening sockets, made here rather than by aiohttp so that they can be
    handed to a successor: the unix socket at `path` (owner-only), and a TCP one at `listen`
    if asked for."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # no moment when others could connect
    try:
        unix.bind(str(path))
    finally:
        os.umask(old)
    made = [unix]
    if listen is not None:
        host, port = listen
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        made.append(socket.create_server((host, port), family=family))
    for sock in made:
        sock.listen(128)
    return made
