"""The clients' own time limit, per call (`call_timeout`), against a real daemon: a call that
outlasts it raises CallTimeout (reason `client_timeout`, status 0, a TimeoutError) at about
that limit, on the sync client, the asyncio one and the CLI; a daemon that is not there is
still "cannot be reached" (`at_capacity`, status 0), never a time-out; and what a call gave up
on does not live on in the daemon (the command is killed, the create undone).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from sealgate.reasons import Reason
from sealgate.sandbox import AsyncSandbox, CallTimeout, Client, DaemonError, Sandbox
from tests.harness import ROOT, SEALGATE, Proxy, free_port
from tests.sandboxd.conftest import Daemon, start_daemon
from tests.sandboxd.test_api_input import eventually_idle
from tests.sandboxd.test_lifecycle import host


def timed_out(call: Callable[[], Any]) -> tuple[CallTimeout, float]:
    started = time.monotonic()
    with pytest.raises(CallTimeout) as caught:
        call()
    took = time.monotonic() - started
    exc = caught.value
    assert (exc.reason, exc.code, exc.status) == (Reason.CLIENT_TIMEOUT, "client_timeout", 0)
    assert isinstance(exc, TimeoutError) and "call_timeout" in str(exc), exc
    assert "cannot be reached" not in str(exc), exc
    return exc, took


def unreachable(call: Callable[[], Any]) -> None:
    with pytest.raises(DaemonError) as caught:
        call()
    exc = caught.value
    assert not isinstance(exc, CallTimeout), exc
    assert (exc.code, exc.status) == ("at_capacity", 0) and "cannot be reached" in str(exc), exc


@pytest.fixture
def sb(sandboxd: Daemon) -> Iterator[Sandbox]:
    box = Sandbox.create("ci-bot", daemon=str(sandboxd.socket))
    yield box
    box.delete()


def test_a_command_past_the_calls_limit_is_a_timeout(sb: Sandbox) -> None:
    _, took = timed_out(lambda: sb.run(["sleep", "2"], call_timeout=0.5))
    assert 0.45 <= took < 1.5, took
    _, took = timed_out(lambda: list(sb.stream(["sh", "-c", "echo one; sleep 2"],
                                               call_timeout=0.5)))
    assert 0.45 <= took < 1.5, took
    assert eventually_idle(sb)  # the caller left: its commands were killed
    # The command's own timeout is another thing: its exit 124 is an answer.
    result = sb.run(["sleep", "2"], timeout=0.3, call_timeout=5)
    assert (result.exit_code, result.ending) == (124, "timed_out")


def test_every_call_takes_its_own_limit(sb: Sandbox) -> None:
    """Each method passes its call_timeout on: one that has passed before the call is made
    is a time-out (at connect), for every call a sandbox has."""
    gone = 1e-9
    sb.write("f", b"data")
    for call in (lambda: sb.write("g", b"x", call_timeout=gone),
                 lambda: sb.read("f", call_timeout=gone),
                 lambda: sb.refresh(call_timeout=gone),
                 lambda: sb.client.list(call_timeout=gone),
                 lambda: sb.client.health(call_timeout=gone),
                 lambda: sb.delete(call_timeout=gone),
                 lambda: Sandbox.create("ci-bot", daemon=sb.client.daemon, call_timeout=gone)):
        timed_out(call)
    assert sb.read("f", call_timeout=None) == b"data"  # None: no limit


@pytest.mark.parametrize("where", ["socket", "tcp"])
def test_a_daemon_not_there_is_not_a_timeout(where: str, tmp_path: Path) -> None:
    daemon = str(tmp_path / "no.sock") if where == "socket" else f"http://127.0.0.1:{free_port()}"
    unreachable(lambda: Client(daemon).list(call_timeout=5))
    unreachable(lambda: Sandbox.create("ci-bot", daemon=daemon))

    async def create() -> None:
        await AsyncSandbox.create("ci-bot", daemon=daemon)

    unreachable(lambda: asyncio.run(create()))


def test_the_async_client_times_out_alike(sandboxd: Daemon) -> None:
    async def session() -> tuple[float, float]:
        async with AsyncSandbox.create("ci-bot", daemon=str(sandboxd.socket)) as box:
            started = time.monotonic()
            with pytest.raises(CallTimeout) as caught:
                await box.run(["sleep", "2"], call_timeout=0.5)
            took = time.monotonic() - started
            assert caught.value.code == "client_timeout" and caught.value.status == 0
            with pytest.raises(CallTimeout):
                await box.read("nothing", call_timeout=1e-9)
            done = await box.run(["echo", "after"], call_timeout=10)
            return took, float(done.exit_code == 0 and done.stdout == b"after\n")

    took, ok = asyncio.run(session())
    assert 0.45 <= took < 1.5 and ok, took


def test_the_cli_says_a_timeout_and_exits_125(sandboxd: Daemon, sb: Sandbox) -> None:
    done = subprocess.run([*SEALGATE, "sandbox", "exec", "--daemon", str(sandboxd.socket),
                           "--call-timeout", "0.5", sb.id, "--", "sleep", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 125 and "client_timeout" in done.stderr, done.stderr
    assert "cannot be reached" not in done.stderr


def leftover(daemon: Daemon) -> dict[str, Any]:
    """What a daemon still holds of sandboxes, by kind (empty: nothing). Between a create's
    start and its slot's release one of these always counts it: `preparing` until its agent's
    hello, its lease (taken in the slot's preparation, given back last) and the rest of its
    slot on the host, the sandbox while it lives, `releasing` for a teardown left behind.
    The host is counted under the links' lock (`host`), never half taken or half removed (a
    lease globbed, then removed before it was read, would fail a count without it)."""
    health = daemon.client.health()
    left = {"listed": len(daemon.client.list()),
            **{k: health[k] for k in ("sandboxes", "preparing", "releasing")},
            **host().of(daemon.process.pid)}
    return {kind: n for kind, n in left.items() if n}


def test_a_create_given_up_on_is_undone(dproxy: Proxy, tmp_path: Path) -> None:
    """Cold creates (no pool: a slot is made for each, hundreds of ms) past tiny limits, the
    caller gone while its slot was being made: time-outs, and the daemon is left with no
    sandbox and no slot (a slot abandoned halfway was never released)."""
    daemon = start_daemon(dproxy, tmp_path, "--pool", "0", "--no-selftest")
    try:
        # All well under a cold create here (it has taken under 0.1 s on an idle machine).
        for limit in (0.003, 0.01, 0.02, 0.04):
            timed_out(partial(Sandbox.create, "ci-bot", daemon=str(daemon.socket),
                              call_timeout=limit))
        # A round trip first: on a loaded machine the daemon may not yet have read the creates
        # given up on, and nothing would count them yet. Its loop takes connections and their
        # requests in order, so once this is answered each was cancelled before it began or
        # has begun, and is counted (`preparing` first) by the next request until it is
        # undone, which is waited for: bounded, not timed (teardowns slow under load).
        daemon.client.health()
        deadline = time.monotonic() + 60
        while (left := leftover(daemon)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == {}, left
        with Sandbox.create("ci-bot", daemon=str(daemon.socket), call_timeout=60) as made:
            assert made.run(["echo", "ok"]).stdout == b"ok\n"
    finally:
        daemon.stop()
