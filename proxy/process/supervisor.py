"""`sealgate proxy`'s processes: one that serves, or a supervisor and N workers.

The control API is answered by one process only (the registry it writes is a file every worker
watches): the single process itself, or the supervisor, which runs no proxy of its own.

A worker that dies is started again, after a pause that doubles from 0.1 s up to 5 s while it
keeps dying and starts over once it has stayed up for a minute; the others serve on meanwhile
(its listening socket closed with it, so the kernel sends new connections to them). A worker
that dies `_CRASH_LOOP` times within `_CRASH_WINDOW` seconds is a crash loop: the supervisor
says so, stops every worker and exits 1, instead of restarting forever. On SIGTERM every
worker drains (drain.py) and the supervisor waits for them, the control API's health
saying not ready meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections import deque

from aiohttp import web

from sealgate.hostport import format_hostport

from ..request.registry import SourceRegistry
from . import admin, control, statedir
from .drain import Health
from .master import ProxyConfig, serve

_log = logging.getLogger("sealgate.proxy")
_STOP_MARGIN = 10.0  # past the drain timeout, how long a worker may take before it is killed
_FIRST_PAUSE, _LONGEST_PAUSE = 0.1, 5.0
_STEADY_SECONDS = 60.0  # up this long, a worker's next death starts the pauses over
_CRASH_LOOP, _CRASH_WINDOW = 5, 60.0


async def serve_one(config: ProxyConfig, worker: int | None) -> int:
    """Serve in this process; as the only process (`worker` None) answer the control API too."""
    runners = []
    health = Health()
    if worker is None:
        runners = await _start_control(config, health)
    try:
        return await serve(config, worker, health)
    finally:
        await _stop_control(runners)


class _Workers:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.stopping = asyncio.Event()
        self.children: dict[int, asyncio.subprocess.Process] = {}
        self.gave_up: dict[str, object] | None = None  # the crash loop, said in the log

    async def start(self, index: int) -> asyncio.subprocess.Process:
        # The workers run this same command line (the supervisor only starts from a real one).
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sealgate.cli", *sys.argv[1:], "--worker-index", str(index)
        )
        self.children[index] = child
        return child

    async def keep(self, index: int) -> None:
        """Worker `index`, started again each time it dies, until stopping or a crash loop."""
        deaths: deque[float] = deque(maxlen=_CRASH_LOOP)
        pause = _FIRST_PAUSE
        while not self.stopping.is_set():
            started = time.monotonic()
            code = await (await self.start(index)).wait()
            if self.stopping.is_set():
                return
            now = time.monotonic()
            deaths.append(now)
            if len(deaths) == _CRASH_LOOP and now - deaths[0] < _CRASH_WINDOW:
                self.gave_up = {"worker": index, "deaths": _CRASH_LOOP,
                                "seconds": round(now - deaths[0], 1), "exit_code": code}
                self.stopping.set()
                return
            if now - started >= _STEADY_SECONDS:
                pause = _FIRST_PAUSE
            _log.warning("worker exited; starting it again",
                         extra={"worker": index, "exit_code": code, "pause_seconds": pause})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), pause)
            pause = min(pause * 2, _LONGEST_PAUSE)

    def signal_all(self, sig: signal.Signals) -> None:
        for child in self.children.values():
            if child.returncode is None:
                child.send_signal(sig)

    async def stop_all(self) -> None:
        self.signal_all(signal.SIGTERM)
        waits = [asyncio.ensure_future(c.wait()) for c in self.children.values()]
        if not waits:
            return
        _, stuck = await asyncio.wait(waits, timeout=self.config.drain_timeout + _STOP_MARGIN)
        if stuck:  # a worker that ignores SIGTERM must not keep the supervisor (and port) alive
            self.signal_all(signal.SIGKILL)
            await asyncio.gather(*waits)


async def supervise(config: ProxyConfig) -> int:
    """Run the control API here and N workers as child processes, kept running."""
    health = Health()
    runners = await _start_control(config, health)
    workers = _Workers(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, workers.stopping.set)
    loop.add_signal_handler(signal.SIGHUP, workers.signal_all, signal.SIGHUP)
    keepers = [asyncio.ensure_future(workers.keep(i)) for i in range(config.workers)]
    await workers.stopping.wait()
    health.draining = True
    await workers.stop_all()
    await asyncio.gather(*keepers)
    await _stop_control(runners)
    if workers.gave_up is not None:
        _log.error("worker crash loop, stopping", extra=workers.gave_up)
        return 1
    return 0


async def _start_control(config: ProxyConfig, health: Health) -> list[web.AppRunner]:
    """The control API on its socket and, if asked for, the admin listener over TCP (a separate
    app: nothing else of the control API is reachable there)."""
    registry = SourceRegistry(config.state / "registry.json")
    runners = [await control.start(statedir.control_socket(config.state), registry, config.rules,
                                   lambda: health.draining)]
    if config.admin is not None:
        try:
            runners.append(await admin.start(*config.admin, config.state / "metrics",
                                             config.workers, health))
        except OSError as exc:
            await runners[0].cleanup()
            _log.error("the admin listener cannot start",
                       extra={"address": format_hostport(*config.admin), "error": str(exc)})
            raise SystemExit(1) from None
    return runners


async def _stop_control(runners: list[web.AppRunner]) -> None:
    for runner in runners:
        await runner.cleanup()
