"""The proxy's event loop (proxy/engine/eventloop.py): asyncio's unless uvloop is asked for, and a
clear refusal for a loop that cannot be had. Both loops serving real traffic:
tests/unit/test_tunnel_splice.py runs its proxy on each."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import uvloop

from sealgate.proxy.engine import eventloop


async def _which() -> str:
    return eventloop.name(asyncio.get_running_loop())


def test_each_loop_is_the_one_asked_for() -> None:
    assert eventloop.run(_which(), "uvloop") == "uvloop"
    assert eventloop.run(_which(), "asyncio") == "asyncio"


def test_without_uvloop_asking_for_it_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    assert eventloop.run(_which(), "asyncio") == "asyncio"
    with pytest.raises(eventloop.EventLoopUnavailable, match="uvloop is not installed"):
        eventloop.factory("uvloop")


def test_the_splice_knows_both_loops_transports() -> None:
    async def transports() -> list[bool]:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        async with server:
            _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            writer.close()
            return [eventloop.stream_transport(writer.transport),
                    eventloop.stream_transport(object())]

    assert eventloop.run(transports(), "asyncio") == [True, False]
    assert eventloop.run(transports(), "uvloop") == [True, False]
    assert not issubclass(uvloop.loop.TCPTransport, asyncio.Transport)  # why it is not isinstance


@pytest.mark.parametrize(("args", "env"), [
    (["--event-loop", "trio"], {}),
    ([], {"SEALGATE_EVENT_LOOP": "trio"}),  # argparse does not check a default's choices
])
def test_an_unknown_loop_is_refused_before_anything_starts(
    args: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sealgate.cli", "proxy", "--listen", "127.0.0.1:0",
         "--state", str(tmp_path), *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode != 0
    assert "--event-loop" in done.stderr and "trio" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(os.scandir(str(tmp_path)))  # refused before any state was made
