"""A command is the attacker: it cannot reach the agent, outlive itself, read a later command's
inputs or forge its results, on any tier (#22).

The attack runs as an ordinary command of a sandbox: to every process it can see but itself it
opens /proc/N/mem for writing and lists /proc/N/fd (where the agent holds its channel), sends
SIGSTOP, then SIGKILL, then `kill -9 -1`; then it leaves a spy behind (detached: a session of
its own, double fork) that beats a heartbeat into the workspace and copies anything carrying
the canary from every process's command line and environment it can read. The harness then
runs the next command with canaries in its argv, environment and stdin and checks, from the
host's side: the attack's own end was reported, the next command's output is the real one, the
spy is dead (its heartbeat stopped, nothing stolen), and the sandbox serves on. On the code
before, the agent was stopped or killed (the sandbox ended, the next exec lost) and on
bubblewrap PID 1 held the channel.
"""

from __future__ import annotations

import json
import time

import pytest

from sealgate.sandbox.clients.client import DaemonError, Sandbox
from tests.integration.test_sandbox import SOCKET_OPTIONS
from tests.integration.tiers import TIERS
from tests.sandboxd.conftest import Daemon, TierDaemons

pytestmark = [pytest.mark.root]

CANARY = "CANARY-7d1e"
ATTACK = """
import errno, json, os, signal, sys, time
me = os.getpid()

def visible():
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me)

seen = {"visible": {}, "mem_opened": [], "fds_listed": [], "fds_opened": [],
        "signalled": []}
for pid in visible():
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            seen["visible"][pid] = fh.read().replace(b"\\0", b" ").decode(errors="replace")
    except OSError:
        seen["visible"][pid] = "?"
    try:
        os.close(os.open(f"/proc/{pid}/mem", os.O_RDWR))
        seen["mem_opened"].append(pid)
    except OSError:
        pass
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        seen["fds_listed"].append([pid, [os.readlink(f"/proc/{pid}/fd/{n}") for n in fds]])
    except OSError:
        pass
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        names = []
    for n in names:
        try:  # a socket never opens so; /dev/null (the agent's output on gVisor) is nothing
            fd = os.open(f"/proc/{pid}/fd/{n}", os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        if os.fstat(fd).st_rdev != os.makedev(1, 3):
            seen["fds_opened"].append([pid, int(n)])
        os.close(fd)
for sig in (signal.SIGSTOP, signal.SIGKILL):
    for pid in visible():
        try:
            os.kill(pid, sig)
            seen["signalled"].append([pid, int(sig)])
        except OSError:
            pass
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass

# The spy: detached from the command every way a daemon detaches.
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open("/workspace/heartbeat", "a") as beat:
                beat.write(".")
            for pid in os.listdir("/proc"):
                for what in ("cmdline", "environ"):
                    try:
                        with open(f"/proc/{pid}/{what}", "rb") as fh:
                            data = fh.read()
                    except OSError:
                        continue
                    if ("CAN" + "ARY-7d1e").encode() in data:  # not its own text
                        with open("/workspace/stolen", "ab") as out:
                            out.write(data + b"\\n")
            time.sleep(0.05)
        os._exit(0)
    os._exit(0)
os.wait()
time.sleep(0.3)  # the spy is running
print(json.dumps(seen))
"""
# The next command: its inputs carry the canary; its output says what it got.
NEXT = ["sh", "-c", 'read line; echo "$0 $SECRET_INPUT $line"; sleep 1', f"argv-{CANARY}"]


@pytest.fixture(scope="module", params=TIERS)
def tierd(request: pytest.FixtureRequest, tier_daemons: TierDaemons) -> tuple[str, Daemon]:
    tier = str(request.param)
    return tier, tier_daemons.get(tier)


def _size(sb: Sandbox, path: str) -> int:
    try:
        return len(sb.read(path))
    except DaemonError as exc:
        assert exc.code == "no_such_file", exc
        return 0


def test_a_command_cannot_reach_the_agent(tierd: tuple[str, Daemon]) -> None:
    tier, daemon = tierd
    with Sandbox.create("ci-bot", daemon=str(daemon.socket)) as sb:
        attack = sb.run(["python3", "-c", ATTACK], timeout=60)
        # Its own end was reported: the agent was not stopped or killed.
        assert (attack.exit_code, attack.ending) == (0, "exit"), attack
        seen = json.loads(attack.stdout)
        # Nothing it could see holds the agent's channel or lets itself be written: what it
        # could open is its own (on bubblewrap its init, on gVisor and the microVM the agent,
        # root there, which it cannot open).
        assert seen["mem_opened"] == [] and seen["fds_opened"] == [], seen
        sockets = [(pid, fds) for pid, fds in seen["fds_listed"]
                   if any(fd.startswith("socket:") for fd in fds)]
        assert sockets == [], seen

        done = sb.run(NEXT, env={"SECRET_INPUT": f"env-{CANARY}"},
                      stdin=f"stdin-{CANARY}\n".encode(), timeout=30)
        assert (done.exit_code, done.text) == \
            (0, f"argv-{CANARY} env-{CANARY} stdin-{CANARY}\n"), done

        # The spy died with its command: its heartbeat does not grow, it stole nothing.
        first = _size(sb, "heartbeat")
        time.sleep(0.6)
        assert _size(sb, "heartbeat") == first, f"{tier}: the spy outlived its command"
        assert _size(sb, "stolen") == 0, sb.read("stolen")
        assert sb.run(["echo", "serving"]).text == "serving\n"


def test_socket_options_that_need_net_admin_are_refused(tierd: tuple[str, Daemon]) -> None:
    """The same refusals for sandboxd's commands as for one-shot runs (test_sandbox)."""
    _, daemon = tierd
    with Sandbox.create("ci-bot", daemon=str(daemon.socket)) as sb:
        done = sb.run(["python3", "-c", SOCKET_OPTIONS])
        assert done.text.split("\n") == ["SO_MARK 1", "IP_TRANSPARENT 1", "SO_RCVBUFFORCE 1",
                                         ""], done
