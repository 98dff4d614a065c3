"""The sandbox's own nftables table, alone: no gateway floor under it, so every rule must do its
own job (the floor once hid a UDP rule opened to all UDP).

Three namespaces of the test's own: a host (the table, the gateway on its loopback, stand-ins
for the proxy's listeners, the name server and another service, IPv4 forwarding on), a sandbox
linked to it, and another network behind the host to forward to. Each test loads the table
fresh (its rate limit starts full) and probes from the sandbox; the servers log what reached
them, so a test proves both what the sandbox got back and that nothing arrived. The first test
runs the same probes with no table at all: every closed way is open without it.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest

from sealgate.sandbox.host.dns import BURST, RATE
from sealgate.sandbox.host.firewall import sandbox_rules
from sealgate.sandbox.host.network import Link
from tests.netns import require_root_net, run

pytestmark = pytest.mark.root

GATEWAY, HOST_END, SANDBOX, SPOOFED = "10.77.255.254", "10.77.0.1", "10.77.0.2", "10.77.0.6"
ELSEWHERE = "10.78.0.2"  # behind the host, reachable only by forwarding
HOST6, SANDBOX6 = "fd77::1", "fd77::2"
PROXY, TRANSPARENT, DNS, OTHER, BEHIND, INSIDE = 3128, 3129, 5300, 2222, 80, 7000

# Listens as told ("tcp,HOST,PORT", "tcp6,HOST,PORT", "udp,PORT"), logs each connection or
# datagram as a JSON line (a TCP one with the destination the sandbox dialed, before any DNAT),
# and echoes it back. Runs until its stdin closes.
SERVER = r"""
import json, socket, struct, sys, threading
log = open(sys.argv[1], "a", buffering=1)
lock = threading.Lock()
def note(**event):
    with lock: log.write(json.dumps(event) + "\n")
def tcp(family, host, port):
    s = socket.socket(family)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((host, port)); s.listen(64)
    while True:
        c, peer = s.accept()
        dst = None
        if family == socket.AF_INET:
            try:
                raw = c.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST
                dst = "%s:%d" % (socket.inet_ntoa(raw[4:8]), struct.unpack("!H", raw[2:4])[0])
            except OSError:
                pass
        note(proto="tcp", port=port, peer=peer[0], dst=dst)
        c.settimeout(1)
        try: c.sendall(c.recv(64))
        except OSError: pass
        c.close()
def udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port))
    while True:
        data, peer = s.recvfrom(512)
        note(proto="udp", port=port, peer=peer[0])
        s.sendto(data, peer)
for spec in sys.argv[2:]:
    kind, *where = spec.split(",")
    if kind == "udp":
        target, args = udp, (int(where[0]),)
    else:
        family = socket.AF_INET6 if kind == "tcp6" else socket.AF_INET
        target, args = tcp, (family, where[0], int(where[1]))
    threading.Thread(target=target, args=args, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""

# Runs the checks it is given, all at once, and prints their results as JSON.
PROBE = r"""
import json, socket, struct, sys, threading, time
WAIT = 0.5
def tcp(host, port, src=None, family=socket.AF_INET):
    s = socket.socket(family); s.settimeout(WAIT)
    try:
        if src: s.bind((src, 0))
        s.connect((host, port)); s.sendall(b"ping")
        return "echo" if s.recv(64) == b"ping" else "closed"
    except ConnectionRefusedError: return "refused"
    except TimeoutError: return "timeout"
    except OSError as e: return type(e).__name__
    finally: s.close()
def tcp6(host, port):
    return tcp(host, port, None, socket.AF_INET6)
def udp(host, port, src=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(WAIT)
    s.bind((src or "0.0.0.0", 0)); s.sendto(b"probe", (host, port))
    try: s.recvfrom(512); return "answer"
    except OSError: return "silent"
    finally: s.close()
def ping(host):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); s.settimeout(WAIT)
    body = struct.pack("!BBHHH", 8, 0, 0, 0x5347, 1) + b"sgprobe!"
    total = sum(struct.unpack("!%dH" % (len(body) // 2), body))
    while total >> 16: total = (total & 0xFFFF) + (total >> 16)
    s.sendto(body[:2] + struct.pack("!H", ~total & 0xFFFF) + body[4:], (host, 0))
    try:
        for _ in range(16):
            data, peer = s.recvfrom(1024)
            if peer[0] == host and data[(data[0] & 15) * 4] == 0: return "answer"
        return "silent"
    except OSError: return "silent"
    finally: s.close()
def flood(host, port, window, drain):
    # One socket, one source port: one conntrack flow, "established" after its first packet.
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setblocking(False)
    sent = answers = 0
    end = time.monotonic() + window
    while time.monotonic() < end:
        try: s.sendto(b"flood", (host, port)); sent += 1
        except OSError: pass
        try:
            while True: s.recv(512); answers += 1
        except OSError: pass
    s.settimeout(drain)
    try:
        while True: s.recv(512); answers += 1
    except OSError: pass
    return [sent, answers]
checks = json.loads(sys.argv[1])
results = [None] * len(checks)
def one(i, name, *args):
    try: results[i] = globals()[name](*args)
    except Exception as e: results[i] = repr(e)
threads = [threading.Thread(target=one, args=(i, *c)) for i, c in enumerate(checks)]
for t in threads: t.start()
for t in threads: t.join(30)
print(json.dumps(results))
"""


@dataclass
class Net:
    host: str
    sandbox: str
    behind: str
    logs: Path
    link: Link

    def probe(self, netns: str, *checks: tuple[Any, ...]) -> list[Any]:
        done = run("ip", "netns", "exec", netns, sys.executable, "-c", PROBE,
                   json.dumps(checks), timeout=30)
        return list(json.loads(done.stdout))

    def heard(self, where: str) -> list[dict[str, Any]]:
        """What reached the servers in namespace `where` since the last look."""
        path = self.logs / f"{where}.log"
        lines = path.read_text().splitlines()
        path.write_text("")
        return [json.loads(line) for line in lines]

    def load(self, rules: str | None) -> None:
        run("ip", "netns", "exec", self.host, "nft", "flush", "ruleset")
        if rules is not None:
            subprocess.run(["ip", "netns", "exec", self.host, "nft", "-f", "-"], input=rules,
                           text=True, check=True, timeout=20)
        for where in ("host", "behind", "sandbox"):
            self.heard(where)


def _mac(netns: str, interface: str) -> str:
    out = run("ip", "-n", netns, "-j", "link", "show", interface).stdout
    return str(json.loads(out)[0]["address"])


def _build(host: str, sandbox: str, behind: str) -> None:
    for ns in (host, sandbox, behind):
        run("ip", "netns", "add", ns)
        run("ip", "-n", ns, "link", "set", "lo", "up")
    run("ip", "-n", host, "link", "add", "sbx0", "type", "veth", "peer", "name", "eth0",
        "netns", sandbox)
    run("ip", "-n", host, "link", "add", "oth0", "type", "veth", "peer", "name", "eth0",
        "netns", behind)
    for ns, dev, addrs in ((host, "sbx0", [f"{HOST_END}/30", f"{HOST6}/64"]),
                           (sandbox, "eth0", [f"{SANDBOX}/30", f"{SPOOFED}/32", f"{SANDBOX6}/64"]),
                           (host, "oth0", ["10.78.0.1/30"]), (behind, "eth0", [f"{ELSEWHERE}/30"])):
        for addr in addrs:
            nodad = ["nodad"] if ":" in addr else []  # usable at once
            run("ip", "-n", ns, "addr", "add", addr, "dev", dev, *nodad)
        run("ip", "-n", ns, "link", "set", dev, "up")
    run("ip", "-n", host, "addr", "add", f"{GATEWAY}/32", "dev", "lo")
    run("ip", "-n", sandbox, "route", "add", "default", "via", HOST_END, "src", SANDBOX)
    run("ip", "-n", behind, "route", "add", "default", "via", "10.78.0.1")
    # Were the source pin gone, the host would answer the spoofed address.
    run("ip", "-n", host, "route", "add", f"{SPOOFED}/32", "dev", "sbx0")
    # IPv6 without neighbour discovery, which the table would drop before any test.
    run("ip", "-n", sandbox, "neigh", "replace", HOST6, "lladdr", _mac(host, "sbx0"), "dev",
        "eth0", "nud", "permanent")
    run("ip", "-n", host, "neigh", "replace", SANDBOX6, "lladdr", _mac(sandbox, "eth0"), "dev",
        "sbx0", "nud", "permanent")
    run("ip", "netns", "exec", host, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    require_root_net()
    tag = secrets.token_hex(3)
    host, sandbox, behind = f"tblh-{tag}", f"tbls-{tag}", f"tblb-{tag}"
    logs = tmp_path_factory.mktemp("table-logs")
    servers: list[subprocess.Popen[str]] = []
    try:
        _build(host, sandbox, behind)
        for ns, where, specs in (
            (host, "host", [f"tcp,{GATEWAY},{PROXY}", f"tcp,{GATEWAY},{TRANSPARENT}",
                            f"tcp,0.0.0.0,{OTHER}", f"tcp6,::,{OTHER}", f"udp,{DNS}",
                            f"udp,{OTHER}"]),
            (behind, "behind", [f"tcp,0.0.0.0,{BEHIND}", f"udp,{BEHIND}"]),
            (sandbox, "sandbox", [f"tcp,0.0.0.0,{INSIDE}", f"udp,{INSIDE}"]),
        ):
            (logs / f"{where}.log").write_text("")
            server = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-c", SERVER,
                 str(logs / f"{where}.log"), *specs],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            servers.append(server)
            assert server.stdout is not None and server.stdout.readline() == "ready\n"
        link = Link(0, sandbox, "sbx0", "eth0", IPv4Address(HOST_END), IPv4Address(SANDBOX),
                    IPv4Address(GATEWAY))
        yield Net(host, sandbox, behind, logs, link)
    finally:
        for server in servers:
            server.kill()
            server.wait()
        for ns in (host, sandbox, behind):
            run("ip", "netns", "del", ns, check=False)


@pytest.fixture
def table(net: Net) -> Iterator[Net]:
    net.load(sandbox_rules(net.link, [PROXY], TRANSPARENT, DNS))
    yield net
    net.load(None)


def test_without_the_table_every_way_is_open(net: Net) -> None:
    """So that each test below fails for the table's reason, not the test network's."""
    net.load(None)
    assert net.probe(net.sandbox, ("tcp", GATEWAY, OTHER), ("udp", HOST_END, OTHER),
                     ("udp", GATEWAY, DNS), ("ping", HOST_END), ("tcp", GATEWAY, PROXY, SPOOFED),
                     ("tcp6", HOST6, OTHER), ("udp", ELSEWHERE, BEHIND)) == ["echo"] + \
        ["answer"] * 3 + ["echo"] * 2 + ["answer"]
    assert net.probe(net.behind, ("tcp", SANDBOX, INSIDE)) == ["echo"]
    flood = net.probe(net.sandbox, ("flood", HOST_END, DNS, 0.5, 0.2))[0]
    assert flood[1] > 4 * (BURST + RATE)


def test_tcp_to_the_proxy_ports_is_accepted(table: Net) -> None:
    # A round trip: the rest of a connection passes as well as its first packet.
    assert table.probe(table.sandbox, ("tcp", GATEWAY, PROXY), ("tcp", GATEWAY, TRANSPARENT)) \
        == ["echo", "echo"]
    assert {(e["port"], e["peer"]) for e in table.heard("host")} == \
        {(PROXY, SANDBOX), (TRANSPARENT, SANDBOX)}


def test_other_tcp_is_captured_to_the_transparent_port(table: Net) -> None:
    assert table.probe(table.sandbox, ("tcp", HOST_END, OTHER), ("tcp", ELSEWHERE, BEHIND)) \
        == ["echo", "echo"]
    assert sorted((e["port"], e["dst"]) for e in table.heard("host")) == \
        [(TRANSPARENT, f"{HOST_END}:{OTHER}"), (TRANSPARENT, f"{ELSEWHERE}:{BEHIND}")]
    assert table.heard("behind") == []


def test_other_ports_of_the_gateway_are_refused_at_once(table: Net) -> None:
    assert table.probe(table.sandbox, ("tcp", GATEWAY, OTHER)) == ["refused"]
    assert table.heard("host") == []


def test_dns_reaches_the_name_server_on_the_host_end_only(table: Net) -> None:
    assert table.probe(table.sandbox, ("udp", HOST_END, 53), ("udp", HOST_END, DNS),
                       ("udp", GATEWAY, DNS), ("udp", GATEWAY, 53)) == \
        ["answer", "answer", "silent", "silent"]
    assert [(e["port"], e["peer"]) for e in table.heard("host")] == [(DNS, SANDBOX)] * 2


def test_dns_is_rate_limited_on_one_socket_reusing_its_port(table: Net) -> None:
    window, drain = 1.0, 0.2
    sent, answers = table.probe(table.sandbox, ("flood", HOST_END, 53, window, drain))[0]
    allowed = BURST + RATE * (window + drain)
    assert sent > 10 * allowed  # a flood indeed
    assert RATE <= answers <= allowed * 1.25, (sent, answers)


def test_other_udp_and_icmp_go_nowhere(table: Net) -> None:
    assert table.probe(table.sandbox, ("udp", HOST_END, OTHER), ("udp", GATEWAY, OTHER),
                       ("ping", HOST_END), ("ping", GATEWAY)) == ["silent"] * 4
    assert table.heard("host") == []


def test_the_source_is_pinned_to_the_sandbox_address(table: Net) -> None:
    assert table.probe(table.sandbox, ("tcp", GATEWAY, PROXY, SPOOFED),
                       ("udp", HOST_END, 53, SPOOFED)) == ["timeout", "silent"]
    assert table.heard("host") == []


def test_ipv6_is_dropped_outright(table: Net) -> None:
    # Dropped, not even refused: no IPv6 packet of the sandbox's gets an answer.
    assert table.probe(table.sandbox, ("tcp6", HOST6, OTHER)) == ["timeout"]
    assert table.heard("host") == []


def test_nothing_is_forwarded_either_way(table: Net) -> None:
    assert table.probe(table.sandbox, ("udp", ELSEWHERE, BEHIND), ("ping", ELSEWHERE)) == \
        ["silent", "silent"]
    assert table.heard("behind") == []
    assert table.probe(table.behind, ("tcp", SANDBOX, INSIDE), ("udp", SANDBOX, INSIDE)) == \
        ["timeout", "silent"]
    assert table.heard("sandbox") == []
