"""What a sandbox can read about its host: not the runtime's paths, not the host's name, not
its kernel command line, not its cgroup paths (docs/sandbox.md lists what it still can).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Proxy
from tests.integration import test_sandbox as base
from tests.integration.tiers import TIERS

pytestmark = pytest.mark.root

gateway, sproxy = base.gateway, base.sproxy  # this module's own sandbox gateway and proxy

# Everything a process inside can read that has named the host's paths or the host: its mount
# table, its cgroups, the kernel's command line, and the command line of every process it sees
# (PID 1 is bubblewrap, whose arguments held the host's paths).
PROBE = r"""
import json, os, socket
def read(path):
    try:
        with open(path, "rb") as f: return f.read().decode(errors="replace")
    except OSError as e: return "<" + type(e).__name__ + ">"
texts = {p: read(p) for p in ("/proc/self/mountinfo", "/proc/self/mounts", "/proc/self/cgroup",
         "/proc/cmdline", "/etc/hostname", "/etc/hosts", "/proc/sys/kernel/hostname",
         "/etc/machine-id")}
for pid in filter(str.isdigit, os.listdir("/proc")):
    texts["/proc/%s/cmdline" % pid] = read("/proc/%s/cmdline" % pid).replace("\0", " ")
    texts["/proc/%s/environ" % pid] = read("/proc/%s/environ" % pid).replace("\0", " ")
texts["gethostname"], texts["uname"] = socket.gethostname(), os.uname().nodename
print(json.dumps(texts))
"""


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    """A workspace the sandbox's user can reach, under a name that is easy to look for."""
    path = Path(tempfile.mkdtemp(prefix="sg-host-side-workspace-", dir="/tmp"))
    try:
        path.chmod(0o777)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("tier", TIERS)
def test_the_sandbox_learns_no_host_path_name_or_boot_line(sproxy: Proxy, tier: str) -> None:
    with workspace() as ws:
        done = base.run(sproxy, "python3", "-c", PROBE, limits=("--workspace", str(ws)),
                        tier=tier)
    assert done.returncode == 0, done.stderr
    texts: dict[str, str] = json.loads(done.stdout)
    host = socket.gethostname()
    boot_line = Path("/proc/cmdline").read_text().strip()
    mountinfo = texts["/proc/self/mountinfo"].splitlines()
    assert any(" /workspace " in line for line in mountinfo)  # the probe saw the mounts
    for name, text in texts.items():
        assert "/run/sealgate/run-" not in text, name  # no staged file comes from a host path
        assert "/run/sealgate/gvisor-" not in text, name  # nor from gVisor's bundle
        assert "sealgate/run-" not in text, name  # nor does the cgroup's name show
        if boot_line:
            assert boot_line not in text, name
        assert host not in text.split(), name
    # bubblewrap's is empty; gVisor's kernel has its own boot line
    assert texts["/proc/cmdline"] == ("BOOT_IMAGE=/vmlinuz-4.4.0-gvisor quiet\n"
                                      if tier == "gvisor" else "")
    assert texts["gethostname"] == texts["uname"] == "sandbox"
    if Path("/etc/machine-id").is_file():
        assert texts["/etc/machine-id"] != Path("/etc/machine-id").read_text()
    # The workspace's own path within its filesystem is the one thing left under bubblewrap:
    # the kernel prints a bind mount's source in its mountinfo line, and no bind can hide it
    # (docs/sandbox.md). gVisor's kernel prints none, nor does the microVM's (9p shows its tag).
    for name, text in texts.items():
        if name != "/proc/self/mountinfo":
            assert str(ws) not in text, name
    assert [line.split()[4] for line in mountinfo if str(ws) in line] == \
        (["/workspace"] if tier == "bwrap" else [])
