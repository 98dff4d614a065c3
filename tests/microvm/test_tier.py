"""`sealgate sandbox run --isolation microvm`: the guest behind the same boundary as every tier
(the sandbox's namespace, its veth, the host's table, its name server, the proxy on the
gateway), with a real proxy and a real HTTPS origin on loopback."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dnsstub import StubDNS
from tests.harness import ROOT, SEALGATE, Origin, OriginCA, Proxy, key_digest, sandbox_gateway
from tests.integration.test_sandbox import leftovers
from tests.microvm.kit import VM_ENV, needs_vm

pytestmark = [pytest.mark.root, needs_vm]

RANGE, GATEWAY = "10.223.0.0/16", "10.223.255.254"
PLAN = ["--range", RANGE, "--gateway", GATEWAY]


ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **VM_ENV}
PIDS: list[int] = []  # of every `sealgate` run here, whose cgroups are named for it


def sealgate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    with subprocess.Popen([*SEALGATE, *args], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=ENV) as proc:
        PIDS.append(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def vproxy(
    tmp_path_factory: pytest.TempPathFactory, origin_https: Origin, dns: StubDNS,
    test_ca: OriginCA,
) -> Iterator[Proxy]:
    rules = f"""
version: 1
policies:
  box:
    allow:
      - host: api.test
        ports: [{origin_https.port}]
        methods: [GET]          # so TLS is intercepted: the guest must trust the proxy's CA
    allow_networks: [127.0.0.1/32]
sandboxes:
  vm-1: {{policy: box, key_sha256: "{key_digest('never-used-vm-key')}"}}
"""
    with sandbox_gateway(PLAN, "/usr/bin/python3", "/usr/bin/curl"):
        p = Proxy(tmp_path_factory.mktemp("microvm-proxy"), rules, resolver=dns.address,
                  upstream_ca=test_ca.path, listen_host=GATEWAY, transparent_host=GATEWAY)
        try:
            yield p
        finally:
            p.stop()


def run(p: Proxy, *command: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return sealgate("sandbox", "run", *PLAN, "--sandbox", "vm-1", "--state", str(p.state),
                    "--proxy-port", str(p.port), "--transparent-port", str(p.transparent_port),
                    "--isolation", "microvm", *flags, "--", *command)


def test_https_through_the_proxy_with_its_ca_trusted(vproxy: Proxy, origin_https: Origin) -> None:
    origin_https.reset()
    done = run(vproxy, "sh", "-c", f"uname -r; curl -sS -m 20 https://api.test:{origin_https.port}/vm")
    assert done.returncode == 0, done.stderr
    kernel, body = done.stdout.split("\n", 1)
    assert kernel != os.uname().release  # the guest's own kernel answered
    assert body == "hello from origin\n"
    assert [r.path for r in origin_https.requests] == ["/vm"]
    line = vproxy.wait_audit(lambda e: e.get("event") == "request" and e.get("path") == "/vm")
    assert (line["sandbox"], line["identified_by"], line["decision"]) == \
        ("vm-1", "source", "allow")


def test_nothing_else_gets_out(vproxy: Proxy) -> None:
    probe = f"""
import socket
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close(); return "open"
    except OSError as e: return type(e).__name__
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    s.sendto(b"\\x12\\x34\\x01\\x00\\x00\\x01" + bytes(7), (host, port))
    try: s.recv(512); return "answer"
    except OSError as e: return type(e).__name__
def name(host):
    try: return socket.getaddrinfo(host, 443, socket.AF_INET)[0][4][0]
    except OSError as e: return type(e).__name__
def ipv6():
    try:
        socket.create_connection(("2001:db8::1", 80), timeout=3).close(); return "open"
    except OSError: return "no-ipv6"
print(tcp("{GATEWAY}", 22), udp("{GATEWAY}", 53), udp("1.1.1.1", 53), name("example.com"),
      ipv6(), tcp("{GATEWAY}", {vproxy.port}))
"""
    done = run(vproxy, "python3", "-c", probe)
    assert done.returncode == 0, done.stderr
    # Port 22 of the gateway refused by the host's table; UDP out, to the gateway or anywhere,
    # goes nowhere; a name is answered by the sandbox's own name server only, with the host's
    # end of the link (whose TCP the proxy's transparent listener decides); no IPv6; the
    # proxy's port open.
    refused, udp_gateway, udp_out, answer, v6, proxy = done.stdout.split()
    assert (refused, udp_gateway, udp_out, v6, proxy) == \
        ("ConnectionRefusedError", "TimeoutError", "TimeoutError", "no-ipv6", "open")
    host_end = ipaddress.IPv4Address(answer)
    assert host_end in ipaddress.IPv4Network(RANGE) and int(host_end) % 4 == 1, answer
    # Any other TCP is captured by the proxy and decided there: refused, and audited as vm-1.
    direct = run(vproxy, "curl", "-sS", "-m", "20", "--noproxy", "*", "-o", "/dev/null", "-w",
                 "%{http_code}", "http://169.254.169.254/latest/meta-data/")
    assert direct.stdout == "403", direct.stderr
    line = vproxy.wait_audit(lambda e: e.get("event") == "request"
                             and e.get("host") == "169.254.169.254")
    assert (line["sandbox"], line["decision"]) == ("vm-1", "deny")


def ours(pid: int) -> list[str]:
    """What the run `pid` left behind that names it (its cgroups): on a developer's machine
    other suites' sandboxes come and go beside these (in CI nothing else runs), so the links
    and tables, named by index only, are not told apart here; tests/integration does."""
    return [x for x in leftovers() if x.endswith(f"-{pid}")]


def qemus() -> list[str]:
    return subprocess.run(["pgrep", "-x", "qemu-system-x86"], capture_output=True,
                          text=True).stdout.split()


def test_exit_status_workspace_and_nothing_left(vproxy: Proxy) -> None:
    workspace = Path(tempfile.mkdtemp(prefix="sg-microvm-ws-", dir="/tmp"))
    try:
        workspace.chmod(0o777)
        done = run(vproxy, "sh", "-c", "pwd > out.txt; exit 7",
                   flags=("--workspace", str(workspace)))
        assert done.returncode == 7, done.stderr
        assert (workspace / "out.txt").read_text() == "/workspace\n"
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    assert ours(PIDS[-1]) == []
    assert qemus() == []


def test_a_runtime_killed_outright_takes_its_vm_with_it(vproxy: Proxy) -> None:
    """SIGKILL leaves the runtime no teardown: the launcher dies with it and QEMU with the
    launcher (parent-death signals), and the next run cleans up the rest."""
    proc = subprocess.Popen(
        [*SEALGATE, "sandbox", "run", *PLAN, "--sandbox", "vm-1", "--state", str(vproxy.state),
         "--proxy-port", str(vproxy.port), "--isolation", "microvm", "--", "sleep", "60"],
        cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # until its QEMU runs
            if qemus():
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the VM did not start")
    finally:
        proc.kill()
        proc.wait()
    for _ in range(100):  # the launcher dies with the runtime, QEMU with the launcher
        if not qemus():
            break
        time.sleep(0.05)
    assert qemus() == []
    # Its cgroups, link and table stay for the next run (of any suite's) to clean up.
    assert run(vproxy, "true").returncode == 0
    assert ours(proc.pid) == []
