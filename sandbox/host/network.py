"""A sandbox's network: its own namespace, one veth link to the host, and no way out but the
proxy.

Every sandbox gets a /30 of the sandbox range: the host end of its link is .1, the sandbox .2,
and its default route points at the host. The proxy listens on the *gateway*, one address on
the host's loopback interface that every sandbox reaches over its own link, so the proxy needs
neither a listener per sandbox nor a wildcard bind. What may cross the link is decided by
nftables in the host's namespace (`sandbox.host.firewall`), where nothing inside the sandbox can
change it: the namespace belongs to the host's user namespace, so even a process that were
root inside holds no capability over it. IPv6 is switched off on both ends of the link (a veth
gets a link-local IPv6 address otherwise, a second way to the host).

Namespaces are `sg-<n>` and links `sgh<n>` (host) / `sgn<n>` (sandbox); the lowest free `n` is
taken under a lock, so concurrent runs never collide.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from ..errors import SandboxError

DEFAULT_RANGE = IPv4Network("10.200.0.0/16")
DEFAULT_GATEWAY = IPv4Address("10.200.255.254")
RUN_DIR = Path("/run/sealgate")
_NETNS_DIR = Path("/run/netns")
_LOCK_SECONDS = 30


class NetworkError(SandboxError):
    """The sandbox network could not be set up; nothing of it is left behind."""



@dataclass(frozen=True)
class Plan:
    """Where sandboxes live: their address range and the gateway the proxy listens on."""

    range: IPv4Network = DEFAULT_RANGE
    gateway: IPv4Address = DEFAULT_GATEWAY

    def __post_init__(self) -> None:
        if self.range.prefixlen > 28:
            raise NetworkError(f"sandbox range {self.range} is too small; use a /28 or wider")

    @cached_property
    def links(self) -> list[IPv4Network]:
        """The /30 links sandboxes get, in order; never the one holding the gateway."""
        return [net for net in self.range.subnets(new_prefix=30) if self.gateway not in net]


@dataclass(frozen=True)
class Link:
    index: int
    netns: str
    host_if: str
    sandbox_if: str
    host_ip: IPv4Address
    sandbox_ip: IPv4Address
    gateway: IPv4Address


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        raise NetworkError(f"{' '.join(argv)} did not finish within 20 s") from None


def ip(*args: str) -> None:
    """Run iproute2; a failure is a NetworkError naming the command and what ip said."""
    done = _run(["ip", *args])
    if done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def ensure_gateway(plan: Plan) -> None:
    """Put the gateway address on the host's loopback (once; the proxy binds it)."""
    if f" {plan.gateway}/32 " not in _run(["ip", "-4", "-o", "addr", "show", "dev", "lo"]).stdout:
        ip("addr", "add", f"{plan.gateway}/32", "dev", "lo")


def remove_gateway(plan: Plan) -> None:
    with contextlib.suppress(NetworkError):
        _run(["ip", "addr", "del", f"{plan.gateway}/32", "dev", "lo"])


@contextmanager
def lock() -> Iterator[None]:
    """Held while a link is taken and its firewall loaded (and while a dead holder's are
    cleaned up): an index is never taken twice, nor while its last holder's lease is left."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    # Leases and the lock: nothing here is for a sandbox's user (its files come in memory).
    RUN_DIR.chmod(0o700)
    with open(RUN_DIR / "network.lock", "a") as fh:
        deadline = time.monotonic() + _LOCK_SECONDS
        # Held for tens of milliseconds at a time (a daemon's creates and deletes take turns
        # at it): looked at again soon, then less often.
        pause = 0.001
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise NetworkError(f"{RUN_DIR / 'network.lock'} held for over "
                                       f"{_LOCK_SECONDS} s by another run") from None
                time.sleep(pause)
                pause = min(pause * 1.5, 0.02)
        yield


def free(plan: Plan) -> Link:
    """The link at the lowest free index, not built yet (hold `lock()` until it is leased)."""
    index = next((i for i in range(len(plan.links)) if not _exists(i)), None)
    if index is None:
        raise NetworkError(f"all {len(plan.links)} sandbox links of {plan.range} are in use")
    return link_at(plan, index)


def build(link: Link) -> None:
    """Its namespace and link; torn down again if any step fails."""
    try:
        _build(link)
    except BaseException:
        destroy(link.index)
        raise


def lease_path(index: int) -> Path:
    """Where the holder of link `index` writes its lease (`sandbox.host.lease`)."""
    return RUN_DIR / f"lease-{index}.json"


def _exists(index: int) -> bool:
    # A lease is released last, once the namespace, link and table of its holder are gone: while
    # it exists the index is not free, so a holder tears its link down without the lock, and
    # the lock is held only to take one. (It also sees holders in other network namespaces,
    # which /sys/class/net, showing the namespace sysfs was mounted in, may not.)
    return (lease_path(index).exists() or (_NETNS_DIR / f"sg-{index}").exists()
            or Path(f"/sys/class/net/sgh{index}").exists())


def link_at(plan: Plan, index: int) -> Link:
    net = plan.links[index]
    return Link(index, f"sg-{index}", f"sgh{index}", f"sgn{index}", net[1], net[2], plan.gateway)


def _build(link: Link) -> None:
    # Four processes rather than eleven: each ip or sysctl costs a fork and exec, and a slot's
    # link is on the path of every cold create. The peer is made inside the namespace (moving
    # a link there afterwards waits out an RCU grace period, ~25 ms).
    _batch(None, [f"netns add {link.netns}",
                  f"link add {link.host_if} type veth peer name {link.sandbox_if} "
                  f"netns {link.netns}"])
    _ipv6_off(link)
    _batch(None, [f"addr add {link.host_ip}/30 dev {link.host_if}",
                  f"link set {link.host_if} up"])
    _batch(link.netns, [f"addr add {link.sandbox_ip}/30 dev {link.sandbox_if}",
                        f"link set {link.sandbox_if} up", "link set lo up",
                        f"route add default via {link.host_ip}"])


def _batch(netns: str | None, commands: list[str]) -> None:
    """Several ip commands in one process, stopping at the first that fails (a
    NetworkError naming it)."""
    argv = ["ip", *(["-n", netns] if netns is not None else []), "-batch", "-"]
    try:
        done = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True,
                              text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        raise NetworkError(f"{' '.join(argv)} did not finish within 20 s") from None
    if done.returncode != 0:
        raise NetworkError(f"{' '.join(argv[:-2])}: {'; '.join(commands)}: "
                           f"{done.stderr.strip() or done.returncode}")


def _ipv6_off(link: Link) -> None:
    """Before either end comes up, so neither ever gets a link-local address. The host's end
    is written here (this is the host's namespace); the namespace's needs a process in it."""
    if not os.path.exists("/proc/sys/net/ipv6"):
        return
    try:
        Path(f"/proc/sys/net/ipv6/conf/{link.host_if}/disable_ipv6").write_text("1")
    except OSError as exc:
        raise NetworkError(f"cannot switch IPv6 off on {link.host_if}: {exc}") from None
    keys = [f"net.ipv6.conf.{link.sandbox_if}.disable_ipv6=1",
            "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
    done = _run(["ip", "netns", "exec", link.netns, "sysctl", "-q", "-w", *keys])
    if done.returncode != 0:
        raise NetworkError(f"cannot switch IPv6 off on {link.sandbox_if}: "
                           f"{done.stderr.strip()}")


def destroy(index: int) -> None:
    """Remove link `index` and its namespace; whatever is already gone is fine."""
    # One process, carrying on past what is already gone (-force).
    with contextlib.suppress(NetworkError, OSError):
        subprocess.run(["ip", "-force", "-batch", "-"],
                       input=f"link del sgh{index}\nnetns del sg-{index}\n",
                       capture_output=True, text=True, timeout=20, check=False)
