"""`sealgate sandboxd --isolation gvisor`: the warm pool's sandboxes on gVisor's kernel, with the
agent inside (its channel on its stdin) and every command confined alike.

The daemon starts with its self-test (a canary sandbox tries every forbidden way out, judged
by what reached the daemon's own listeners), so a ready gVisor daemon has already shown the
network boundary holding for this tier. What the bubblewrap daemon's tests read from the host
(processes, cgroups) is inside gVisor's kernel here, so these read it from inside.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.sandbox import tiers
from sealgate.sandbox.clients.client import DaemonError, Sandbox
from sealgate.sandbox.host.network import RUN_DIR
from tests.harness import ROOT, SEALGATE, Origin, quiet
from tests.sandboxd.conftest import UID_BASE, Daemon, TierDaemons
from tests.sandboxd.test_sessions import BASE_ENV, ESCAPES

pytestmark = [pytest.mark.root, pytest.mark.skipif(
    tiers.available("gvisor") is not None,
    reason=f"isolation gvisor: {tiers.available('gvisor')}")]

POOL = 1
# gVisor's /proc/self/status has no CapAmb, NoNewPrivs or Seccomp lines: prctl says.
PROBE = r"""
import ctypes, json, os
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
libc = ctypes.CDLL(None, use_errno=True)
print(json.dumps({
    "status": {k: status[k].split() for k in
               ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd")},
    "no_new_privs": libc.prctl(39, 0, 0, 0, 0),  # PR_GET_NO_NEW_PRIVS
    "ambient": [libc.prctl(47, 1, c, 0, 0) for c in range(41)],  # PR_CAP_AMBIENT_IS_SET
    "kernel": os.uname().release, "cwd": os.getcwd(), "env": sorted(os.environ),
}))
"""
BOMB = """
import os, time
children = 0
for _ in range(400):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
    except BlockingIOError:
        break
print(children)
"""


@pytest.fixture(scope="module")
def gvisord(tier_daemons: TierDaemons) -> Daemon:
    return tier_daemons.get("gvisor")  # its pool: POOL


@pytest.fixture
def sb(gvisord: Daemon) -> Iterator[Sandbox]:
    made = Sandbox.create("ci-bot", daemon=str(gvisord.socket))
    yield made
    made.delete()


def gvisor_dirs() -> list[Path]:
    return sorted(RUN_DIR.glob("gvisor-*"))


def test_every_command_runs_on_gvisor_confined_alike(sb: Sandbox, origin_https: Origin) -> None:
    assert sb.info["isolation"] == "gvisor"
    uid = str(sb.info["uid"])
    seen = []
    for argv in (["python3", "-c", PROBE], ["sh", "-c", 'python3 -c "$0" & wait', PROBE]):
        done = sb.run(argv)
        assert done.ok, done.stderr
        seen.append(json.loads(done.stdout))
    for probe in seen:
        status = probe["status"]
        assert status["Uid"] == [uid] * 4 and status["Gid"] == [uid] * 4
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd"):
            assert int(status[cap][0], 16) == 0, (cap, status[cap])
        assert probe["no_new_privs"] == 1 and set(probe["ambient"]) <= {0, -1}
        assert probe["kernel"] == "4.4.0"  # gVisor's, not the host's
        assert probe["cwd"] == "/workspace"
        assert set(probe["env"]) - {"PWD"} <= BASE_ENV
    assert int(uid) >= UID_BASE
    # A session: what one command leaves in the writable layer, the next finds; files in
    # and out through the API; the proxy's CA trusted by a real client.
    assert sb.run(["sh", "-c", "echo kept > notes && mkdir -p ~/.cache"]).ok
    assert sb.run(["cat", "/workspace/notes"]).stdout == b"kept\n"
    sb.write("/workspace/in.txt", b"from the host\n")
    assert sb.read("/workspace/in.txt") == b"from the host\n"
    got = sb.run(["curl", "-sS", "-m", "10", f"https://api.test:{origin_https.port}/gv"])
    assert (got.exit_code, got.stdout) == (0, b"hello from origin\n"), got.stderr


def test_nothing_outlives_its_command(sb: Sandbox) -> None:
    """gVisor's kernel makes no shim a subreaper: what detaches goes to the agent, which kills
    it at its next look (within half a second)."""
    done = sb.run(["sh", "-c", ESCAPES])
    assert (done.exit_code, done.text) == (0, "started\n"), done.stderr
    listing = ""
    for _ in range(40):  # the agent looks every half second
        listing = sb.run(["sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; "
                                      "echo; done"]).text
        if "sleep 300" not in listing:
            break
        time.sleep(0.1)
    assert "sleep 300" not in listing, listing
    assert "agent" in listing  # what it lists is the sandbox's processes


def test_a_timeout_kills_its_command(sb: Sandbox) -> None:
    start = time.monotonic()
    done = sb.run(["sh", "-c", "sleep 3011 & echo begun; wait"], timeout=0.5)
    assert (done.exit_code, done.ending, done.text) == (124, "timed_out", "begun\n")
    assert time.monotonic() - start < 5
    assert sb.run(["true"]).ok  # the sandbox goes on serving


def test_the_process_limit_of_create_holds_inside(gvisord: Daemon) -> None:
    with Sandbox.create("ci-bot", daemon=str(gvisord.socket), limits={"pids": 48}) as small:
        done = small.run(["python3", "-c", BOMB], timeout=60)
        assert done.ok, done.stderr
        # At most 48 of the sandbox's uid, the bomb's own process among them: gVisor's kernel
        # lets one more through than Linux's (its check follows the count).
        assert 0 < int(done.text) <= 48
        assert small.run(["true"]).ok  # the bomb failed its forks; the sandbox lives
        # The limit is the command's hard one too: it cannot raise it back.
        raise_it = ("import resource; r = resource.RLIMIT_NPROC; print(resource.getrlimit(r))\n"
                    "try:\n resource.setrlimit(r, (4096, 4096)); print('raised')\n"
                    "except ValueError: print('refused')")
        assert small.run(["python3", "-c", raise_it]).text == "(48, 48)\nrefused\n"


def test_deleting_leaves_only_the_pool(gvisord: Daemon) -> None:
    made = Sandbox.create("ci-bot", daemon=str(gvisord.socket))
    assert made.run(["true"]).ok
    made.delete()
    for _ in range(100):  # the pool refills behind the delete
        if len(gvisor_dirs()) == POOL and gvisord.client.health()["pool"] == POOL:
            break
        time.sleep(0.1)
    assert len(gvisor_dirs()) == POOL


def test_a_caller_requiring_a_tier_gets_it_or_a_refusal(gvisord: Daemon) -> None:
    with Sandbox.create("ci-bot", daemon=str(gvisord.socket), isolation="gvisor") as made:
        assert made.info["isolation"] == "gvisor"
    with pytest.raises(DaemonError) as refused:
        Sandbox.create("ci-bot", daemon=str(gvisord.socket), isolation="bwrap")
    assert refused.value.status == 400 and "gvisor" in str(refused.value)
    cli = subprocess.run([*SEALGATE, "sandbox", "create", "ci-bot", "--daemon",
                          str(gvisord.socket), "--isolation", "microvm"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cli.returncode != 0 and "gvisor" in cli.stderr and quiet(cli.stderr)
