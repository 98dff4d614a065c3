"""The lean mitmproxy master `sealgate proxy` runs, and its worker processes.

mitmdump loads about 37 addons and every flow event walks all of them twice; a credential proxy
needs six (core, proxy server, next layer, TLS config, error check, ours): the measurements are in
docs/performance.md, "Why the lean master". Dropping mitmdump's defaults drops `block` too, so
the listen address defaults to loopback and exposing it is an explicit choice.

Several workers share one listen port through SO_REUSEPORT, the kernel spreading connections
across them. Everything they must agree on lives outside them: rules and the source registry are
files every worker watches, and budgets are split evenly (see proxy.budget).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mitmproxy import ctx, master, options
from mitmproxy.addons import core, errorcheck, next_layer, proxyserver, tlsconfig

from sealgate import oplog
from sealgate.hostport import format_hostport

from ..engine import fastpath, mitm, pool
from ..engine.limits import HttpLimits
from ..request import baseurl
from ..request.pipeline import Sealgate
from . import statedir
from .ca import ensure_ca
from .drain import Health, drain

logger = logging.getLogger("sealgate.proxy")
_SETTLE_SECONDS = 2.0
_IDLE_LOOK, _FREEZE_LOOKS = 0.25, 2400  # for a moment with no connection open: 10 minutes
# Addons whose work ends at start-up. mitmproxy walks every addon twice for every flow event,
# whether it handles the event or not, so these leave the chain once the proxy is up. (core
# validates option changes and offers UI commands; nothing changes options once running.)
_STARTUP_ONLY = ("errorcheck", "startupreport", "core")


@dataclass(frozen=True)
class ProxyConfig:
    listen: tuple[str, int] = ("127.0.0.1", 8080)
    transparent: tuple[str, int] | None = None
    rules: Path = Path("rules")
    state: Path = Path("var")
    resolver: str | None = None
    workers: int = 1
    upstream_ca: Path | None = None
    audit_stdout: bool = False
    connect_timeout: float = 10.0
    drain_timeout: float = 30.0  # how long requests in flight may take to finish on SIGTERM
    admin: tuple[str, int] | None = None  # /healthz, /readyz, /metrics over TCP (admin.py)
    limits: HttpLimits = field(default_factory=HttpLimits)
    token_keys: Path | None = None
    secret_stores: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()  # OPTION=VALUE, parsed by mitmproxy as its --set does

    @property
    def confdir(self) -> Path:
        return statedir.confdir(self.state)

    def modes(self) -> list[str]:
        modes = [f"regular@{format_hostport(*self.listen)}"]
        if self.transparent is not None:
            modes.append(f"transparent@{format_hostport(*self.transparent)}")
        return modes


class StartupReport:
    """Says where the proxy listens, what it enforces and which CA it signs with."""

    def __init__(self, config: ProxyConfig, worker: int | None) -> None:
        self.config = config
        self.worker = worker

    def running(self) -> None:
        if self.worker not in (None, 0):
            return
        ps = ctx.master.addons.get("proxyserver")
        sealgate = ctx.master.addons.get("sealgate")
        state = sealgate.state if sealgate is not None else None
        rules = state.rules if state is not None else None
        guard = state.guard if state is not None else None
        report: dict[str, Any] = {
            "listening": [format_hostport(a[0], a[1]) for a in ps.listen_addrs()],
            "modes": self.config.modes(),
            "workers": self.config.workers,
            "rules": str(self.config.rules),
        }
        if rules is not None:
            report |= {
                "policies": {name: {"mode": policy.mode, "rules": len(policy.rules)}
                             for name, policy in sorted(rules.policies.items())},
                "sandboxes": len(rules.sandboxes), "default_policy": rules.default_policy,
                "warnings": list(rules.warnings),
            }
        if guard is not None:
            report["resolver"] = [format_hostport(*server) for server in guard.resolver.servers]
        report |= {"ca": str(statedir.ca_bundle_path(self.config.state)),
                   "audit_log": str(self.config.state / "audit.log")}
        if oplog.is_console():
            # A person at a terminal reads the report as a block (the README shows it).
            print(_banner(report), file=sys.stderr, flush=True)
        else:
            logger.info("sealgate proxy ready", extra=report)


def _banner(report: dict[str, Any]) -> str:
    lines = ["sealgate proxy ready"]
    lines += [f"  listening  {address}" for address in report["listening"]]
    lines += [f"  mode       {mode}" for mode in report["modes"]]
    if report["workers"] > 1:
        lines.append(f"  workers    {report['workers']} (SO_REUSEPORT)")
    lines.append(f"  rules      {report['rules']}")
    for name, policy in report.get("policies", {}).items():
        lines.append(f"    policy   {name}: {policy['mode']}, {policy['rules']} rule(s)")
    if "sandboxes" in report:
        lines.append(f"    sandboxes {report['sandboxes']}, default policy: "
                     f"{report['default_policy'] or 'deny everything'}")
    lines += [f"    warning  {warning}" for warning in report.get("warnings", ())]
    if "resolver" in report:
        lines.append(f"  resolver   {', '.join(report['resolver'])} (names resolved by the "
                     "guard, answers checked)")
    lines.append(f"  CA         {report['ca']}")
    lines.append(f"  audit log  {report['audit_log']}")
    return "\n".join(lines)


def build_master(config: ProxyConfig, worker: int | None = None,
                 fast: fastpath.FastPath | None = None) -> master.Master:
    # mitmdump prints log records through its termlog addon, which the lean master leaves out:
    # sealgate's go through the operational log the command configured (sealgate/oplog.py).
    opts = options.Options()
    m = master.Master(opts)
    m.addons.add(
        core.Core(),
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        pool.Handoff(),  # before TlsConfig: a kept connection's TLS is given, not made
        tlsconfig.TlsConfig(),
        *([fast] if fast is not None else []),  # its option, its upstream TLS
        errorcheck.ErrorCheck(repeat_errors_on_stderr=True),
        Sealgate(),
        StartupReport(config, worker),
    )
    settings: dict[str, Any] = {
        "mode": config.modes(),
        "confdir": str(config.confdir),
        # Lazy: nothing is dialed before a request has been authorised, and a transparent
        # connection is not dialed before its SNI is known.
        "connection_strategy": "lazy",
        # No raw relay after a protocol switch either (the pipeline refuses such a 101 too).
        "rawtcp": False,
        "sealgate_rules": str(config.rules),
        "sealgate_state": str(config.state),
        "sealgate_resolver": config.resolver,
        "sealgate_workers": config.workers,
        "sealgate_audit_stdout": config.audit_stdout,
        "sealgate_token_keys": str(config.token_keys) if config.token_keys else None,
        "sealgate_secret_stores": list(config.secret_stores),
    }
    if config.upstream_ca is not None:
        settings["ssl_verify_upstream_trusted_ca"] = str(config.upstream_ca)
    opts.update(**settings)
    if config.extra:
        opts.set(*config.extra)
    return m


async def serve(
    config: ProxyConfig, worker: int | None = None, health: Health | None = None
) -> int:
    """Serve until SIGTERM or SIGINT, then drain (drain.py) and stop."""
    # Several workers share the port: mitmproxy must bind with SO_REUSEPORT.
    fast = mitm.install(config.connect_timeout, reuse_port=config.workers > 1,
                        bounds=config.limits, fast_prefix=baseurl.PREFIX)
    m = build_master(config, worker, fast)
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_quiet_cancellation)
    # Per-request garbage is short-lived; mitmproxy, the rules and the CA are not. Collect the
    # young generation less often and take everything alive after start-up out of collections.
    gc.set_threshold(20_000, 20, 20)
    loop.call_later(_SETTLE_SECONDS, _settle, m)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    running = asyncio.ensure_future(m.run())  # startup errors: ErrorCheck's SystemExit(1)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([running, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not running.done():
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal stops at once
            loop.add_signal_handler(sig, m.shutdown)
        await drain(m, config.drain_timeout, health or Health())
        m.shutdown()
    stopping.cancel()
    await running
    return 0


def _quiet_cancellation(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Python 3.11's asyncio.streams asks a cancelled connection task for its exception, which
    raises CancelledError into the loop's handler: a traceback on stderr for every connection
    the shutdown ends (an idle keep-alive connection, a tunnel), though nothing went wrong
    (3.12 checks first). A cancellation is never a fault to report; anything else is."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


def _settle(m: master.Master) -> None:
    for name in _STARTUP_ONLY:
        if (addon := m.addons.get(name)) is not None:
            m.addons.remove(addon)
    # The second walk of the chain after every flow event is pure cost when no UI listens.
    mitm.skip_update_walk(m.addons)
    _freeze_when_idle(m, _FREEZE_LOOKS)


def _freeze_when_idle(m: master.Master, looks: int) -> None:
    """Take what start-up left alive out of every later collection (gc.freeze), at a moment
    with no client connection open: one open then would be frozen with it, and never collected
    once closed (nor what its flows hold). Collected first, so no garbage is frozen either. A
    worker never idle for `_FREEZE_LOOKS` looks goes on unfrozen: slower collections, nothing
    kept."""
    gate = getattr(m.addons.get("sealgate"), "gate", None)
    if gate is not None and gate.open:
        if looks > 0:
            asyncio.get_running_loop().call_later(_IDLE_LOOK, _freeze_when_idle, m, looks - 1)
        return
    gc.collect()
    gc.freeze()


def prepare(config: ProxyConfig) -> Path:
    """State directory and CA, before any worker starts (workers must not race to create them)."""
    config.state.mkdir(parents=True, exist_ok=True, mode=0o700)
    return ensure_ca(config.confdir)
