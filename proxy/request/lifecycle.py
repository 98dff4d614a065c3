"""The addon's life around its request path (pipeline.py): options and the settings object
swapped on every change, SIGHUP and the rules watcher, the per-second housekeeping (reloads,
memory, refused-connection and handshake counts, the metrics snapshot), and `_emit`, through which
every audit line is also counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import weakref
from pathlib import Path
from typing import Any

from mitmproxy import connection, ctx
from mitmproxy.addonmanager import Loader

from sealgate.reasons import Reason

from ..engine import conncap, deadline, fastdial, fastpath, memory, pool
from ..engine.conncap import ConnectionGate
from ..engine.handshake import HandshakeDeadline
from ..engine.memory import Reclaimer
from ..engine.resumption import Sessions
from ..errors import Denial
from . import settings
from .budget import BudgetLedger
from .flowstate import Conn
from .metrics import Metrics
from .settings import AddonState

logger = logging.getLogger("sealgate")

_RELOAD_POLL_SECONDS = 1.0


class Lifecycle:
    """What the addon holds and does besides deciding: its options and settings, reloads, the
    per-second housekeeping, and the audit and metrics lines every hook writes through
    `_emit`."""

    def __init__(self) -> None:
        self.state: AddonState | None = None
        self.budgets = BudgetLedger()
        self.conns: dict[str, Conn] = {}
        # The name and port an upstream dial was asked for, while it goes to the pinned address
        # (pipeline.py's server_connect to server_connected). Keyed weakly by the connection (a
        # Connection hashes and compares by its id): a dial cancelled while mitmproxy holds it
        # back (five connects at once per address) or in a later addon's server_connect hook
        # gets no hook after the one that pinned it, so no hook could pop it; weakly held, it
        # goes with the connection, for one weak reference per dial.
        self._pinned: weakref.WeakKeyDictionary[connection.Server, tuple[str, int]] = (
            weakref.WeakKeyDictionary())
        self._watcher: asyncio.Task[None] | None = None
        self._failure: tuple[object, str] | None = None  # the rules reload failure last told
        self._tick_failed: str | None = None  # the kind of the last tick's failure, told once
        self.in_flight: set[str] = set()  # flows between their request head and their end
        self.gate = ConnectionGate(conncap.default_total(), 512)
        self.reclaimer = Reclaimer()
        self.metrics = Metrics()
        self.handshakes = HandshakeDeadline()
        self.sessions = Sessions()
        self.upstream_open = 0  # upstream connections connected and not yet closed
        self.addons = [self.handshakes]  # its hooks run after this addon's

    # -- set-up ---------------------------------------------------------------------------

    def load(self, loader: Loader) -> None:
        settings.add_options(loader)

    def configure(self, updated: set[str]) -> None:
        old = self.state
        self.state = settings.configure(old, updated, ctx.options)
        settings.retire(old, self.state)
        if "sealgate_workers" in updated:
            self.budgets = BudgetLedger(share=ctx.options.sealgate_workers)
        if updated & {"sealgate_max_connections", "sealgate_max_connections_per_source"}:
            self.gate.total = ctx.options.sealgate_max_connections or conncap.default_total()
            self.gate.per_source = ctx.options.sealgate_max_connections_per_source

    def running(self) -> None:
        # The first line proves the sink works before any traffic is accepted.
        self._emit("proxy_started", pid=os.getpid(),
                   rules=[str(p) for p in self._state().rules.sources])
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        self._watcher = loop.create_task(self._every_second())

    async def done(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self.state is not None:
            await self.state.broker.close()
            self.state.audit.close()

    def reload(self, *, asked: bool = True) -> None:
        """Re-read the rules and token keys; a broken file keeps what is in force and says why:
        when asked (SIGHUP), and once per change of the file when the watcher finds it."""
        before = self._state().rules_seen.identities
        self.state, failed = settings.reload(self._state(), ctx.options)
        if failed is not None:
            failure = (self.state.rules_seen.identities, str(failed))
            if asked or failure != self._failure:
                logger.error("sealgate: rules reload failed, keeping the previous rules: %s",
                             failed)
                self._emit("rules_reload_failed", error=str(failed))
            self._failure = failure
        else:
            self._failure = None
            # The watcher reads a file again while its timestamp is too fresh to vouch for it
            # (sealgate.watch): only a read of something that changed is a reload to report.
            if asked or self.state.rules_seen.identities != before:
                self._emit("rules_reloaded", policies=sorted(self.state.rules.policies))

    async def _every_second(self) -> None:
        """Forever: one tick's unforeseen failure is said and the next tick runs, so that a
        bug in a figure never stops the rules' hot reload for the process's life."""
        while True:
            await asyncio.sleep(_RELOAD_POLL_SECONDS)
            try:
                self._tick()
            except Exception as exc:
                failed = type(exc).__name__
                if failed != self._tick_failed:  # once per kind, not once a second
                    logger.error("sealgate: the once-a-second work failed (%s); it goes on",
                                 failed)
                self._tick_failed = failed
            else:
                self._tick_failed = None

    def _tick(self) -> None:
        state = self.state
        if state is not None and state.rules_seen.changed():
            self.reload(asked=False)
        self.reclaimer.tick(idle=not self.in_flight)
        for reason, count in self.gate.take_refused().items():
            self._emit("connections_refused", reason=reason, count=count,
                       open=self.gate.open)
        if closed := self.handshakes.take_closed():
            self._emit("handshake_timeout", count=closed,
                       seconds=self.handshakes.seconds)
        dialer = fastdial.installed()
        self.metrics.total("upstream_tls_offered", self.sessions.offered + (
            dialer.offered if dialer else 0))
        self.metrics.total("upstream_tls_resumed", self.sessions.resumed + (
            dialer.resumed if dialer else 0))
        idle = dialed = reused = 0
        for kept in (pool.installed(), fastdial.installed()):
            if kept is not None:
                idle, dialed, reused = idle + len(kept), dialed + kept.dialed, reused + kept.reused
        self.metrics.total("upstream_connections", dialed, how="dialed")
        self.metrics.total("upstream_connections", reused, how="reused")
        fast = fastpath.installed()
        if fast is not None:
            self.metrics.total("fast_path_connections", fast.taken, outcome="taken")
            self.metrics.total("fast_path_connections", fast.handed, outcome="handed_over")
        if state is not None:
            self._credential_totals(state)
        with contextlib.suppress(OSError):  # a full disk costs the figures, not requests
            self.metrics.write(Path(ctx.options.sealgate_state) / "metrics", self._unready(),
                               connections_open=self.gate.open,
                               requests_in_flight=len(self.in_flight),
                               resident_bytes=memory.resident(),
                               response_deadlines_pending=deadline.pending(),
                               upstream_tls_sessions=len(self.sessions) + (
                                   len(dialer.sessions) if dialer else 0),
                               upstream_connections_open=self.upstream_open + (
                                   fast.dialer.open if fast else 0),
                               upstream_connections_idle=idle,
                               upstream_dials_pinned=len(self._pinned),
                               audit_backlog_bytes=state.audit.backlog if state else 0)

    def _credential_totals(self, state: AddonState) -> None:
        """The secret stores' and token endpoints' running counts, as the broker keeps them."""
        broker, total = state.broker, self.metrics.total
        for store, cache in broker.secrets.caches().items():
            total("secret_lookups", cache.hits, store=store, result="hit")
            for result, count in cache.lookups.items():
                total("secret_lookups", count, store=store, result=result)
            for outcome, count in cache.fetches.items():
                total("secret_fetches", count, store=store, outcome=outcome)
            total("secret_fetch_seconds", cache.fetch_seconds, store=store)
            total("secret_fetch_count", cache.fetches.total(), store=store)
        for (kind, outcome), count in broker.exchanges.outcomes.items():
            total("token_exchanges", count, kind=kind, outcome=outcome)
        for outcome, count in broker.roles.outcomes.items():
            total("token_exchanges", count, kind="aws-sts", outcome=outcome)

    def _unready(self) -> list[str]:
        """What keeps this worker from being ready (its /readyz, proxy/process/admin.py)."""
        state = self.state
        if state is None:
            return ["rules: none loaded"]
        unready = []
        if not state.audit.healthy:
            unready.append("audit: the audit log cannot be written")
        unready += [f"secrets: the {scheme} store is unavailable past its grace"
                    for scheme in state.broker.secrets.unavailable()]
        return unready

    def drained(self, *, waited: float, cut: int) -> None:
        """The drain's end (proxy/process/drain.py): what it waited for, and what it had to cut."""
        self._emit("proxy_drained", pid=os.getpid(), waited_ms=round(waited * 1000, 1),
                   cut=cut)

    def _emit(self, event: str, **fields: Any) -> None:
        self.metrics.count(event, fields)
        if self.state is not None:
            self.state.audit.emit(event, **fields)

    def _state(self) -> AddonState:
        if self.state is None:
            raise Denial(Reason.RULES_UNAVAILABLE, "the proxy is not configured")
        return self.state
