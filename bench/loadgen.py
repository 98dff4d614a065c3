"""Load generators for the proxy benchmark: wrk for plain HTTP, hey for HTTPS, and CPU accounting.

wrk sends plain-HTTP requests through a forward proxy with `wrk_proxy.lua` (absolute-form
request line, optional Proxy-Authorization). hey does HTTPS through a proxy the way real clients
do: CONNECT, then TLS inside the tunnel, keep-alive unless told otherwise. Both report their own
latency percentiles; CPU used by the processes under test is read from /proc so each result says
how busy the proxy was and how much CPU something else on the machine took meanwhile.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

WRK_SCRIPT = Path(__file__).resolve().parent / "wrk_proxy.lua"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_GRACE_SECONDS = 30.0


class LoadError(RuntimeError):
    """A load generator failed or printed something we cannot read."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One measurement: what the load generator saw, and what the CPUs did meanwhile."""

    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    wall_s: float
    loadgen_cpu_s: float


@dataclass(frozen=True, slots=True)
class Target:
    """What a client asks for and, if it goes through a proxy, which proxy and as whom."""

    url: str  # the origin URL, e.g. http://origin.bench:18080/1k
    proxy: tuple[str, int] | None = None
    credentials: tuple[str, str] | None = None  # (sandbox id, key) for Proxy-Authorization
    # "Name: value" lines sent on every request to the origin (inside the tunnel for HTTPS)
    headers: tuple[str, ...] = ()


def run_wrk(target: Target, concurrency: int, seconds: int, prefix: Sequence[str]) -> Sample:
    """Plain HTTP keep-alive load with wrk (one thread), through `target.proxy` if set."""
    scheme, _, rest = target.url.partition("://")
    if scheme != "http":
        raise LoadError(f"wrk only drives plain HTTP here, not {scheme!r}")
    if target.headers:
        raise LoadError("wrk_proxy.lua sends no extra request headers; use hey")
    authority, _, path = rest.partition("/")
    env = dict(os.environ)
    if target.proxy is None:
        connect = target.url
        env["REQUEST_TARGET"] = "/" + path
        env.pop("HOST_HEADER", None)
    else:
        connect = f"http://{target.proxy[0]}:{target.proxy[1]}/"
        env["REQUEST_TARGET"] = target.url
        env["HOST_HEADER"] = authority
    env.pop("PROXY_AUTH", None)
    if target.credentials is not None:
        pair = f"{target.credentials[0]}:{target.credentials[1]}".encode()
        env["PROXY_AUTH"] = base64.b64encode(pair).decode()
    argv = [
        *prefix, "wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "--timeout", "10s",
        "-s", str(WRK_SCRIPT), connect,
    ]
    out, wall, cpu = _run(argv, env, seconds)
    found = re.search(r"^WRK_JSON (\{.*\})$", out, re.MULTILINE)
    if found is None:
        raise LoadError(f"wrk printed no summary:\n{out[-2000:]}")
    data = json.loads(found.group(1))
    requests = int(data["requests"])
    errors = sum(
        int(data[k])
        for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")
    )
    return Sample(
        rps=requests / (data["duration_us"] / 1e6),
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        requests=requests,
        errors=errors,
        wall_s=wall,
        loadgen_cpu_s=cpu,
    )


def run_hey(
    target: Target, concurrency: int, seconds: int, prefix: Sequence[str], *, keepalive: bool
) -> Sample:
    """HTTPS load with hey: CONNECT + TLS through `target.proxy` if set; one Go thread."""
    argv = [*prefix, "hey", "-cpus", "1", "-z", f"{seconds}s", "-c", str(concurrency)]
    if not keepalive:
        argv.append("-disable-keepalive")
    # Go's client sends -H headers on the requests inside a CONNECT tunnel, never on the
    # CONNECT itself, which carries only the proxy URL's credentials.
    for header in target.headers:
        argv += ["-H", header]
    if target.proxy is not None:
        auth = ""
        if target.credentials is not None:
            auth = f"{target.credentials[0]}:{target.credentials[1]}@"
        argv += ["-x", f"http://{auth}{target.proxy[0]}:{target.proxy[1]}"]
    # hey copies the Host header into the TLS ServerName, and by default that is host:port: an
    # SNI no server accepts as a name (mitmproxy reads it as "no SNI"). A Host without the port
    # gives the SNI a browser would send, and none at all for an IP literal.
    host = urlsplit(target.url).hostname or ""
    argv += ["-host", f"[{host}]" if ":" in host else host, target.url]
    out, wall, cpu = _run(argv, dict(os.environ), seconds)
    return _parse_hey(out, wall, cpu)


def _parse_hey(out: str, wall: float, cpu: float) -> Sample:
    rps = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    if rps is None:
        # hey prints the proxy URL in its errors; keep credentials out of ours.
        raise LoadError(f"hey printed no summary:\n{_redact(out)[-2000:]}")
    percentiles = {
        int(p): float(s) * 1000 for p, s in re.findall(r"^\s+(\d+)% in ([0-9.]+) secs", out, re.M)
    }
    ok = 0
    statuses = 0
    for code, count in re.findall(r"^\s+\[(\d{3})\]\s+(\d+) responses", out, re.MULTILINE):
        statuses += int(count)
        ok += int(count) if code == "200" else 0
    _, _, error_section = out.partition("Error distribution:")
    failed = sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]", error_section, re.MULTILINE))
    return Sample(
        rps=float(rps.group(1)),
        p50_ms=percentiles.get(50, float("nan")),
        p99_ms=percentiles.get(99, float("nan")),
        requests=ok,
        errors=statuses - ok + failed,
        wall_s=wall,
        loadgen_cpu_s=cpu,
    )


def _run(argv: list[str], env: dict[str, str], seconds: int) -> tuple[str, float, float]:
    """Run a load generator to completion; its own process group, killed if we are interrupted."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=seconds + _GRACE_SECONDS)
    except BaseException:
        _kill_group(proc)
        raise
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise LoadError(f"{argv[len(argv) - 1]}: {Path(argv[0]).name} exited {proc.returncode}:\n"
                        f"{_redact(out)[-2000:]}")
    return out, wall, cpu


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)


def _redact(text: str) -> str:
    return re.sub(r"://[^/@\s]+@", "://***@", text)


# -- CPU accounting -------------------------------------------------------------------------


def group_cpu_seconds(pgids: Iterable[int]) -> dict[int, float]:
    """user+system CPU seconds of the live processes in each process group."""
    wanted = set(pgids)
    totals = dict.fromkeys(wanted, 0.0)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:  # exited while we looked
            continue
        # The command name may contain spaces and parentheses; fields resume after the last ')'.
        fields = raw[raw.rindex(b")") + 2 :].split()
        pgrp = int(fields[2])
        if pgrp in wanted:
            totals[pgrp] += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return totals


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent busy since boot (/proc/stat): user, system and interrupts.

    Interrupt time counts because without IRQ time accounting the kernel charges softirq work
    (loopback packet processing) to the interrupted process, so process times include it too.
    """
    with open("/proc/stat") as fh:
        fields = fh.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) / _CLOCK_TICKS


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
