"""The sandbox runtime's pure parts: address plan, firewall text, launch line, staged files,
durations, seccomp program.
(tests/integration/test_sandbox.py runs them for real.)"""

from __future__ import annotations

import argparse
import contextlib
import os
import struct
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from sealgate.sandbox.cli import parse_duration
from sealgate.sandbox.host.firewall import sandbox_rules, shared_rules
from sealgate.sandbox.host.launch import Launch, environment, staged
from sealgate.sandbox.host.network import Link, NetworkError, Plan
from sealgate.sandbox.host.seccomp import SeccompUnsupported, program
from sealgate.sandbox.host.watchdog import Watchdog
from sealgate.sandbox.tiers.bwrap import args as bwrap_args
from sealgate.sandbox.tiers.bwrap import argv

LINK = Link(3, "sg-3", "sgh3", "sgn3", IPv4Address("10.200.0.13"), IPv4Address("10.200.0.14"),
            IPv4Address("10.200.255.254"))


def test_the_gateway_never_falls_inside_a_sandbox_link() -> None:
    plan = Plan()
    assert plan.links[0] == IPv4Network("10.200.0.0/30")
    assert all(plan.gateway not in net for net in plan.links)
    assert len(plan.links) == 2**14 - 1
    with pytest.raises(NetworkError, match="too small"):
        Plan(range=IPv4Network("10.200.0.0/30"))


def test_firewall_pins_the_source_and_opens_only_the_proxy() -> None:
    rules = sandbox_rules(LINK, [3128], 3129, 40053)
    assert 'iifname "sgh3" ip saddr != 10.200.0.14 drop' in rules
    assert 'iifname "sgh3" meta nfproto ipv6 drop' in rules
    assert "ip daddr 10.200.255.254 tcp dport { 3128, 3129 } ct state new accept" in rules
    assert "dnat ip to 10.200.255.254:3129" in rules
    assert rules.index("ct state new accept") < rules.index("reject with tcp reset") < \
        rules.index('    iifname "sgh3" drop')
    assert 'oifname "sgh3" drop' in rules
    assert "dnat ip to 10.200.0.13:40053" in rules  # the sandbox's port 53, to its name server
    assert "tcp dnat" not in sandbox_rules(LINK, [3128], None, 40053)  # no transparent port
    assert 'iifname != "lo" iifname != "sgh*" drop' in shared_rules(Plan())


def test_launch_line_carries_no_environment_and_drops_everything() -> None:
    launch = Launch(LINK, ["curl", "https://x.example/"], 3128,
                    {"/etc/ssl/certs/ca-certificates.crt": b"", "/proc/cmdline": b""}, b"",
                    env={"API_TOKEN": "tok-canary-77"})
    group = Path("/sys/fs/cgroup/sealgate/run-3-1")
    files = {"/etc/ssl/certs/ca-certificates.crt": 11, "/proc/cmdline": 12}
    line, args = argv(launch, 10, [group]), bwrap_args(launch, files, 9)
    assert "tok-canary-77" not in " ".join(line + args)  # values travel in the environment only
    # bubblewrap reads its arguments from a descriptor: its command line, which the sandbox
    # can read as PID 1's, says nothing of the host's paths.
    assert line[-5:] == ["--args", "10", "--", "curl", "https://x.example/"]
    # The first process dies with the runtime (its parent checked once that is armed), joins
    # the run's cgroups, then enters the namespace.
    assert line[0].endswith("/setpriv") and line[1:3] == ["--pdeathsig=KILL", "--"]
    assert line[6:8] == ["sh", str(os.getpid())]
    join = line.index(str(group))
    assert line[join - 4].endswith("/sh") and line[join - 1:join + 2] == ["sh", str(group), "--"]
    at = line.index("netns")
    assert line[at - 1].endswith("/ip") and line[at:at + 3] == ["netns", "exec", "sg-3"]
    assert "--reuid=65534" in line
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                 "--new-session", "--share-net"):
        assert flag in args
    assert args[args.index("--cap-drop") + 1] == "ALL"
    assert args[args.index("--hostname") + 1] == "sandbox"
    assert args[args.index("--seccomp") + 1] == "9"
    data = [args[i + 1:i + 3] for i, a in enumerate(args) if a == "--ro-bind-data"]
    assert data == [["11", "/etc/ssl/certs/ca-certificates.crt"], ["12", "/proc/cmdline"]]
    assert args.index("--proc") < args.index("--ro-bind-data")  # over the fresh /proc
    env = environment(launch)
    assert env["HTTPS_PROXY"] == "http://10.200.255.254:3128"
    assert env["API_TOKEN"] == "tok-canary-77"
    assert env["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"


def test_staged_files_say_nothing_of_the_host() -> None:
    files = staged(LINK, b"roots+ca", b"ca")
    assert files["/etc/resolv.conf"].startswith(b"nameserver 10.200.0.13\n")
    assert files["/proc/cmdline"] == b""
    assert files["/etc/ssl/certs/ca-certificates.crt"] == b"roots+ca"
    if Path("/etc/hostname").is_file():
        assert files["/etc/hostname"] == b"sandbox\n"
    if Path("/etc/machine-id").is_file():
        assert files["/etc/machine-id"] != Path("/etc/machine-id").read_bytes()
    # Never a mount point the host's /etc lacks.
    for path in files.keys() & {"/etc/hostname", "/etc/mailname", "/etc/hosts", "/etc/machine-id"}:
        assert Path(path).is_file()


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30), ("10m", 600), ("2h", 7200), ("1.5", 1.5), ("0", None), ("0s", None),
])
def test_durations(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "-1", "1d", "1e3", "inf", "nan", "1.", "9" * 400])
def test_not_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        parse_duration(text)


def test_seccomp_program_checks_the_architecture_first() -> None:
    code = program("x86_64")
    assert len(code) % 8 == 0 and len(code) // 8 < 256
    first = [struct.unpack("<HBBI", code[i:i + 8]) for i in range(0, 24, 8)]
    assert first == [(0x20, 0, 0, 4), (0x15, 1, 0, 0xC000003E), (0x06, 0, 0, 0x80000000)]
    # Every jump lands inside the program.
    instructions = [struct.unpack("<HBBI", code[i:i + 8]) for i in range(0, len(code), 8)]
    for at, (op, jt, jf, _) in enumerate(instructions):
        if op & 0x07 == 0x05:  # BPF_JMP
            assert at + 1 + max(jt, jf) < len(instructions)
    assert instructions[-1] == (0x06, 0, 0, 0x7FFF0000)
    with pytest.raises(SeccompUnsupported, match="aarch64"):
        program("aarch64")


def _decide(code: bytes, nr: int, *args: int, arch: int = 0xC000003E) -> int:
    """Run the filter on one system call, as the kernel would (the opcodes it uses)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    program = [struct.unpack("<HBBI", code[i:i + 8]) for i in range(0, len(code), 8)]
    acc, pc = 0, 0
    for _ in range(len(program)):
        op, jt, jf, k = program[pc]
        if op == 0x20:
            acc, pc = struct.unpack_from("<I", data, k)[0], pc + 1
        elif op == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += 1 + (jt if taken else jf)
    raise AssertionError("fell off the program")


@pytest.mark.parametrize(("nr", "args", "arch", "verdict"), [
    (0, (), 0xC000003E, 0x7FFF0000),  # read
    (0, (), 0x40000003, 0x80000000),  # i386: killed
    (0x40000000, (), 0xC000003E, 0x80000000),  # x32: killed
    (425, (), 0xC000003E, 0x00050001),  # io_uring_setup: EPERM
    (438, (), 0xC000003E, 0x00050001),  # pidfd_getfd: EPERM
    (500, (), 0xC000003E, 0x00050026),  # unknown future call: ENOSYS
    (435, (), 0xC000003E, 0x00050026),  # clone3: ENOSYS, libc falls back to clone
    (56, (0x10000000 | 17,), 0xC000003E, 0x00050001),  # clone(CLONE_NEWUSER)
    (56, (0x003D0F00,), 0xC000003E, 0x7FFF0000),  # clone for a thread
    (41, (16,), 0xC000003E, 0x00050061),  # socket(AF_NETLINK): EAFNOSUPPORT
    (41, (2,), 0xC000003E, 0x7FFF0000),  # socket(AF_INET)
    (41, ((1 << 32) | 2,), 0xC000003E, 0x7FFF0000),  # the kernel reads an int
    (16, (0, 0x5412), 0xC000003E, 0x00050001),  # ioctl(TIOCSTI)
    (16, (0, (1 << 32) | 0x5412), 0xC000003E, 0x00050001),  # cmd is an unsigned int
    (16, (0, 0x541C), 0xC000003E, 0x00050001),  # TIOCLINUX
    (16, (0, 0x5401), 0xC000003E, 0x7FFF0000),  # TCGETS
    (54, (3, 1, 36), 0xC000003E, 0x00050001),  # setsockopt(SOL_SOCKET, SO_MARK)
    (54, (3, 1, 32), 0xC000003E, 0x00050001),  # SO_SNDBUFFORCE
    (54, (3, 1, 33), 0xC000003E, 0x00050001),  # SO_RCVBUFFORCE
    (54, (3, 0, 19), 0xC000003E, 0x00050001),  # setsockopt(SOL_IP, IP_TRANSPARENT)
    (54, (3, 41, 75), 0xC000003E, 0x00050001),  # setsockopt(SOL_IPV6, IPV6_TRANSPARENT)
    (54, (3, 1, 2), 0xC000003E, 0x7FFF0000),  # SO_REUSEADDR
    (54, (3, 6, 1), 0xC000003E, 0x7FFF0000),  # TCP_NODELAY
    (54, (3, 0, 15), 0xC000003E, 0x7FFF0000),  # IP_FREEBIND
    (54, (3, 41, 36), 0xC000003E, 0x7FFF0000),  # SOL_IPV6's 36 is not SO_MARK
])
def test_seccomp_decisions(nr: int, args: tuple[int, ...], arch: int, verdict: int) -> None:
    assert _decide(program("x86_64"), nr, *args, arch=arch) == verdict


def test_the_sandbox_name_server_answers_every_name_with_the_link() -> None:
    from dnslib import DNSRecord

    from sealgate.sandbox.host.dns import FakeDns

    names = FakeDns(IPv4Address("127.0.0.1"), IPv4Address("10.200.0.13"))
    try:
        for qtype, answers in (("A", ["10.200.0.13"]), ("AAAA", []), ("TXT", [])):
            reply = DNSRecord.parse(names.answer(bytes(
                DNSRecord.question("exfil.attacker.example", qtype).pack())) or b"")
            assert [str(rr.rdata) for rr in reply.rr] == answers
            assert reply.header.rcode == 0
        assert names.answer(b"\x00garbage") is None
        # A 64-byte label dnslib parses but refuses to pack: no answer, and no exception (one
        # would end the serving thread: no names for the rest of the run).
        long_label = b"\x12\x34\x01\x00\x00\x01" + bytes(6) + b"\x40" + b"a" * 64 + \
            b"\x00\x00\x01\x00\x01"
        assert names.answer(long_label) is None
        response = DNSRecord.question("x.example").reply()
        assert names.answer(bytes(response.pack())) is None  # not a query
    finally:
        names.close()


def test_the_name_server_reads_no_more_than_its_rate_whatever_gets_through() -> None:
    """Its own bound, with no firewall in front (as if the sandbox's table let a flood by):
    one socket sending as fast as it can gets no more answers than the rate allows."""
    import socket
    import time

    from dnslib import DNSRecord

    from sealgate.sandbox.host.dns import BURST, RATE, FakeDns

    names = FakeDns(IPv4Address("127.0.0.1"), IPv4Address("10.200.0.13"))
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        names.start()
        client.setblocking(False)
        query = bytes(DNSRecord.question("flood.example").pack())
        window, answers, sent = 1.0, 0, 0
        end = time.monotonic() + window
        while time.monotonic() < end:
            with contextlib.suppress(OSError):
                client.sendto(query, ("127.0.0.1", names.port))
                sent += 1
            with contextlib.suppress(OSError):
                while client.recv(512):
                    answers += 1
        allowed = BURST + RATE * window
        assert sent > 10 * allowed
        assert RATE <= answers <= allowed * 1.25, (sent, answers)
    finally:
        client.close()
        names.close()


@pytest.mark.parametrize("groups", [
    [], ["cgroup"], ["cgroup/pids"], ["cgroup/pids/sealgate"], ["cgroup/pids/user.slice/run-1-2"],
    ["cgroup/pids/sealgate/run-1-2", "cgroup/memory"],
])
def test_the_watchdog_takes_only_a_runs_own_groups(groups: list[str], tmp_path: Path) -> None:
    """It kills every member of its groups when the runtime dies: handed anything but a run's
    groups (the host's root group would be every process), it refuses before it starts. (Paths
    below a temporary directory, named like the host's: a watchdog that did start would find
    nothing there to kill.)"""
    with pytest.raises(ValueError, match="not a run's cgroups"):
        Watchdog([tmp_path / g for g in groups])


def test_a_signed_url_s_token_is_never_logged() -> None:
    """The daemon's log lines name a request by `portroutes.loggable`: a signed URL's token is
    a credential (it alone opens the port)."""
    from aiohttp.test_utils import make_mocked_request

    from sealgate.sandbox.daemon.portroutes import loggable

    token = "sb-1.8080.1767225600." + "ab" * 32
    seen = loggable(make_mocked_request("GET", f"/v1/signed/{token}/app/index.html"))
    assert seen == "/v1/signed/<token>/app/index.html" and "ab" * 8 not in seen
    assert loggable(make_mocked_request("GET", "/v1/sandboxes/x/exec")) == "/v1/sandboxes/x/exec"
