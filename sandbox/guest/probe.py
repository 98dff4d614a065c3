"""The self-test's probe: runs *inside* a canary sandbox (the host's /usr/bin/python3, like the
agent; nothing of sealgate's imported), tries every way out it is given, and prints one JSON
object of what happened to each. It judges nothing: the daemon compares what the probe saw with
what its own listeners on the host received (`sandbox.daemon.selftest`).

Input on stdin: {"tcp": [[name, host, port], ...], "udp": [[name, host, port], ...],
"http": [[name, url, proxy-or-null], ...], "absent": [[name, path], ...], "dns": name,
"proxy": [host, port], "reach": true}.

`reach`: which other processes the probe could signal, open the descriptors of or open the
memory of (`_reach`; nothing is sent or written). Its own namespace's init, its parent, is not
counted as signalled: an init takes no signal from inside but those it handles, and holds
nothing (`sandbox.guest.agent`).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import urllib.request
from typing import Any

_TIMEOUT = 2.0


def _tcp(host: str, port: int) -> str:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(_TIMEOUT)
            sock.connect((host, port))
            sock.sendall(b"GET / HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            answer = sock.recv(4096)
    except OSError as exc:
        return f"failed: {type(exc).__name__}"
    sealgate = b"x-sealgate-error" in answer.lower()
    return "refused by the proxy" if sealgate else f"connected: {answer[:40]!r}"


def _udp(host: str, port: int) -> str:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.3)
            sock.sendto(b"sealgate-probe", (host, port))
            sock.recv(512)
    except OSError as exc:
        return f"failed: {type(exc).__name__}"
    return "answered"


def _http(url: str, proxy: str | None) -> str:
    handler = urllib.request.ProxyHandler({"http": proxy} if proxy else {})
    opener = urllib.request.build_opener(handler)
    try:
        with opener.open(url, timeout=_TIMEOUT) as response:
            headers = response.headers
            status = response.status
    except urllib.error.HTTPError as exc:
        headers, status = exc.headers, exc.code
    except OSError as exc:
        return f"failed: {type(exc).__name__}"
    if headers.get("X-Sealgate-Error"):
        return "refused by the proxy"
    return f"answered {status}"


def _dns(name: str) -> list[str]:
    try:
        return sorted({str(a[4][0]) for a in socket.getaddrinfo(name, 80, socket.AF_INET)})
    except OSError as exc:
        return [f"failed: {type(exc).__name__}"]


def _opens_a_descriptor(pid: int) -> bool:
    """Whether one of `pid`'s descriptors could be opened through /proc (a socket never can),
    /dev/null aside: gVisor's kernel (2022-12) lists and opens another uid's that way, and the
    agent's standard output and error are the sandbox's /dev/null."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        try:
            opened = os.open(f"/proc/{pid}/fd/{name}", os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            info = os.fstat(opened)
        finally:
            os.close(opened)
        if not (stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 3)):
            return True
    return False


def _reach() -> dict[str, list[int]]:
    me, parent = os.getpid(), os.getppid()
    found: dict[str, list[int]] = {"signal": [], "fds": [], "mem": []}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            os.kill(pid, 0)
            if not (pid == 1 and parent == 1):
                found["signal"].append(pid)
        except OSError:
            pass
        if _opens_a_descriptor(pid):
            found["fds"].append(pid)
        try:
            os.close(os.open(f"/proc/{pid}/mem", os.O_RDWR))
            found["mem"].append(pid)
        except OSError:
            pass
    return found


def main() -> None:
    plan: dict[str, Any] = json.loads(sys.stdin.read())
    seen: dict[str, Any] = {}
    for name, host, port in plan.get("tcp", []):
        seen[name] = _tcp(host, port)
    for name, host, port in plan.get("udp", []):
        seen[name] = _udp(host, port)
    for name, url, proxy in plan.get("http", []):
        seen[name] = _http(url, proxy)
    for name, path in plan.get("absent", []):
        seen[name] = "present" if os.path.exists(path) else "absent"
    if "dns" in plan:
        seen["dns"] = _dns(plan["dns"])
    if plan.get("reach"):
        seen["reach"] = _reach()
    try:
        with open("/proc/sys/net/ipv6/conf/all/disable_ipv6") as fh:
            seen["ipv6_disabled"] = fh.read().strip() == "1"
    except OSError:
        seen["ipv6_disabled"] = True  # no IPv6 in the kernel at all
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
