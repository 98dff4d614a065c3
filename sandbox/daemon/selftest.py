"""The self-test: before the daemon reports ready (and on `sealgate sandbox selftest`), a canary
sandbox must fail to get out every way it is forbidden and must reach the proxy.

Each forbidden way is judged twice: by what the canary saw (`sandbox.guest.probe`: no connection, or
only the proxy's refusal) and by what arrived where it aimed: the daemon listens on the host
(TCP and UDP on every address) and a second canary listens inside its own sandbox, and any
packet that reaches one of them fails its check, whatever the canary was told. The ways: TCP
and UDP to the host (its loopback, the end of the sandbox's link, the gateway's other ports),
to the outside, to another sandbox; DNS (every name is the proxy's; nothing is forwarded);
IPv6; the cloud metadata address, directly and through the proxy; the proxy's control socket
and the daemon's own socket (absent from the sandbox); the agent, which no command may signal
or open (`sandbox.guest.agent`). And the one way allowed: the proxy answers on the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sealgate.proxy import control_socket
from sealgate.reasons import SealgateError

from ..guest import staging
from .daemon import Daemon
from .session import Command, Options, Session

_OUTSIDE = "198.51.100.7"  # TEST-NET-2: never a real host
_LISTEN = """
import socket, sys, time
s = socket.socket(); s.bind(("0.0.0.0", 0)); s.listen(16); s.settimeout(0.1)
print(s.getsockname()[1], flush=True)
count, end = 0, time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    try:
        s.accept()[0].close(); count += 1
    except OSError:
        pass
print(count, flush=True)
"""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


class _Listeners:
    """TCP and UDP on every address of the host: anything that arrives is an escape."""

    def __init__(self) -> None:
        self.tcp = socket.create_server(("0.0.0.0", 0), backlog=64)  # noqa: S104
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("0.0.0.0", 0))  # noqa: S104
        for sock in (self.tcp, self.udp):
            sock.setblocking(False)
        self.arrived: list[str] = []
        loop = asyncio.get_running_loop()
        loop.add_reader(self.tcp, self._accept)
        loop.add_reader(self.udp, self._datagram)

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            conn, peer = self.tcp.accept()
            conn.close()
            self.arrived.append(f"tcp from {peer[0]}")

    def _datagram(self) -> None:
        with contextlib.suppress(OSError):
            _, peer = self.udp.recvfrom(512)
            self.arrived.append(f"udp from {peer[0]}")

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in (self.tcp, self.udp):
            loop.remove_reader(sock)
            sock.close()


async def run(daemon: Daemon, own_socket: Path | None = None) -> list[Check]:
    """Every check, in order; a canary that cannot even start is one failed check."""
    config = daemon.config.slots
    canaries = []
    try:
        for _ in range(2):
            canaries.append(await daemon.canary())
    except SealgateError as exc:
        for made in canaries:
            await daemon.discard(made)
        return [Check("canary", False, f"cannot start a canary sandbox: {exc}")]
    a, b = (Session(f"selftest-{n}", made, Options(sandbox="(selftest)"))
            for n, made in enumerate(canaries))
    listeners = _Listeners()
    try:
        return await _checks(a, b, listeners, config.proxy_port,
                             [control_socket(config.state), *_opt(own_socket)])
    finally:
        listeners.close()
        for made in canaries:
            await daemon.discard(made)


def _opt(path: Path | None) -> list[Path]:
    return [] if path is None else [path]


async def _checks(a: Session, b: Session, listeners: _Listeners, proxy_port: int,
                  sockets: list[Path]) -> list[Check]:
    link = a.slot.link
    host, gw = str(link.host_ip), str(link.gateway)
    tcp_port, udp_port = listeners.tcp.getsockname()[1], listeners.udp.getsockname()[1]
    other = b.run(Command(["/usr/bin/python3", "-I", "-S", "-c", _LISTEN, "3"], timeout=15))
    heard = bytearray()  # the other sandbox's listener: its port, then what reached it
    async for name, data in other:
        if name == "stdout" and isinstance(data, bytes):
            heard += data
        if b"\n" in heard:
            break
    other_port = int(heard.split()[0]) if heard.split() else 0
    plan: dict[str, Any] = {
        "tcp": [["tcp to the host's loopback", "127.0.0.1", tcp_port],
                ["tcp to the link's host end", host, tcp_port],
                ["tcp to the gateway's other ports", gw, tcp_port],
                ["tcp to the outside", _OUTSIDE, tcp_port],
                ["tcp to another sandbox", str(b.slot.link.sandbox_ip), other_port],
                ["tcp over IPv6", "::1", tcp_port],
                ["the proxy answers", gw, proxy_port]],
        "udp": [["udp to the link's host end", host, udp_port],
                ["udp to the gateway", gw, udp_port],
                ["udp to the outside", _OUTSIDE, udp_port],
                ["dns to the outside", _OUTSIDE, 53]],
        "http": [["metadata, directly", "http://169.254.169.254/latest/meta-data/", None],
                 ["metadata, through the proxy", "http://169.254.169.254/latest/meta-data/",
                  f"http://{gw}:{proxy_port}"]],
        "absent": [[f"{path.name} not in the sandbox", str(path)] for path in sockets],
        "dns": "metadata.google.internal",
        "reach": True,
    }
    source = staging.PROBE.read_bytes().decode()
    out = bytearray()
    async for name, data in a.run(Command(["/usr/bin/python3", "-I", "-S", "-c", source],
                                          stdin=json.dumps(plan).encode(), timeout=60)):
        if name == "stdout" and isinstance(data, bytes):
            out += data
    async for name, data in other:
        if name == "stdout" and isinstance(data, bytes):
            heard += data
    reached_other = bytes(heard.split()[-1]) if len(heard.split()) == 2 else b"?"
    try:
        seen: dict[str, Any] = json.loads(out)
    except ValueError:
        return [Check("probe", False, f"the probe printed no result: {bytes(out[:200])!r}")]
    return _judge(plan, seen, host, listeners.arrived, reached_other)


def _judge(plan: dict[str, Any], seen: dict[str, Any], host: str, arrived: list[str],
           reached_other: bytes) -> list[Check]:
    checks = []
    for name, *_ in plan["tcp"] + plan["udp"] + plan["http"]:
        result = str(seen.get(name, "not tried"))
        if name == "the proxy answers":
            checks.append(Check(name, not result.startswith(("failed", "not tried")), result))
            continue
        blocked = result.startswith("failed") or result == "refused by the proxy"
        checks.append(Check(name, blocked, result))
    for name, _ in plan["absent"]:
        checks.append(Check(name, seen.get(name) == "absent", str(seen.get(name))))
    checks.append(Check("names answer only with the proxy", seen.get("dns") == [host],
                        str(seen.get("dns"))))
    checks.append(Check("IPv6 off in the sandbox", seen.get("ipv6_disabled") is True,
                        str(seen.get("ipv6_disabled"))))
    reach = seen.get("reach")
    checks.append(Check("no other process within a command's reach",
                        isinstance(reach, dict) and not any(reach.values()),
                        "none" if reach == {"signal": [], "fds": [], "mem": []} else
                        f"could signal, open the descriptors of, open the memory of: {reach}"))
    checks.append(Check("nothing arrived on the host", not arrived,
                        ", ".join(arrived) or "nothing"))
    checks.append(Check("nothing arrived in another sandbox", reached_other == b"0",
                        f"{reached_other.decode(errors='replace')} connection(s)"))
    return checks
