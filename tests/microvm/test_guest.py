"""What a command in the guest can do to the guest (its agent, its other commands, its root):
run as the sandbox's unprivileged uid, it is the attacker here. Driven over the agent's channel
as the tier drives it (`conftest`'s guest); sandboxd's concurrent commands are
`tests/sandboxd/test_microvm_guest.py`'s."""

from __future__ import annotations

import time

import pytest

from sealgate.sandbox.microvm.channel import Channel
from tests.microvm.kit import needs_vm, run

pytestmark = [pytest.mark.root, needs_vm]

# PTRACE_TRACEME makes the agent, the command's parent, its tracer; its next signal then stops
# it for that tracer, and the agent sees the stop when it reaps.
TRACEME = ("import ctypes, os, signal\n"
           "assert ctypes.CDLL(None, use_errno=True).ptrace(0, 0, 0, 0) == 0\n"
           "os.kill(os.getpid(), signal.SIGUSR1)\n")


def test_a_command_that_asks_the_agent_to_trace_it_ends_alone(guest: Channel) -> None:
    """The agent, whose reaper took the stop for an end and died of it (with the VM), resumes
    no one: the command stays stopped until its timeout kills it, and the guest serves on."""
    assert run(guest, "python3", "-c", TRACEME, timeout=3).code == 124
    assert run(guest, "echo", "still serving").stdout == b"still serving\n"


# The command lines of every process in the guest, as a command sees them.
RUNNING = ("sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")


def running(guest: Channel) -> str:
    listing = run(guest, *RUNNING)
    assert listing.code == 0, listing
    return listing.stdout.decode()


# Ways out of a command's session and process group: setsid(1), and a daemon's double fork
# with setsid(2) between, its output closed so that it holds nothing of the command's. Each
# says when it is out (its file in /tmp), and only then does the command end.
DETACHED = {
    "setsid": "setsid sh -c 'touch /tmp/out-301; while :; do sleep 1; done' marker-301",
    "double fork": ("python3 -c 'import os, time\nif os.fork(): os._exit(0)\nos.setsid()\n"
                    "if os.fork(): os._exit(0)\nopen(\"/tmp/out-302\", \"w\")\n"
                    "time.sleep(600)' marker-302"),
}


@pytest.mark.parametrize("detach", DETACHED.values(), ids=DETACHED.keys())
def test_nothing_a_command_detaches_outlives_it(guest: Channel, detach: str) -> None:
    """Its end kills it all, and its exit is said once they are gone: the next command finds
    nothing left (the agent killed only the command's process group, which these leave)."""
    marker = detach[-3:]
    script = (f"{detach} </dev/null >/dev/null 2>&1 &\n"
              f"while [ ! -e /tmp/out-{marker} ]; do sleep 0.05; done")
    assert run(guest, "sh", "-c", script).code == 0
    assert f"marker-{marker}" not in running(guest)


def test_a_timeout_kills_what_left_the_session(guest: Channel) -> None:
    """A timeout kills the command's whole tree: a child that left its session kept the
    command's output open, so its end was never said (the host gave up waiting) and it ran on
    to its own end."""
    started = time.monotonic()
    done = run(guest, "sh", "-c", "setsid sleep 303 & exec sleep 304", timeout=1)
    assert done.code == 124 and time.monotonic() - started < 6, done
    assert "sleep 30" not in running(guest)


def test_kill_minus_one_spares_the_agent(guest: Channel) -> None:
    """`kill -9 -1` from a command signals every process its uid may: the workload's own, never
    the agent (root, and PID 1), so the guest serves on."""
    assert run(guest, "sh", "-c", "sleep 305 & kill -9 -1; wait; echo after").stdout == b"after\n"
    assert run(guest, "echo", "serving").stdout == b"serving\n"
    assert "sleep 305" not in running(guest)
