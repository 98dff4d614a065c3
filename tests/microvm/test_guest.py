"""What a command in the guest can do to the guest (its agent, its other commands, its root):
run as the sandbox's unprivileged uid, it is the attacker here. Driven over the agent's channel
as the tier drives it (`conftest`'s guest); sandboxd's concurrent commands are
`tests/sandboxd/test_microvm_guest.py`'s."""

from __future__ import annotations

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
