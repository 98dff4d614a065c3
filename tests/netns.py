"""The test session's own network namespace, and test hosts in namespaces the tests create.

`isolate_session` (called by conftest at import, before any thread exists) moves the pytest
process into a fresh network namespace holding only `lo`. Every proxy, origin, sandbox and
namespace a test starts inherits it, so a broken guard that dials a denied address for real
finds no route off the machine (and no host listener, no host name server): the test fails and
nothing leaves. As root that is unshare(CLONE_NEWNET); otherwise a user namespace mapping only
the caller's own uid and gid comes with it, so root-only tests still skip.

A test namespace gets one veth pair to the session's, a /30 of its own from 10.213.0.0/16, and
no other route: nothing in it can reach anything but the host side of its own link.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import os
import secrets
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

_T = TypeVar("_T")
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ_FLAGS = struct.Struct("16sH22x")  # struct ifreq: name, then ifr_flags in the union
_LIBC = ctypes.CDLL(None, use_errno=True)


class IsolationError(RuntimeError):
    """The session could not be given a network namespace of its own."""


def _libc_call(name: str, *args: int) -> None:
    if getattr(_LIBC, name)(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")


def interfaces() -> list[str]:
    """The network interfaces of the calling thread's namespace."""
    return [name for _, name in socket.if_nameindex()]


def netns_inode(pid: int | str = "self") -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = _IFREQ_FLAGS.pack(b"lo", 0)
        _, flags = _IFREQ_FLAGS.unpack(fcntl.ioctl(sock, _SIOCGIFFLAGS, request))
        if not flags & _IFF_UP:
            fcntl.ioctl(sock, _SIOCSIFFLAGS, _IFREQ_FLAGS.pack(b"lo", flags | _IFF_UP))


def isolate_session(worker: bool = False) -> str:
    """Put this process in a network namespace with only `lo` (up); say how it was done.

    A namespace that already has only `lo` (`unshare -n`, a network-less container) is kept,
    except by a parallel `worker` (pytest-xdist) running as root: it inherited the namespace of
    the pytest that started it, which its sibling workers share, and takes one of its own so
    that nft tables, links and addresses its tests make are seen by no other worker's tests.
    """
    how = "already isolated"
    uid, gid = os.geteuid(), os.getegid()
    if worker and uid == 0:
        # Here execnet's thread is already running: it only moves the worker's messages over
        # the pipes it inherited, so it may stay behind. This thread runs the tests, and every
        # thread and process they start follows it.
        try:
            _libc_call("unshare", _CLONE_NEWNET)
        except OSError as exc:
            raise IsolationError(f"cannot create a network namespace: {exc}") from exc
        how = "unshare(CLONE_NEWNET), this worker's own"
    elif interfaces() != ["lo"]:
        # Only the calling thread changes namespace; a thread started earlier would stay outside.
        threads = len(os.listdir("/proc/self/task"))
        if threads != 1:
            raise IsolationError(f"{threads} threads are already running")
        try:
            if uid == 0:
                _libc_call("unshare", _CLONE_NEWNET)
                how = "unshare(CLONE_NEWNET)"
            else:
                _libc_call("unshare", _CLONE_NEWUSER | _CLONE_NEWNET)
                Path("/proc/self/setgroups").write_text("deny")
                Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
                Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
                how = f"unshare(CLONE_NEWUSER|CLONE_NEWNET), uid {uid} mapped to itself"
        except OSError as exc:
            raise IsolationError(f"cannot create a network namespace: {exc}") from exc
    try:
        _loopback_up()
    except OSError as exc:
        raise IsolationError(f"cannot bring lo up in the session's namespace: {exc}") from exc
    if interfaces() != ["lo"]:
        raise IsolationError(f"the session's namespace has interfaces {interfaces()}")
    return how


def in_netns(name: str, make: Callable[[], _T]) -> _T:
    """`make()` run on a thread inside namespace `name`: the sockets it creates belong there
    (and keep belonging there, whichever thread uses them), nothing else leaves this one."""
    result: list[_T] = []
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            with open(f"/run/netns/{name}") as fd:
                _libc_call("setns", fd.fileno(), _CLONE_NEWNET)
            result.append(make())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=enter, name=f"in-{name}")
    thread.start()
    thread.join(timeout=20)
    if errors:
        raise errors[0]
    if not result:
        raise TimeoutError(f"nothing made inside {name} within 20 s")
    return result[0]


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
def netns(link: str | None = None) -> Iterator[Netns]:
    """A namespace; `link` (a /30) chooses its link's addresses instead of 10.213.0.0/16."""
    require_root_net()
    tag = secrets.token_hex(3)
    index = int(tag, 16) % 16000
    net = ipaddress.IPv4Network(link or f"10.213.{index // 64}.{(index % 64) * 4}/30")
    host_ip, ns_ip = str(net[1]), str(net[2])
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
