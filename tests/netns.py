"""Test hosts in network namespaces the tests create (and always remove) themselves.

A namespace gets one veth pair to the host, a /30 of its own from 10.213.0.0/16, and no other
route: nothing in it can reach anything but the host side of its own link.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


def require_root_net() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (Debian: iproute2, nftables)")


def run(*args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class Netns:
    name: str
    host_if: str
    host_ip: str
    ns_ip: str

    def exec(self, *args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return run("ip", "netns", "exec", self.name, *args, check=False, timeout=timeout)


@contextlib.contextmanager
def netns() -> Iterator[Netns]:
    require_root_net()
    tag = secrets.token_hex(3)
    index = int(tag, 16) % 16000
    base = f"10.213.{index // 64}.{(index % 64) * 4}"
    octets = base.split(".")
    host_ip = ".".join([*octets[:3], str(int(octets[3]) + 1)])
    ns_ip = ".".join([*octets[:3], str(int(octets[3]) + 2)])
    ns = Netns(name=f"sgt-{tag}", host_if=f"tsh{tag}", host_ip=host_ip, ns_ip=ns_ip)
    peer = f"tsn{tag}"
    try:
        run("ip", "netns", "add", ns.name)
        run("ip", "link", "add", ns.host_if, "type", "veth", "peer", "name", peer)
        run("ip", "link", "set", peer, "netns", ns.name)
        run("ip", "addr", "add", f"{host_ip}/30", "dev", ns.host_if)
        run("ip", "link", "set", ns.host_if, "up")
        run("ip", "-n", ns.name, "addr", "add", f"{ns_ip}/30", "dev", peer)
        run("ip", "-n", ns.name, "link", "set", peer, "up")
        run("ip", "-n", ns.name, "link", "set", "lo", "up")
        yield ns
    finally:
        run("ip", "link", "del", ns.host_if, check=False)
        run("ip", "netns", "del", ns.name, check=False)
