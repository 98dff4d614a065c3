"""A microVM sandbox's commands against each other and its guest agent, through sandboxd's real
API (`sandbox.tiers.microvm.hostserve` relaying to the guest): what one command does to the guest
must end that command only, never the agent (PID 1: its end is the VM's) nor the commands
running beside it. The same attacks one at a time over the agent's channel:
`tests/microvm/test_guest.py`."""

from __future__ import annotations

import time

import pytest

from sealgate.sandbox.clients.client import Result, Sandbox
from tests.microvm.kit import needs_vm
from tests.microvm.test_guest import RUNNING, TRACEME
from tests.sandboxd.conftest import Daemon, TierDaemons

pytestmark = [pytest.mark.root, needs_vm]


@pytest.fixture(scope="module")
def vmd(tier_daemons: TierDaemons) -> Daemon:
    return tier_daemons.get("microvm")


def create(daemon: Daemon) -> Sandbox:
    return Sandbox.create("ci-bot", daemon=str(daemon.socket))


def test_a_traced_command_leaves_the_others_running(vmd: Daemon) -> None:
    """A command that makes the agent its tracer and stops ends at its own timeout; the command
    running beside it finishes with all its output, and the sandbox serves on."""
    with create(vmd) as sb:
        other = sb.stream(["sh", "-c", "echo started; sleep 4; echo finished"], timeout=60)
        assert next(other) == ("stdout", b"started\n")
        traced = sb.run(["python3", "-c", TRACEME], timeout=2)
        assert (traced.exit_code, traced.ending) == (124, "timed_out"), traced
        rest = list(other)
        assert rest[0] == ("stdout", b"finished\n")
        ended = rest[-1][1]
        assert isinstance(ended, Result) and (ended.exit_code, ended.ending) == (0, "exit")
        assert sb.run(["echo", "serving"]).text == "serving\n"


def test_a_timeout_ends_the_whole_command(vmd: Daemon) -> None:
    """Past its timeout a command ends as 124 within seconds, with all it started, a child
    that left its session included (whose open output kept the end from being said at all)."""
    with create(vmd) as sb:
        for argv in (["sleep", "306"], ["sh", "-c", "setsid sleep 307 & exec sleep 306"]):
            started = time.monotonic()
            done = sb.run(argv, timeout=1)
            assert (done.exit_code, done.ending) == (124, "timed_out"), done
            assert time.monotonic() - started < 6, done
        assert "sleep 30" not in sb.run(list(RUNNING)).text


def test_kill_minus_one_ends_only_the_workload(vmd: Daemon) -> None:
    """`kill -9 -1` kills what the sandbox's uid may: its commands (the one beside it too),
    never the guest agent; the sandbox serves on."""
    with create(vmd) as sb:
        other = sb.stream(["sh", "-c", "echo started; exec sleep 308"], timeout=60)
        assert next(other) == ("stdout", b"started\n")
        assert sb.run(["sh", "-c", "kill -9 -1; echo after"]).text == "after\n"
        ended = list(other)[-1][1]
        assert isinstance(ended, Result) and (ended.exit_code, ended.signal) == (137, 9), ended
        assert sb.run(["echo", "serving"]).text == "serving\n"
