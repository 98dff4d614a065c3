"""`sealgate proxy`'s processes: one that serves, or a supervisor and N workers.

The control API is answered by one process only (the registry it writes is a file every worker
watches): the single process itself, or the supervisor, which runs no proxy of its own.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web

from sealgate.proxy import control
from sealgate.proxy.master import ProxyConfig, serve
from sealgate.proxy.registry import SourceRegistry

_STOP_SECONDS = 10.0  # how long workers get to finish after SIGTERM


async def serve_one(config: ProxyConfig, worker: int | None) -> int:
    """Serve in this process; as the only process (`worker` None) answer the control API too."""
    runner = None
    if worker is None:
        runner = await _start_control(config)
    try:
        return await serve(config, worker)
    finally:
        if runner is not None:
            await runner.cleanup()


async def supervise(config: ProxyConfig) -> int:
    """Run the control API here and N workers as child processes; stop them all together."""
    runner = await _start_control(config)
    # The workers run this same command line (the supervisor only starts from a real one).
    argv = sys.argv[1:]
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sealgate.cli", *argv, "--worker-index", str(i)
        )
        for i in range(config.workers)
    ]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    def forward_hup() -> None:
        for child in children:
            child.send_signal(signal.SIGHUP)

    loop.add_signal_handler(signal.SIGHUP, forward_hup)
    waits = [asyncio.ensure_future(c.wait()) for c in children]
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait([*waits, stopper], return_when=asyncio.FIRST_COMPLETED)
    code = 0 if stop.is_set() else 1  # a worker that dies on its own is a failure
    for child in children:
        if child.returncode is None:
            child.send_signal(signal.SIGTERM)
    _, stuck = await asyncio.wait(waits, timeout=_STOP_SECONDS)
    if stuck:  # a worker that ignores SIGTERM must not keep the supervisor (and port) alive
        for child in children:
            if child.returncode is None:
                child.kill()
        await asyncio.gather(*waits)
    stopper.cancel()
    await runner.cleanup()
    return code


async def _start_control(config: ProxyConfig) -> web.AppRunner:
    registry = SourceRegistry(config.state / "registry.json")
    return await control.start(control.socket_path(config.state), registry, config.rules)
