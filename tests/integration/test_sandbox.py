"""`sealgate sandbox run`: real namespaces, nftables, each isolation tier this machine can run
(bubblewrap, gVisor, ...: `tests.integration.tiers`) and a real proxy on the gateway.

The sandbox reaches the HTTPS origin only through the proxy, trusts the proxy's CA, is known to
the proxy by its address, cannot reach anything else (other TCP is captured by the proxy and
decided there; UDP, other ports of the host and IPv6 go nowhere), holds no capabilities and none
of the caller's environment, and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.proxy.process.controlclient import call
from sealgate.sandbox import tiers
from tests.dnsstub import StubDNS
from tests.harness import ROOT, SEALGATE, Origin, OriginCA, Proxy, key_digest, sandbox_gateway
from tests.integration.tiers import ENV as TIER_ENV
from tests.integration.tiers import TIERS

pytestmark = pytest.mark.root

RANGE, GATEWAY = "10.215.0.0/16", "10.215.255.254"
PLAN = ["--range", RANGE, "--gateway", GATEWAY]
CANARY = "sk_live_sandbox_env_canary_5e1d"


def sealgate(*args: str, timeout: float = 60, stdin: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CANARY_SECRET": CANARY, **TIER_ENV}
    return subprocess.run([*SEALGATE, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env,
                          **({"stdin": subprocess.DEVNULL} if stdin is None else {"input": stdin}))


@pytest.fixture(scope="module")
def gateway() -> Iterator[None]:
    with sandbox_gateway(PLAN, "/usr/bin/python3", "/usr/bin/curl"):
        yield


@pytest.fixture(scope="module")
def sproxy(
    gateway: None, tmp_path_factory: pytest.TempPathFactory, origin_https: Origin,
    dns: StubDNS, test_ca: OriginCA,
) -> Iterator[Proxy]:
    rules = f"""
version: 1
policies:
  box:
    allow:
      - host: api.test
        ports: [{origin_https.port}]
        methods: [GET]          # so TLS is intercepted: the sandbox must trust the proxy's CA
    allow_networks: [127.0.0.1/32]
sandboxes:
  box-1: {{policy: box, key_sha256: "{key_digest('never-used-box-key')}"}}
"""
    p = Proxy(tmp_path_factory.mktemp("sandbox-proxy"), rules, resolver=dns.address,
              upstream_ca=test_ca.path, listen_host=GATEWAY, transparent_host=GATEWAY)
    yield p
    p.stop()


def run(
    p: Proxy, *command: str, sandbox: str = "box-1", limits: tuple[str, ...] = (),
    tier: str = "bwrap", stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    return sealgate("sandbox", "run", *PLAN, "--sandbox", sandbox, "--state", str(p.state),
                    "--proxy-port", str(p.port), "--transparent-port", str(p.transparent_port),
                    "--isolation", tier, *limits, "--", *command, stdin=stdin)


def leftovers() -> list[str]:
    netns = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    groups = [*Path("/sys/fs/cgroup").glob("*/sealgate/run-*"),
              *Path("/sys/fs/cgroup").glob("sealgate/run-*")]
    tier_dirs = [str(d) for d in Path("/run/sealgate").glob("gvisor-*")]
    return ([str(g) for g in groups] + tier_dirs + [n for n in netns.split() if n.startswith("sg-")]
            + [t for t in tables.split() if t.startswith("sealgate_") and "_gw_" not in t]
            + [w.rstrip(":@") for w in links.split() if w.startswith("sgh") and
               w.rstrip(":").split("@")[0][3:].isdigit()])


@pytest.mark.parametrize("tier", TIERS)
def test_https_reaches_the_origin_through_the_proxy(
    sproxy: Proxy, origin_https: Origin, tier: str
) -> None:
    origin_https.reset()
    done = run(sproxy, "curl", "-sS", "-m", "10", f"https://api.test:{origin_https.port}/sbx",
               tier=tier)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello from origin\n"
    assert [r.path for r in origin_https.requests] == ["/sbx"]
    line = sproxy.wait_audit(lambda e: e.get("event") == "request" and e.get("path") == "/sbx")
    assert (line["sandbox"], line["identified_by"], line["decision"]) == \
        ("box-1", "source", "allow")


@pytest.mark.parametrize("tier", TIERS)
def test_nothing_else_gets_out(sproxy: Proxy, origin_https: Origin, tier: str) -> None:
    probe = f"""
import socket
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close(); return "open"
    except OSError as e: return type(e).__name__
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
    query = b"\\x12\\x34\\x01\\x00\\x00\\x01" + bytes(7)
    s.sendto(query, ("{GATEWAY}", 53))
    try: s.recv(512); return "answer"
    except OSError as e: return type(e).__name__
def spoofed(port):
    # Posing as another sandbox: IP_FREEBIND needs no privilege to bind a foreign address (the
    # kernel then finds no route from it; the host's table would drop it anyway).
    # (gVisor's kernel ignores IP_FREEBIND and refuses the bind itself.)
    s = socket.socket(); s.setsockopt(socket.SOL_IP, 15, 1); s.settimeout(2)
    try:
        s.bind(("10.215.0.6", 0))
        s.connect(("{GATEWAY}", port)); return "open"
    except OSError: return "refused"
def ipv6():
    # No IPv6 address, route or link-local way to the host: every tier's kernel says so.
    try:
        socket.create_connection(("2001:db8::1", 80), timeout=2).close(); return "open"
    except OSError: return "no-ipv6"
print(tcp("{GATEWAY}", 22), udp(), ipv6(), spoofed({sproxy.port}), tcp("{GATEWAY}", {sproxy.port}))
"""
    done = run(sproxy, "python3", "-c", probe, tier=tier)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == \
        ["ConnectionRefusedError", "TimeoutError", "no-ipv6", "refused", "open"]
    # Any other TCP destination is captured and decided by the proxy: refused here.
    direct = run(sproxy, "curl", "-sS", "-m", "10", "--noproxy", "*", "-o", "/dev/null", "-w",
                 "%{http_code}", "http://169.254.169.254/latest/meta-data/", tier=tier)
    assert direct.stdout == "403", direct.stderr
    line = sproxy.wait_audit(lambda e: e.get("event") == "request"
                             and e.get("host") == "169.254.169.254")
    assert (line["sandbox"], line["decision"]) == ("box-1", "deny")


@pytest.mark.parametrize("tier", TIERS)
def test_the_sandbox_holds_nothing(sproxy: Proxy, tier: str) -> None:
    probe = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
lines = open("/proc/self/status").read().splitlines()
status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
io_uring = libc.syscall(425, 1, ctypes.c_void_p(0)), ctypes.get_errno()
print(os.getuid(), status["CapEff"].strip(), io_uring, sorted(os.listdir("/run")),
      os.path.exists(os.environ["STATE"]), sorted(os.environ))
"""
    done = run(sproxy, "env", f"STATE={sproxy.state}", "python3", "-c", probe, tier=tier)
    assert done.returncode == 0, done.stderr
    assert CANARY not in done.stdout + done.stderr
    uid, capeff, *rest = done.stdout.split(" ", 2)
    assert (uid, capeff) == ("65534", "0000000000000000")
    # io_uring_setup: EPERM from bubblewrap's seccomp filter. gVisor's kernel has an io_uring
    # of its own (Go, in the Sentry), and the microVM's guest kernel its own, never the host's:
    # EFAULT for the missing parameters.
    assert ("(-1, 1)" if tier == "bwrap" else "(-1, 14)") in rest[0]
    assert "['sealgate'] False" in rest[0]  # the proxy's state is not there
    assert "CANARY_SECRET" not in rest[0]


@pytest.mark.parametrize("tier", TIERS)
def test_exit_status_and_cleanup(sproxy: Proxy, tier: str) -> None:
    assert run(sproxy, "sh", "-c", "exit 7", tier=tier).returncode == 7
    assert leftovers() == []
    status, body = call(sproxy.state / "control.sock", "GET", "/v1/sources")
    assert (status, body) == (200, {"sources": {}})


def test_an_unknown_sandbox_is_refused_before_anything_runs(sproxy: Proxy) -> None:
    done = run(sproxy, "touch", "/tmp/should-not-run", sandbox="ghost")
    assert done.returncode == 125
    assert "unknown_sandbox" in done.stderr
    assert leftovers() == []


@pytest.mark.parametrize("tier", TIERS)
def test_a_fork_bomb_hits_the_process_limit(sproxy: Proxy, tier: str) -> None:
    bomb = """
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
    done = run(sproxy, "python3", "-c", bomb, limits=("--pids", "48"), tier=tier)
    assert done.returncode == 0, done.stderr
    assert 0 < int(done.stdout) < 48
    assert leftovers() == []  # the sleeping children went with the sandbox


@pytest.mark.parametrize("tier", TIERS)
def test_memory_beyond_the_limit_is_not_granted(sproxy: Proxy, tier: str) -> None:
    hog = "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096]); print('allocated')"
    done = run(sproxy, "python3", "-c", hog, limits=("--memory", "64M"), tier=tier)
    assert "allocated" not in done.stdout
    assert done.returncode != 0


@pytest.mark.parametrize(("flag", "value", "error"), [
    ("--memory", "lots", "not a size"), ("--pids", "2", "at least 8"),
    ("--cpus", "5000", "between 0.01 and 1024"), ("--timeout", "1d", "not a duration"),
])
def test_bad_limits_are_refused_before_anything_starts(
    sproxy: Proxy, flag: str, value: str, error: str
) -> None:
    done = run(sproxy, "true", limits=(flag, value))
    assert (done.returncode, error in done.stderr) == (2, True), done.stderr


def test_no_sandbox_without_the_gateway_set_up(sproxy: Proxy) -> None:
    other = ["--range", "10.216.0.0/16", "--gateway", "10.216.255.254"]
    done = sealgate("sandbox", "run", *other, "--sandbox", "box-1", "--state", str(sproxy.state),
                    "--", "true")
    assert done.returncode == 125
    assert "sealgate sandbox setup" in done.stderr


@pytest.mark.parametrize("tier", TIERS)
def test_env_passes_only_what_is_named_and_never_root(sproxy: Proxy, tier: str) -> None:
    done = sealgate("sandbox", "run", *PLAN, "--sandbox", "box-1", "--state", str(sproxy.state),
                    "--proxy-port", str(sproxy.port), "--isolation", tier, "--env",
                    "CANARY_SECRET", "--env", "MODE=ci", "--", "sh", "-c",
                    'echo "$CANARY_SECRET $MODE"')
    assert done.stdout == f"{CANARY} ci\n", done.stderr  # named: passed, by value from env
    for bad in (["--env", "LD_PRELOAD=/tmp/x.so"], ["--env", "PATH=/tmp"], ["--uid", "0"]):
        done = sealgate("sandbox", "run", *PLAN, "--sandbox", "box-1", "--state",
                        str(sproxy.state), "--isolation", tier, *bad, "--", "true")
        assert done.returncode in (2, 125), (bad, done.stderr)
    assert leftovers() == []


def in_namespace(netns: str) -> list[str]:
    """The processes in network namespace `netns` (what `ip netns pids` prints, without a
    process of its own: fast enough to catch a sandbox as it starts)."""
    try:
        target = os.stat(f"/run/netns/{netns}")
    except FileNotFoundError:
        return []
    pids = []
    for pid in os.listdir("/proc"):
        try:
            found = os.stat(f"/proc/{pid}/ns/net") if pid.isdigit() else None
        except OSError:  # gone meanwhile
            continue
        if found is not None and (found.st_dev, found.st_ino) == (target.st_dev, target.st_ino):
            pids.append(pid)
    return pids


def registered(p: Proxy) -> bool:
    return call(p.state / "control.sock", "GET", "/v1/sources")[1]["sources"] != {}


@contextlib.contextmanager
def sleeping_sandbox(
    p: Proxy, tier: str, *, early: bool = False
) -> Iterator[subprocess.Popen[bytes]]:
    """`sealgate sandbox run -- sleep 60`, once it is registered with the proxy and a process
    of it runs in its namespace (`early`: once any process does, the link's set-up's own
    included); killed on the way out."""
    proc = subprocess.Popen(
        [*SEALGATE, "sandbox", "run", *PLAN, "--sandbox", "box-1", "--state", str(p.state),
         "--proxy-port", str(p.port), "--isolation", tier, "--", "sleep", "60"],
        cwd=ROOT, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **TIER_ENV},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        for _ in range(2000):
            if in_namespace("sg-0") and (early or registered(p)):
                break
            time.sleep(0.005)
        else:
            raise AssertionError("the sandbox did not start")
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("tier", TIERS)
def test_sigterm_ends_the_sandbox_and_leaves_nothing(sproxy: Proxy, tier: str) -> None:
    with sleeping_sandbox(sproxy, tier) as proc:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert leftovers() == []


@pytest.mark.parametrize("tier", TIERS)
def test_clients_that_ignore_the_proxy_variables_get_there_by_name(
    sproxy: Proxy, origin_https: Origin, tier: str
) -> None:
    """Every name resolves to the link; TCP there goes to the proxy's transparent listener,
    which names the destination by SNI and decides as for any request."""
    origin_https.reset()
    done = run(sproxy, "curl", "-sS", "-m", "10", "--noproxy", "*",
               f"https://api.test:{origin_https.port}/by-name", tier=tier)
    assert done.returncode == 0, done.stderr
    assert [r.path for r in origin_https.requests] == ["/by-name"]
    refused = run(sproxy, "curl", "-sS", "-m", "10", "--noproxy", "*", "-o", "/dev/null",
                  "-w", "%{http_code}", f"https://elsewhere.test:{origin_https.port}/", tier=tier)
    assert refused.returncode != 0 or refused.stdout != "200"
    assert origin_https.requests[-1].path == "/by-name"


@pytest.mark.parametrize("tier", TIERS)
def test_the_next_run_cleans_up_after_one_killed_outright(sproxy: Proxy, tier: str) -> None:
    """SIGKILL leaves the runtime no teardown: its sandbox dies with it (bubblewrap's
    die-with-parent; runsc's parent-death signal), but the namespace, link, table, cgroups,
    registration and files stay, until the next run."""
    with sleeping_sandbox(sproxy, tier) as proc:
        proc.kill()
        proc.wait(timeout=30)
    for _ in range(100):  # the sandbox's processes die with the runtime, not at the next run
        if not in_namespace("sg-0"):
            break
        time.sleep(0.05)
    assert in_namespace("sg-0") == []
    assert leftovers() != []
    assert registered(sproxy)
    assert run(sproxy, "true", tier=tier).returncode == 0
    assert leftovers() == []
    assert call(sproxy.state / "control.sock", "GET", "/v1/sources")[1] == {"sources": {}}


@pytest.mark.parametrize("tier", TIERS)
def test_a_runtime_killed_as_its_sandbox_starts_leaves_nothing_running(
    sproxy: Proxy, tier: str
) -> None:
    """The kill lands as the first process enters the sandbox's namespace: while the link is
    being built, or before the tier's program has armed its parent-death signal, some of the
    times. What was started must die all the same, not run on orphaned until the next run,
    which must still find (by its lease) and remove all of it. Every other time the whole
    process group is killed, the runtime's watchdog with it if it were in that group."""
    for attempt in range(6 if tier == "bwrap" else 2):
        with sleeping_sandbox(sproxy, tier, early=True) as proc:
            if attempt % 2:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait(timeout=30)
        for _ in range(100):
            if not in_namespace("sg-0"):
                break
            time.sleep(0.05)
        assert in_namespace("sg-0") == []
        assert run(sproxy, "true", tier=tier).returncode == 0
    assert leftovers() == []


@pytest.mark.skipif(tiers.available("gvisor") is not None,
                    reason=f"isolation gvisor: {tiers.available('gvisor')}")
def test_gvisor_runs_the_workload_on_its_own_kernel(sproxy: Proxy) -> None:
    """What only gVisor shows: the workload's kernel is gVisor's Sentry, not the host's."""
    done = run(sproxy, "sh", "-c", "uname -r; cat /proc/version; dmesg", tier="gvisor")
    assert done.returncode == 0, done.stderr
    release, version, *log = done.stdout.splitlines()
    assert release != os.uname().release
    assert version != Path("/proc/version").read_text().strip()
    assert "Starting gVisor..." in log[0]


SOCKET_OPTIONS = r"""
import socket
for level, name, what in ((socket.SOL_SOCKET, 36, "SO_MARK"), (socket.SOL_IP, 19,
                          "IP_TRANSPARENT"), (socket.SOL_SOCKET, 33, "SO_RCVBUFFORCE")):
    with socket.socket() as s:
        try:
            s.setsockopt(level, name, 1)
            print(what, "set")
        except OSError as exc:
            print(what, exc.errno)
"""


@pytest.mark.parametrize("tier", TIERS)
def test_socket_options_that_need_net_admin_are_refused(sproxy: Proxy, tier: str) -> None:
    """The same refusals on every tier (#22): a packet mark could meet a host rule trusting
    marks; gVisor's kernel granted SO_MARK and IP_TRANSPARENT before its filter refused them."""
    done = run(sproxy, "python3", "-c", SOCKET_OPTIONS, tier=tier)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["SO_MARK 1", "IP_TRANSPARENT 1", "SO_RCVBUFFORCE 1", ""]


ALONE = r"""
import json, os
me = os.getpid()
others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
writable = []
for pid in others:
    try:
        os.close(os.open(f"/proc/{pid}/mem", os.O_RDWR))
        writable.append(pid)
    except OSError:
        pass
print(json.dumps([me, others, writable]))
"""


@pytest.mark.parametrize("tier", TIERS)
def test_a_one_shot_command_is_its_sandbox_s_first_process(sproxy: Proxy, tier: str) -> None:
    """No process of the runtime's is in the sandbox for the command to write into (#22):
    bubblewrap's init was PID 1, of the command's uid, its memory writable through /proc."""
    done = run(sproxy, "python3", "-c", ALONE, tier=tier)
    assert done.returncode == 0, done.stderr
    me, others, writable = json.loads(done.stdout)
    assert writable == [], done.stdout
    if tier != "microvm":  # the guest's own kernel threads and agent (root) are there
        assert (me, others) == (1, []), done.stdout
