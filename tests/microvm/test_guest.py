"""What a command in the guest can do to the guest (its agent, its other commands, its root):
run as the sandbox's unprivileged uid, it is the attacker here. Driven over the agent's channel
as the tier drives it (`conftest`'s guest); sandboxd's concurrent commands are
`tests/sandboxd/test_microvm_guest.py`'s."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from sealgate.sandbox.tiers.microvm.channel import Channel
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


# Programs of the host's /usr (the guest's, shared) that would run with more than their
# caller's rights: setuid root, or with file capabilities.
SETUID_ROOT = ("/usr/lib/polkit-1/polkit-agent-helper-1", "/usr/bin/passwd", "/usr/bin/su",
               "/usr/bin/mount", "/usr/bin/newgrp", "/usr/bin/chsh", "/usr/bin/gpasswd")
FILE_CAPS = ("/usr/lib/x86_64-linux-gnu/gstreamer1.0/gstreamer-1.0/gst-ptp-helper",
             "/usr/bin/ping", "/usr/bin/mtr-packet", "/usr/bin/arping", "/usr/bin/fping")
# Runs a program and reports its effective uid and capabilities: read once it has exited but
# before it is reaped (WNOWAIT), when its exec is over and its credentials final.
RIGHTS = """
import os, sys
null = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDWR, 0), (os.POSIX_SPAWN_DUP2, 0, 1),
        (os.POSIX_SPAWN_DUP2, 0, 2)]
pid = os.posix_spawn(sys.argv[1], [sys.argv[1]], {}, file_actions=null)
os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
print(status["Uid"].split()[1], int(status["CapEff"], 16))
"""


def setuid_root(path: str) -> bool:
    found = Path(path)
    return found.is_file() and found.stat().st_uid == 0 and bool(found.stat().st_mode
                                                                 & stat.S_ISUID)


def file_caps(path: str) -> bool:
    try:
        return bool(os.getxattr(path, "security.capability"))
    except OSError:
        return False


def test_no_program_runs_with_more_rights_than_its_command(guest: Channel) -> None:
    """A setuid-root program of the shared /usr ran with euid 0 (polkit's helper): /usr is
    mounted nosuid (which ignores file capabilities too), and every command inherits the
    agent's no_new_privs."""
    programs = [p for p in SETUID_ROOT if setuid_root(p)] + [p for p in FILE_CAPS if file_caps(p)]
    if not programs:
        pytest.skip("no setuid-root or file-capability program in this host's /usr")
    for program in programs:
        done = run(guest, "python3", "-c", RIGHTS, program)
        assert (done.code, done.stdout) == (0, b"65534 0\n"), (program, done)
    status = run(guest, "cat", "/proc/self/status").stdout.decode()
    assert "NoNewPrivs:\t1" in status
    mountinfo = run(guest, "cat", "/proc/self/mountinfo").stdout.decode().splitlines()
    options = {line.split()[4]: set(line.split()[5].split(",")) for line in mountinfo}
    for place in ("/usr", "/tmp", "/home", "/run", "/workspace", "/proc", "/sys"):
        assert {"nosuid", "nodev"} <= options[place], (place, options[place])
    assert "nosuid" in options["/dev"]


# Tries to make a file in each place given, and says how it went.
CREATE = """
import errno, os, sys
for place in sys.argv[1:]:
    try:
        os.close(os.open(os.path.join(place, "made-by-a-command"), os.O_CREAT | os.O_WRONLY, 0o600))
        print(place, "made")
    except OSError as exc:
        print(place, errno.errorcode[exc.errno])
"""


def test_only_the_scratch_places_are_writable(guest: Channel) -> None:
    """The guest's root (the initramfs, which was writable by anyone at / itself) is read-only,
    for root too; the system /usr too; a command writes in /tmp, /var/tmp, its home and the
    workspace, as on the other tiers."""
    read_only = ["/", "/etc", "/root", "/sealgate", "/usr/bin", "/home"]
    scratch = ["/tmp", "/var/tmp", "/home/sandbox", "/workspace"]
    done = run(guest, "python3", "-c", CREATE, *read_only, *scratch)
    assert done.code == 0, done
    said = dict(line.split() for line in done.stdout.decode().splitlines())
    assert said == {**{p: "EROFS" for p in read_only[:-1]}, "/home": "EACCES",
                    **{p: "made" for p in scratch}}
