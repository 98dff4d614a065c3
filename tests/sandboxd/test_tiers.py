"""`sealgate sandboxd --isolation T` for every tier this machine can run: the same daemon, API
and host-side boundary, whatever runs the workload.

Each tier's daemon starts with its self-test (a canary sandbox tries every forbidden way out,
judged by what reached the daemon's own listeners), so a ready daemon has shown the network
boundary holding on its tier. Then, through the real API: a command's output streamed and its
status, files in and out, the kernel it runs on (the host's for bubblewrap, gVisor's, or the
guest's own in a microVM), HTTPS and plain HTTP through the proxy with its CA trusted, two
sandboxes that share nothing (for a microVM, two VMs: two kernels, two QEMUs), and a delete
that leaves nothing but the refilled pool: no process of the sandbox's (QEMU included), no
namespace (its tap and bridge were in it), link, table, mount or registration.

Where KVM cannot run the microVM's guest, it runs under emulation (`tests.integration.tiers`).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sealgate.reasons import Reason
from sealgate.sandbox.clients.client import DaemonError, Sandbox
from tests.harness import Origin, Proxy
from tests.integration.tiers import TIERS
from tests.sandboxd.conftest import UID_BASE, Daemon, TierDaemons
from tests.sandboxd.test_lifecycle import gone_or_ended, picture, same_as

pytestmark = [pytest.mark.root]

BOOT_ID = ["cat", "/proc/sys/kernel/random/boot_id"]
POOL = 1  # a microVM is ~300 MiB and seconds of emulated boot
STRONG = {"gvisor", "microvm"}  # tiers whose workload runs on a kernel that is not the host's
_FETCH = """
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode(), end="")
"""


@pytest.fixture(scope="module", params=TIERS)
def tierd(request: pytest.FixtureRequest, tier_daemons: TierDaemons) -> tuple[str, Daemon]:
    tier = str(request.param)
    return tier, tier_daemons.get(tier)  # its pool: POOL


def create(daemon: Daemon) -> Sandbox:
    return Sandbox.create("ci-bot", daemon=str(daemon.socket))


def qemus(uid: int) -> list[int]:
    """QEMU processes running as `uid` (a microVM sandbox's: QEMU runs as its uid)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().startswith("qemu-system") \
                    and proc.stat().st_uid == uid:
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_commands_files_and_the_proxy(tierd: tuple[str, Daemon], origin_https: Origin) -> None:
    tier, daemon = tierd
    with create(daemon) as sb:
        assert sb.info["isolation"] == tier and sb.info["uid"] >= UID_BASE
        kernel = sb.run(["uname", "-r"])
        assert kernel.ok, kernel.stderr
        assert (kernel.text.strip() != os.uname().release) == (tier in STRONG), kernel.text
        # Output streams as it comes: the first line arrives while the command still runs.
        events = sb.stream(["sh", "-c", "echo first; sleep 2; echo second >&2; exit 3"])
        start = time.monotonic()
        first = next(events)
        assert first == ("stdout", b"first\n") and time.monotonic() - start < 2
        rest = list(events)
        assert rest[0] == ("stderr", b"second\n")
        assert rest[-1][0] == "exit" and rest[-1][1].exit_code == 3  # type: ignore[union-attr]
        done = sb.run(["sh", "-c", "cat; kill -TERM $$"], stdin=b"in\n")
        assert (done.exit_code, done.signal, done.stdout) == (143, 15, b"in\n")
        assert sb.run(["sleep", "30"], timeout=1).ending == "timed_out"
        # A command's own exit codes that look like a signal's or a timeout's are its own.
        for code in (143, 124):
            own = sb.run(["sh", "-c", f"exit {code}"], timeout=30)
            assert (own.exit_code, own.signal, own.ending) == (code, None, "exit"), own
        assert sb.run(["pwd"]).text == "/workspace\n"
        # Only its standard streams go to a command: none of the agent's or its status's.
        fds = sb.run(["python3", "-c", "import os; print(sorted(os.listdir('/proc/self/fd')))"])
        assert fds.text == "['0', '1', '2', '3']\n", fds  # 3: the listing's own
        # Signals a program expects at their default, Python's ignored ones reset: a writer to
        # a closed pipe dies of SIGPIPE (141), not of EPIPE (1); SigIgn, where /proc has it
        # (gVisor's has not), shows SIGXFSZ too.
        piped = sb.run(["sh", "-c", "(yes; echo $? >&2) | head -c1 > /dev/null"])
        assert piped.stderr.strip().endswith(b"141"), piped
        status = sb.run(["cat", "/proc/self/status"]).text
        for line in status.splitlines():
            if line.startswith("SigIgn:"):
                ignored = int(line.split()[1], 16)
                assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))
        missing = sb.run(["no-such-program-anywhere"])
        assert missing.exit_code == 127  # why: in `error`, or the microVM's guest on stderr
        assert "no-such-program-anywhere" in (missing.error or missing.stderr.decode())
        sb.write("dir/in.txt", b"from the host\n" * 10_000)
        assert sb.run(["sh", "-c", "wc -c < dir/in.txt"]).text.strip() == "140000"
        assert sb.run(["sh", "-c", "echo made inside > out.txt"]).ok
        assert sb.read("out.txt") == b"made inside\n"
        assert sb.read("dir/in.txt") == b"from the host\n" * 10_000
        # Real clients through the proxy, its CA trusted; a host outside the policy refused.
        got = sb.run(["curl", "-sS", "-m", "20", f"https://api.test:{origin_https.port}/t"])
        assert (got.exit_code, got.stdout) == (0, b"hello from origin\n"), got.stderr
        got = sb.run(["python3", "-c", _FETCH, f"https://api.test:{origin_https.port}/py"])
        assert (got.exit_code, got.stdout) == (0, b"hello from origin\n"), got.stderr
        refused = sb.run(["curl", "-sS", "-m", "20", "-o", "/dev/null", "-w", "%{http_code}",
                          f"https://other.test:{origin_https.port}/"])
        assert refused.exit_code != 0 or refused.text == "403", refused
    assert {"/t", "/py"} <= {seen.path for seen in origin_https.requests}


def test_a_process_limit_above_the_hosts_still_runs(tierd: tuple[str, Daemon]) -> None:
    """A create may ask for more processes than the host's hard RLIMIT_NPROC: its commands get
    the host's bound, never a failed start."""
    _, daemon = tierd
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]  # the daemon's, which it passes on
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard RLIMIT_NPROC here to ask above")
    with Sandbox.create("ci-bot", daemon=str(daemon.socket), limits={"pids": hard + 1}) as sb:
        done = sb.run(["sh", "-c", "echo ran"])
        assert (done.exit_code, done.text, done.ending) == (0, "ran\n", "exit"), done


def test_a_command_whose_caller_leaves_is_killed(tierd: tuple[str, Daemon]) -> None:
    """A caller that stops reading a streamed command and closes its connection: the command
    is killed, the sandbox serves on."""
    _, daemon = tierd
    with create(daemon) as sb:
        events = sb.stream(["sh", "-c", "echo started; exec sleep 307"], timeout=120)
        assert next(events) == ("stdout", b"started\n")
        events.close()  # the connection with it
        listing = ""
        for _ in range(100):
            listing = sb.run(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]).text
            if "sleep 307" not in listing:
                break
            time.sleep(0.1)
        assert "sleep 307" not in listing, listing
        assert sb.run(["true"]).ok


def test_two_sandboxes_share_nothing(tierd: tuple[str, Daemon]) -> None:
    tier, daemon = tierd
    with create(daemon) as a, create(daemon) as b:
        assert a.info["address"] != b.info["address"] and a.info["uid"] != b.info["uid"]
        assert a.run(["sh", "-c", "echo mine > only-a"]).ok
        assert b.run(["ls"]).text == ""
        if tier == "microvm":  # two guests, two kernels booted each for its sandbox
            assert a.run(BOOT_ID).text != b.run(BOOT_ID).text
            assert len(qemus(a.info["uid"])) == len(qemus(b.info["uid"])) == 1


def test_a_delete_leaves_only_the_pool(tierd: tuple[str, Daemon], dproxy: Proxy) -> None:
    tier, daemon = tierd
    before = picture(daemon, dproxy, POOL)
    assert before.orphans == [] and before.sandboxes == 0
    sb = create(daemon)
    vms = qemus(sb.info["uid"])
    assert len(vms) == (1 if tier == "microvm" else 0)
    booted = sb.run(BOOT_ID).text
    sb.delete()
    after = same_as(daemon, dproxy, before, POOL)
    assert after.held["netns"] == after.held["tables"] == POOL
    for pid in vms:  # its VM is gone, not handed to the next sandbox
        assert not Path(f"/proc/{pid}").exists()
    with create(daemon) as again:  # a kernel booted for it (the others' is the host's)
        assert (again.run(BOOT_ID).text != booted) == (tier == "microvm")
    if tier == "microvm":
        taps = subprocess.run(["ip", "-o", "link", "show", "type", "tun"], capture_output=True,
                              text=True, check=True, timeout=20).stdout
        assert "sgvmtap" not in taps  # taps live in the sandboxes' namespaces only


def test_a_vm_that_ends_ends_its_sandbox(tierd: tuple[str, Daemon], dproxy: Proxy) -> None:
    """QEMU killed from the host: the slot's server sees its guest end and exits, and the
    daemon deletes the sandbox (its end, not a hang on the next request)."""
    tier, daemon = tierd
    if tier != "microvm":
        pytest.skip("a microVM's own end (the other tiers' agent dying: test_lifecycle)")
    before = picture(daemon, dproxy, POOL)
    sb = create(daemon)
    for pid in qemus(sb.info["uid"]):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not gone_or_ended(sb):
        assert time.monotonic() < deadline, sb.refresh()
        time.sleep(0.1)
    same_as(daemon, dproxy, before, POOL)


def test_files_never_follow_a_link(tierd: tuple[str, Daemon]) -> None:
    """put and get walk the workspace as the sandbox's uid and never through a link, whatever
    runs them (in a microVM: the same agent code, inside the guest; under gVisor, whose kernel
    follows a link to a directory despite O_NOFOLLOW, the walk checks what it opened)."""
    _, daemon = tierd
    with create(daemon) as sb:
        assert sb.run(["sh", "-c", "ln -s /etc/passwd pw && ln -s /etc d && mkdir dir"]).ok
        for reason, path, attempt in ((Reason.BAD_PATH, "pw", lambda: sb.read("pw")),
                                      (Reason.BAD_PATH, "d/passwd", lambda: sb.read("d/passwd")),
                                      (Reason.BAD_PATH, "d/planted",
                                       lambda: sb.write("d/planted", b"x")),
                                      (Reason.NO_SUCH_FILE, "dir", lambda: sb.read("dir"))):
            with pytest.raises(DaemonError) as refused:
                attempt()
            assert refused.value.reason is reason, (path, refused.value)
        assert sb.run(["test", "!", "-e", "/etc/planted"]).ok
