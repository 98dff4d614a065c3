"""The session's network (tests.netns): loopback and the tests' own namespaces, nothing else.

What these prove is what the rest of the suite relies on: a proxy with a broken guard, asked for
a metadata or CGNAT address, finds no route and no name server off the machine.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import Proxy
from tests.netns import interfaces, netns_inode

# Interfaces a test or the sandbox runtime may have made by now (tests.netns, test_ssrf_host,
# sandbox.host.network): test veths and links, sandbox links.
_TEST_PREFIXES = ("tsh", "tsd", "tsp", "sgh")
# What a broken guard would dial: metadata (one of them public), CGNAT, documentation, public.
OFF_MACHINE = [
    "169.254.169.254", "168.63.129.16", "100.64.0.1", "100.100.100.200", "192.0.2.1",
    "8.8.8.8", "2001:4860:4860::8888", "fd00:ec2::254",
]


def test_only_loopback_and_test_interfaces() -> None:
    others = [name for name in interfaces() if name != "lo" and not name.startswith(_TEST_PREFIXES)]
    assert others == []


def test_the_session_is_not_the_hosts_namespace() -> None:
    with contextlib.suppress(PermissionError):  # not root: pid 1's namespace is not ours to see
        assert netns_inode() != netns_inode(1)


@pytest.mark.parametrize("address", OFF_MACHINE)
def test_nothing_off_the_machine_has_a_route(address: str) -> None:
    """Refused at once by the kernel (no route), from this process and from a child."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        with pytest.raises(OSError) as caught:
            sock.connect((address, 80))
    assert caught.value.errno == errno.ENETUNREACH
    child = subprocess.run(
        [sys.executable, "-c", f"import socket; socket.create_connection(({address!r}, 80), 2)"],
        capture_output=True, text=True, timeout=20,
    )
    assert "Network is unreachable" in child.stderr


def test_proxies_run_in_the_session_namespace(proxy: Proxy) -> None:
    assert netns_inode(proxy.process.pid) == netns_inode()


def test_the_hosts_name_servers_are_out_of_reach() -> None:
    """No answer from any name server the host is configured with; a proxy a test forgot to
    point at the stub asks a port where nothing listens (tests/conftest.py)."""
    assert os.environ["SEALGATE_RESOLVER"] == "127.0.0.1:9"
    servers = ["127.0.0.1:9"]
    with contextlib.suppress(OSError):
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "nameserver":
                servers.append(f"[{fields[1]}]:53" if ":" in fields[1] else f"{fields[1]}:53")
    query = bytes.fromhex("123401000001000000000000") + b"\x03api\x04test\x00\x00\x01\x00\x01"
    for server in servers:
        host, _, port = server.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.settimeout(1)
            with pytest.raises(OSError):  # unreachable, refused or (at worst) no answer in 1 s
                sock.connect((host, int(port)))
                sock.send(query)
                sock.recv(512)
