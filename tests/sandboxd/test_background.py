"""Background processes (#25): started with a handle, their output read from an offset and
again after a reconnect, what fell out of the ring reported, stdin written and closed, killed,
and ended with their sandbox."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from sealgate.reasons import Reason
from sealgate.sandbox.clients.aclient import AsyncSandbox
from sealgate.sandbox.clients.client import DaemonError, Sandbox

from .conftest import Daemon
from .test_sessions import host_processes


@pytest.fixture
def sb(sandboxd: Daemon) -> Iterator[Sandbox]:
    with Sandbox.create("ci-bot", daemon=str(sandboxd.socket)) as made:
        yield made


def _text(events: list[tuple[str, object]], name: str = "stdout") -> bytes:
    return b"".join(data for kind, data in events if kind == name and isinstance(data, bytes))


def test_output_from_an_offset_and_after_a_reconnect(sb: Sandbox) -> None:
    proc = sb.start(["sh", "-c", "for i in 1 2 3; do echo line $i; done; echo oops >&2; "
                                 "read answer; echo got $answer; exit 7"])
    assert proc.info["state"] == "running" and proc.pid >= 1
    deadline = time.monotonic() + 10
    seen = b""
    while b"line 3" not in seen and time.monotonic() < deadline:  # not following: what is there
        seen += _text(list(proc.output()))
        time.sleep(0.05)
    assert seen == b"line 1\nline 2\nline 3\n", seen
    mark = proc.offset
    # A second reader (a harness that reconnected) from the start sees it all again, stderr
    # included, in order.
    again = list(proc.output(0))
    assert _text(again) == seen and _text(again, "stderr") in (b"", b"oops\n")
    proc.write(b"forty-two\n", close=True)
    rest = list(proc.output(mark, follow=True))
    assert _text(rest) == b"got forty-two\n"
    kind, result = rest[-1]
    assert kind == "exit" and result.exit_code == 7, rest  # type: ignore[union-attr]
    assert proc.wait().exit_code == 7
    listed = {p.pid: p.info for p in sb.processes()}
    assert listed[proc.pid]["state"] == "exited" and listed[proc.pid]["argv"][0] == "sh"
    with pytest.raises(DaemonError) as refused:
        proc.write(b"late")
    assert refused.value.reason is Reason.BAD_REQUEST  # its stdin was closed


def test_a_full_stdin_write_arrives_whole(sb: Sandbox) -> None:
    proc = sb.start(["wc", "-c"])
    proc.write(b"s" * (1 << 20), close=True)  # the most one write may carry
    assert proc.wait().ok
    assert _text(list(proc.output(0))).strip() == str(1 << 20).encode()


def test_what_fell_out_of_the_ring_is_said(sb: Sandbox) -> None:
    proc = sb.start(["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo end"])
    assert proc.wait().ok
    events = list(proc.output(0))
    assert events[0][0] == "lost" and int(events[0][1]) > 1_000_000, events[0]  # type: ignore[arg-type]
    kept = _text(events)
    assert kept.endswith(b"x\nend\n") and len(kept) <= 1 << 20
    assert int(events[0][1]) + len(kept) == 3_000_005  # nothing skipped unsaid


def test_kill_and_the_sandboxs_end(sandboxd: Daemon) -> None:
    sb = Sandbox.create("ci-bot", daemon=str(sandboxd.socket))
    try:
        killed = sb.start(["sleep", "300"])
        kept = sb.start(["sh", "-c", "sleep 301"])
        killed.kill()
        ended = killed.wait(call_timeout=20)
        assert ended.ending == "killed" and ended.exit_code != 0, ended
        assert sb.refresh()["running"] >= 1  # the other one holds the sandbox busy
        with pytest.raises(DaemonError) as refused:
            sb.client.call("POST", f"/v1/sandboxes/{sb.id}/processes/{kept.pid}/signal",
                           {"signal": "STOP"})  # pausing the sandbox is the way to freeze
        assert refused.value.reason is Reason.UNSUPPORTED
        for pid in ("999", "abc", "-1"):
            with pytest.raises(DaemonError) as refused:
                sb.client.call("GET", f"/v1/sandboxes/{sb.id}/processes/{pid}")
            assert refused.value.reason is Reason.NO_SUCH_PROCESS, pid
        with pytest.raises(DaemonError) as refused:
            sb.client.call("GET", f"/v1/sandboxes/{sb.id}/processes/{kept.pid}/output"
                                  "?offset=-5")
        assert refused.value.reason is Reason.BAD_REQUEST
        uid = sb.info["uid"]
        assert any("sleep 301" in line for line in host_processes(uid).values())
    finally:
        sb.delete()
    deadline = time.monotonic() + 10  # nothing of it outlives its sandbox
    while host_processes(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes(uid) == {}


def test_the_async_client_too(sandboxd: Daemon) -> None:
    async def drive() -> None:
        async with AsyncSandbox.create("ci-bot", daemon=str(sandboxd.socket)) as sb:
            proc = await sb.start(["sh", "-c", "echo ready; read x; echo got $x"])
            await proc.write(b"it\n", close=True)
            events = [event async for event in proc.output(follow=True)]
            assert b"".join(d for k, d in events if k == "stdout") == b"ready\ngot it\n"
            assert events[-1][0] == "exit" and (await proc.wait()).ok
            sleeper = await sb.start(["sleep", "300"])
            await sleeper.kill()
            assert (await sleeper.wait()).ending == "killed"

    asyncio.run(drive())


def test_a_retried_start_gets_the_same_process(sb: Sandbox) -> None:
    first = sb.start(["sleep", "300"], idempotency_key="start-1")
    again = sb.start(["sleep", "300"], idempotency_key="start-1")
    assert again.pid == first.pid and len(sb.processes()) == 1
    with pytest.raises(DaemonError) as refused:
        sb.start(["sleep", "301"], idempotency_key="start-1")
    assert refused.value.reason is Reason.BAD_REQUEST
    with pytest.raises(DaemonError) as refused:  # a stream cannot be given twice
        sb.client.call("POST", f"/v1/sandboxes/{sb.id}/exec",
                       {"argv": ["true"], "stream": False}, headers={"Idempotency-Key": "x"})
    assert refused.value.reason is Reason.BAD_REQUEST
