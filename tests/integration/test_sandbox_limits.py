"""Limits a hostile command cannot talk its way past: the wall clock (`--timeout`) and the rate
of its name server's answers.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from sealgate.proxy.process.controlclient import call
from sealgate.sandbox.host.dns import BURST, RATE
from sealgate.sandbox.tiers.microvm.tier import TIER as MICROVM
from tests.harness import Proxy, quiet
from tests.integration import test_sandbox as base
from tests.integration.tiers import TIERS

pytestmark = pytest.mark.root

gateway, sproxy = base.gateway, base.sproxy  # this module's own sandbox gateway and proxy

# Ignores every stop signal and leaves a grandchild in a session of its own, which would write
# to the workspace once the time limit has passed.
OUTLIVER = r"""
import os, signal, time
for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(AFTER)
        open("/workspace/outlived", "w").close()
    os._exit(0)
print("started", flush=True)
time.sleep(60)
"""


def survivors(marker: str) -> list[str]:
    """Host processes whose command line holds `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if marker.encode() in (proc / "cmdline").read_bytes():
                found.append(proc.name)
        except OSError:  # not a process, or gone
            continue
    return found


@pytest.mark.parametrize("tier", TIERS)
def test_the_time_limit_kills_the_whole_tree_and_says_124(sproxy: Proxy, tier: str) -> None:
    marker = f"# outliver-{secrets.token_hex(4)}"
    # The limit counts from the command's start: an emulated microVM's boot (seconds, more on
    # a loaded host) is not counted, or the command would never have printed. Its guest's
    # Python takes a second or two to start under emulation.
    limit = 5.0 if tier == "microvm" else 1.0
    setup = MICROVM.ready_seconds if tier == "microvm" else 0.0  # its own bound's allowance
    after = limit + 2
    workspace = Path(tempfile.mkdtemp(prefix="sg-timeout-", dir="/tmp"))
    try:
        workspace.chmod(0o777)
        started = time.monotonic()
        done = base.run(sproxy, "python3", "-c", OUTLIVER.replace("AFTER", str(after)) + marker,
                        limits=("--timeout", f"{limit:g}s", "--workspace", str(workspace)),
                        tier=tier)
        ended = time.monotonic()
        took = ended - started
        assert done.returncode == 124, done.stderr
        assert done.stdout == "started\n"
        assert "time limit" in done.stderr and quiet(done.stderr)
        assert took < limit + setup + 19  # not the 60 s the command asked for
        assert survivors(marker) == []
        assert base.leftovers() == []
        assert call(sproxy.state / "control.sock", "GET", "/v1/sources")[1] == {"sources": {}}
        # Past the moment the grandchild would have written, had anything of the tree lived
        # (the command started at the latest when the run was ended, `limit` before its end).
        time.sleep(max(0.0, ended + (after - limit) + 1 - time.monotonic()))
        assert list(workspace.iterdir()) == []
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


# One socket, one source port, as fast as it can send: conntrack sees one established flow.
FLOOD = r"""
import socket, time
server = next(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver"))
query = bytes.fromhex("123401000001000000000000") + b"\x01a\x04test\x00\x00\x01\x00\x01"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
sent = answers = 0
end = time.monotonic() + WINDOW
while time.monotonic() < end:
    try:
        s.sendto(query, (server, 53)); sent += 1
    except OSError:
        pass
    try:
        while True:
            s.recv(512); answers += 1
    except OSError:
        pass
s.settimeout(DRAIN)
try:
    while True:
        s.recv(512); answers += 1
except OSError:
    pass
print(sent, answers)
"""


@pytest.mark.parametrize("tier", TIERS)
def test_a_flood_of_queries_gets_no_more_answers_than_the_rate(sproxy: Proxy, tier: str) -> None:
    window, drain = 1.5, 0.3
    probe = FLOOD.replace("WINDOW", str(window)).replace("DRAIN", str(drain))
    done = base.run(sproxy, "python3", "-c", probe, tier=tier)
    assert done.returncode == 0, done.stderr
    sent, answers = map(int, done.stdout.split())
    allowed = BURST + RATE * (window + drain)
    assert sent > 10 * allowed  # a flood indeed
    assert RATE <= answers <= allowed * 1.25, (sent, answers)
