"""Side by side: direct, stock mitmdump, sealgate and squid, in one run on loopback.

    .venv/bin/python bench/proxy_overhead.py            # full run, about 7 minutes
    .venv/bin/python bench/proxy_overhead.py --quick    # about 2 minutes

Requests/s and p50/p99 latency at concurrency 1, 16 and 64, plain HTTP (wrk) and intercepted
HTTPS keep-alive (hey), plus sealgate with two workers, tunnelled CONNECT and new intercepted
connections per second. The proxies run on CPU 1, the load generator and the nginx origin on
CPU 0. Every configuration is measured once per round, rounds interleave the configurations, and
each ratio is taken within a round, then the median over rounds is reported: the machine drifts
by tens of percent over minutes, and a ratio of two runs seconds apart cancels most of that.
Results go to docs/performance.md and docs/performance.png; see bench/README.md.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import hashlib
import http.client
import json
import os
import platform
import pwd
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.* (stub DNS, test CA) when run as a script

from loadgen import (  # noqa: E402
    LoadError,
    Sample,
    Target,
    group_cpu_seconds,
    machine_busy_seconds,
    run_hey,
    run_wrk,
    self_cpu_seconds,
)

from tests.dnsstub import StubDNS  # noqa: E402
from tests.harness import OriginCA, free_port  # noqa: E402

ORIGIN_NAME = "origin.bench"  # sealgate resolves it through the stub DNS server
TUNNEL_NAME = "tunnel.bench"  # a rule without method/path limits: passed through, not decrypted
SANDBOX = "bench-1"
BODY_PATH = "/1k"
BODY = b"x" * 1024
PROXY_CPU, LOAD_CPU = "1", "0"
START_TIMEOUT = 60.0

# kind -> what it measures, with which load generator
KINDS = {
    "http": "plain HTTP keep-alive (wrk)",
    "https": "HTTPS through CONNECT, keep-alive (hey)",
    "newconn": "HTTPS, one request per connection: TCP + CONNECT + TLS each time (hey)",
}



@dataclass(frozen=True)
class Goal:
    """A target from the issue: `num`'s req/s over `den`'s, within a round, at least `need`."""

    label: str
    short: str
    kind: str
    concurrency: int
    num: str
    den: str
    need: float


TARGETS = [
    Goal("sealgate vs mitmdump, plain HTTP, c=16", "http", "http", 16, "sealgate", "mitmdump",
         1.5),
    Goal("sealgate vs mitmdump, intercepted HTTPS, c=16", "https", "https", 16, "sealgate",
         "mitmdump", 1.5),
    Goal("--workers 2 vs 1 worker, plain HTTP, c=16", "workers", "http", 16, "sealgate-w2",
         "sealgate", 1.7),
    Goal("tunnelled CONNECT vs squid, c=16", "tunnel", "https", 16, "sealgate-tunnel", "squid",
         0.5),
    Goal("new intercepted connections/s vs mitmdump, c=16", "new conns", "newconn", 16,
         "sealgate", "mitmdump", 4.0),
]
GUARD_TARGET_US = 20.0


class BenchError(RuntimeError):
    """The benchmark cannot run or a part of it failed; the message says what and where."""


# -- processes --------------------------------------------------------------------------------


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pgid(self) -> int:
        return self.proc.pid  # started with start_new_session: pid == process group id

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class Services:
    """Every process group this run starts; `stop_all` ends each of them, whatever happened."""

    def __init__(self) -> None:
        self.started: list[Service] = []

    def start(
        self, name: str, argv: list[str], port: int, log: Path, listeners: int = 1
    ) -> Service:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        service = Service(name, proc, port, log)
        self.started.append(service)
        deadline = time.monotonic() + START_TIMEOUT
        while _listeners(port) < listeners:
            if proc.poll() is not None:
                raise BenchError(f"{name} exited {proc.returncode} at start:\n{service.tail()}")
            if time.monotonic() > deadline:
                raise BenchError(f"{name} not listening on port {port} after {START_TIMEOUT:.0f} s:"
                                 f"\n{service.tail()}")
            time.sleep(0.05)
        return service

    def stop_all(self) -> None:
        for service in reversed(self.started):
            _signal_group(service.pgid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for service in reversed(self.started):
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            _signal_group(service.pgid, signal.SIGKILL)  # stragglers in the group, if any
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.proc.wait(timeout=5)
        self.started.clear()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _listeners(port: int) -> int:
    """Listening TCP sockets on 127.0.0.1:port (several with SO_REUSEPORT workers)."""
    wanted = f"0100007F:{port:04X}"
    count = 0
    with open("/proc/net/tcp") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 3 and fields[1] == wanted and fields[3] == "0A":
                count += 1
    return count


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")


# -- the set-up: origin, DNS, proxies ---------------------------------------------------------


@dataclass
class Lane:
    """One configuration a client talks to: direct or through one proxy."""

    name: str
    label: str
    http_url: str | None
    https_url: str | None
    service: Service | None = None
    credentials: tuple[str, str] | None = None

    def target(self, kind: str) -> Target:
        url = self.http_url if kind == "http" else self.https_url
        assert url is not None
        proxy = ("127.0.0.1", self.service.port) if self.service is not None else None
        return Target(url, proxy, self.credentials)


@dataclass
class Setup:
    work: Path
    pin: bool
    services: Services = field(default_factory=Services)
    lanes: dict[str, Lane] = field(default_factory=dict)
    dns: StubDNS | None = None

    def prefix(self, cpu: str) -> list[str]:
        return ["taskset", "-c", cpu] if self.pin else []


def tools() -> dict[str, str]:
    """Paths of the external programs, or a BenchError naming the Debian packages to install."""
    venv_bin = Path(sys.executable).parent
    found: dict[str, str] = {}
    missing: list[str] = []
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    for tool, package in [("wrk", "wrk"), ("hey", "hey"), ("nginx", "nginx-light"),
                          ("squid", "squid"), ("taskset", "util-linux")]:
        path = shutil.which(tool, path=search)
        if path is None:
            missing.append(package)
        else:
            found[tool] = path
    for tool in ("mitmdump", "sealgate"):
        path = shutil.which(tool, path=str(venv_bin))
        if path is None:
            raise BenchError(f"{tool} not found next to {sys.executable}; run `make` set-up first")
        found[tool] = path
    if missing:
        raise BenchError(
            "missing tools; install the Debian packages with\n"
            f"    apt-get install -y {' '.join(missing)}\n"
            f"or: bash scripts/debian-deps.sh {' '.join(missing)}"
        )
    return found


def start_all(setup: Setup, paths: dict[str, str]) -> None:
    work = setup.work
    ca = OriginCA(work)
    cert, key = ca.issue(ORIGIN_NAME, TUNNEL_NAME, "127.0.0.1")
    http_port, https_port = free_port(), free_port()
    (work / "nginx").mkdir()
    conf = work / "nginx" / "nginx.conf"
    conf.write_text(_nginx_conf(work / "nginx", http_port, https_port, cert, key))
    setup.services.start(
        "nginx",
        [*setup.prefix(LOAD_CPU), paths["nginx"], "-e", str(work / "nginx" / "error.log"),
         "-p", str(work / "nginx"), "-c", str(conf)],
        https_port, work / "nginx" / "stdout.log",
    )

    setup.dns = StubDNS().start()
    for name in (ORIGIN_NAME, TUNNEL_NAME):
        setup.dns.set(name, "A 127.0.0.1")
    dns_host, dns_port = setup.dns.address

    sandbox_key = secrets.token_urlsafe(18)
    rules = work / "rules.yaml"
    rules.write_text(_rules(http_port, https_port, sandbox_key))

    plain = f"http://127.0.0.1:{http_port}{BODY_PATH}"
    tls = f"https://127.0.0.1:{https_port}{BODY_PATH}"
    named_plain = f"http://{ORIGIN_NAME}:{http_port}{BODY_PATH}"
    named_tls = f"https://{ORIGIN_NAME}:{https_port}{BODY_PATH}"
    tunnel_tls = f"https://{TUNNEL_NAME}:{https_port}{BODY_PATH}"
    creds = (SANDBOX, sandbox_key)
    lanes = setup.lanes
    lanes["direct"] = Lane("direct", "direct", plain, tls)

    port = free_port()
    mitm = setup.services.start(
        "mitmdump",
        [*setup.prefix(PROXY_CPU), paths["mitmdump"], "-q", "--listen-host", "127.0.0.1",
         "-p", str(port), "--set", f"confdir={work / 'mitmdump'}",
         "--set", f"ssl_verify_upstream_trusted_ca={ca.path}"],
        port, work / "mitmdump.log",
    )
    lanes["mitmdump"] = Lane("mitmdump", "mitmdump (stock, no addon)", plain, tls, mitm)

    for name, workers in (("sealgate", 1), ("sealgate-w2", 2)):
        port = free_port()
        argv = [*setup.prefix(PROXY_CPU), paths["sealgate"], "proxy",
                "--listen", f"127.0.0.1:{port}", "--rules", str(rules),
                "--state", str(work / name), "--resolver", f"{dns_host}:{dns_port}",
                "--upstream-ca", str(ca.path)]
        if workers > 1:
            argv += ["--workers", str(workers)]
        service = setup.services.start(name, argv, port, work / f"{name}.log", listeners=workers)
        if workers > 1 and setup.pin:
            _spread_workers(service)
        label = "sealgate" if workers == 1 else "sealgate --workers 2"
        lanes[name] = Lane(name, label, named_plain, named_tls, service, creds)
        if workers == 1:
            lanes["sealgate-tunnel"] = Lane(
                "sealgate-tunnel", "sealgate, tunnelled (no interception)", None, tunnel_tls,
                service, creds,
            )

    port = free_port()
    squid_dir = work / "squid"
    squid_dir.mkdir()
    _let_squid_write(work, squid_dir)
    (squid_dir / "squid.conf").write_text(_squid_conf(squid_dir, port))
    squid = setup.services.start(
        "squid",
        [*setup.prefix(PROXY_CPU), paths["squid"], "-N", "-f", str(squid_dir / "squid.conf")],
        port, squid_dir / "stdout.log",
    )
    lanes["squid"] = Lane("squid", "squid (CONNECT tunnel for HTTPS)", plain, tls, squid)

    for lane in lanes.values():
        if lane.service is not None and lane.http_url is not None:
            _probe(lane)


def _spread_workers(service: Service) -> None:
    """Worker 0 stays on the proxy CPU, worker 1 goes to the other one.

    On a two-core machine the second worker has to share CPU 0 with the load generator and the
    origin; that is the only way a second worker can use a second core here.
    """
    for pid in _children(service.proc.pid):
        argv = _cmdline(pid)
        if "--worker-index" in argv:
            index = argv[argv.index("--worker-index") + 1]
            os.sched_setaffinity(pid, {int(PROXY_CPU) if index == "0" else int(LOAD_CPU)})


def _probe(lane: Lane) -> None:
    """One request through the proxy before measuring: a 403 or 407 measured fast is no result."""
    assert lane.service is not None and lane.http_url is not None
    authority = lane.http_url.split("/")[2]
    headers = {"Host": authority}
    if lane.credentials is not None:
        token = base64.b64encode(":".join(lane.credentials).encode()).decode()
        headers["Proxy-Authorization"] = f"Basic {token}"
    conn = http.client.HTTPConnection("127.0.0.1", lane.service.port, timeout=20)
    try:
        conn.request("GET", lane.http_url, headers=headers)
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status != 200 or body != BODY:
        raise BenchError(f"{lane.name}: probe got {response.status} "
                         f"{body[:300]!r}\n{lane.service.tail()}")


def _let_squid_write(work: Path, squid_dir: Path) -> None:
    """Squid run as root drops to its own user, which must reach its log and pid files."""
    if os.geteuid() != 0:
        return
    try:
        user = pwd.getpwnam("proxy")
    except KeyError:
        return
    work.chmod(0o711)  # traversable, not listable
    os.chown(squid_dir, user.pw_uid, user.pw_gid)


def _nginx_conf(prefix: Path, http_port: int, https_port: int, cert: Path, key: Path) -> str:
    temp = "\n".join(
        f"    {name}_temp_path {prefix / name};"
        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""
worker_processes 1;
daemon off;
pid {prefix / 'nginx.pid'};
error_log {prefix / 'error.log'} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
{temp}
    server {{
        listen 127.0.0.1:{http_port};
        listen 127.0.0.1:{https_port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        location = {BODY_PATH} {{
            default_type application/octet-stream;
            return 200 "{BODY.decode()}";
        }}
    }}
}}
"""


def _squid_conf(directory: Path, port: int) -> str:
    return f"""
http_port 127.0.0.1:{port}
http_access allow all
cache deny all
cache_mem 0 MB
access_log none
cache_store_log none
cache_log {directory / 'cache.log'}
pid_filename {directory / 'squid.pid'}
coredump_dir {directory}
netdb_filename none
pinger_enable off
shutdown_lifetime 0 seconds
logfile_rotate 0
max_filedescriptors 8192
"""


def _rules(http_port: int, https_port: int, key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"""
version: 1
policies:
  bench:
    mode: enforce
    allow:
      - host: {ORIGIN_NAME}
        ports: [{http_port}, {https_port}]
        methods: [GET]
        paths: ["{BODY_PATH}"]
      - host: {TUNNEL_NAME}
        ports: [{https_port}]
    allow_networks: [127.0.0.1/32]
    budgets:
      requests_per_second: 1000000
      burst: 1000000
      max_connections: 100000
      max_total_bytes: 1000000000000000
sandboxes:
  {SANDBOX}: {{policy: bench, key_sha256: "{digest}"}}
default_policy: null
"""


# -- measuring --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    kind: str
    concurrency: int
    lane: str


@dataclass
class Result:
    cell: Cell
    round: int
    sample: Sample | None
    proxy_cpu_s: float | None = None
    foreign_cpu_s: float = 0.0
    failure: str | None = None


def plan(quick: bool) -> list[list[Cell]]:
    """Groups of cells measured back to back; ratios are taken within a group."""
    levels = (1, 16, 64)
    groups: list[list[Cell]] = []
    for kind, lanes in (("http", ["direct", "mitmdump", "sealgate", "squid"]),
                        ("https", ["direct", "mitmdump", "sealgate", "sealgate-tunnel", "squid"])):
        for c in levels:
            extra = ["sealgate-w2"] if c > 1 else []
            groups.append([Cell(kind, c, lane) for lane in lanes + extra])
    newconn = [1, 16] if not quick else [16]
    for c in newconn:
        groups.append([Cell("newconn", c, lane)
                       for lane in ("direct", "mitmdump", "sealgate", "sealgate-tunnel", "squid")])
    return groups


def measure(setup: Setup, cell: Cell, seconds: int, round_: int) -> Result:
    lane = setup.lanes[cell.lane]
    pgids = [s.pgid for s in setup.services.started]
    cpu0, busy0, self0 = group_cpu_seconds(pgids), machine_busy_seconds(), self_cpu_seconds()
    try:
        if cell.kind == "http":
            sample = run_wrk(lane.target("http"), cell.concurrency, seconds,
                             setup.prefix(LOAD_CPU))
        else:
            sample = run_hey(lane.target("https"), cell.concurrency, seconds,
                             setup.prefix(LOAD_CPU), keepalive=cell.kind == "https")
    except LoadError as exc:
        return Result(cell, round_, None, failure=str(exc)[:500])
    cpu1, busy1, self1 = group_cpu_seconds(pgids), machine_busy_seconds(), self_cpu_seconds()
    ours = sum(cpu1[p] - cpu0[p] for p in pgids) + sample.loadgen_cpu_s + (self1 - self0)
    proxy_cpu = None
    if lane.service is not None:
        proxy_cpu = cpu1[lane.service.pgid] - cpu0[lane.service.pgid]
    return Result(cell, round_, sample, proxy_cpu, max(0.0, (busy1 - busy0) - ours))


class Progress:
    """One live line on stderr: where we are, how long it has taken, how long it will."""

    def __init__(self, total_cells: int, seconds: int) -> None:
        self.total = total_cells
        self.done = 0
        self.start = time.monotonic()
        self.guess = seconds + 0.6
        self.tty = sys.stderr.isatty()

    def show(self, what: str) -> None:
        elapsed = time.monotonic() - self.start
        per_cell = elapsed / self.done if self.done else self.guess
        total = elapsed + per_cell * (self.total - self.done)
        line = (f"[{self.done + 1:>3}/{self.total}] {what:<46} "
                f"elapsed {_clock(elapsed)} / ~{_clock(total)}")
        if self.tty:
            sys.stderr.write("\r" + line + "\x1b[K")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def note(self, text: str) -> None:
        sys.stderr.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        sys.stderr.flush()


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def warm_up(setup: Setup, groups: list[list[Cell]]) -> None:
    """Each lane once per kind before measuring (leaf certificates, DNS, code paths); and a
    load that fails here stops the run instead of producing numbers for error pages."""
    seen: set[tuple[str, str]] = set()
    for group in groups:
        for cell in group:
            if (cell.kind, cell.lane) in seen:
                continue
            seen.add((cell.kind, cell.lane))
            result = measure(setup, Cell(cell.kind, 8, cell.lane), 1, 0)
            sample = result.sample
            if sample is None or sample.requests == 0 or sample.errors > sample.requests * 0.01:
                service = setup.lanes[cell.lane].service
                detail = result.failure or f"{sample}"
                raise BenchError(f"warm-up {cell.kind} via {cell.lane} failed: {detail}\n"
                                 f"{service.tail() if service else ''}")


def run_rounds(setup: Setup, rounds: int, seconds: int, quick: bool) -> list[Result]:
    groups = plan(quick)
    progress = Progress(rounds * sum(len(g) for g in groups), seconds)
    progress.note(f"warming up {len(setup.lanes)} configurations ...")
    warm_up(setup, groups)
    progress.start = time.monotonic()
    results: list[Result] = []
    for r in range(1, rounds + 1):
        for group in groups:
            # Rotate the order each round so no configuration always follows the same one.
            shift = (r - 1) % len(group)
            for cell in group[shift:] + group[:shift]:
                progress.show(f"round {r}/{rounds}  {cell.kind:<7} c={cell.concurrency:<3} "
                              f"{cell.lane}")
                result = measure(setup, cell, seconds, r)
                if result.failure:
                    progress.note(f"  {cell.kind} c={cell.concurrency} {cell.lane}: FAILED "
                                  f"{result.failure.splitlines()[0]}")
                results.append(result)
                progress.done += 1
        progress.note(f"round {r}/{rounds} done: " + "; ".join(
            f"{g.short} {_fmt_ratio(ratios(results, g.kind, g.concurrency, g.num, g.den, [r]))}"
            for g in TARGETS
        ))
    return results


# -- numbers ----------------------------------------------------------------------------------


def _by(results: list[Result]) -> dict[tuple[int, str, int, str], Result]:
    return {(r.round, r.cell.kind, r.cell.concurrency, r.cell.lane): r for r in results}


def ratios(
    results: list[Result], kind: str, c: int, num: str, den: str, rounds: list[int] | None = None
) -> list[float]:
    """num/den req/s within each round where both were measured."""
    index = _by(results)
    out = []
    for r in rounds or sorted({x.round for x in results}):
        a, b = index.get((r, kind, c, num)), index.get((r, kind, c, den))
        if a and b and a.sample and b.sample and b.sample.rps > 0:
            out.append(a.sample.rps / b.sample.rps)
    return out


def cpu_ratios(results: list[Result], kind: str, c: int, num: str, den: str) -> list[float]:
    """den's proxy CPU per request over num's, within each round: the capacity ratio of two
    single-process proxies, which time slices taken by other work on the machine do not bend."""
    index = _by(results)
    out = []
    for r in sorted({x.round for x in results}):
        a, b = index.get((r, kind, c, num)), index.get((r, kind, c, den))
        costs = [_cpu_per_request(x) for x in (a, b) if x is not None]
        if len(costs) == 2 and costs[0] and costs[1]:
            out.append(costs[1] / costs[0])
    return out


def _cpu_per_request(result: Result) -> float | None:
    if result.sample is None or result.proxy_cpu_s is None or not result.sample.requests:
        return None
    return result.proxy_cpu_s / result.sample.requests


def _x(value: float) -> str:
    return f"{value:.2f}" if value >= 0.095 else f"{value:.2g}"


def _fmt_ratio(values: list[float]) -> str:
    if not values:
        return "n/a"
    median = statistics.median(values)
    if len(values) == 1:
        return f"{_x(median)}x"
    return f"{_x(median)}x ({_x(min(values))}-{_x(max(values))})"


@dataclass
class Row:
    kind: str
    concurrency: int
    lane: str
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_req: float | None
    proxy_util: float | None
    errors: int
    requests: int
    runs: int
    failures: int


def rows(results: list[Result]) -> list[Row]:
    cells: dict[Cell, list[Result]] = {}
    for r in results:
        cells.setdefault(r.cell, []).append(r)
    out = []
    for cell, rs in cells.items():
        ok = [r for r in rs if r.sample is not None]
        samples = [r.sample for r in ok if r.sample is not None]
        cpu = [r.proxy_cpu_s / r.sample.requests for r in ok
               if r.proxy_cpu_s is not None and r.sample is not None and r.sample.requests]
        util = [r.proxy_cpu_s / r.sample.wall_s for r in ok
                if r.proxy_cpu_s is not None and r.sample is not None]
        nan = float("nan")
        out.append(Row(
            cell.kind, cell.concurrency, cell.lane,
            statistics.median(s.rps for s in samples) if samples else nan,
            statistics.median(s.p50_ms for s in samples) if samples else nan,
            statistics.median(s.p99_ms for s in samples) if samples else nan,
            statistics.median(cpu) * 1e6 if cpu else None,
            statistics.median(util) if util else None,
            sum(s.errors for s in samples), sum(s.requests for s in samples),
            len(samples), len(rs) - len(ok),
        ))
    return out


def guard_micro(pin: bool) -> dict[str, float] | str:
    """bench/guard_micro.py's figures (µs per op), run alone on the proxy CPU; or why not."""
    if not (ROOT / "bench" / "guard_micro.py").exists():
        return "bench/guard_micro.py does not exist"
    code = "import json, bench.guard_micro as g; print('GUARD_JSON', json.dumps(g.run()))"
    argv = (["taskset", "-c", PROXY_CPU] if pin else []) + [sys.executable, "-c", code]
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                              check=False)
    except subprocess.TimeoutExpired:
        return "bench/guard_micro.py did not finish within 300 s"
    for line in done.stdout.splitlines():
        if line.startswith("GUARD_JSON "):
            data: dict[str, float] = json.loads(line.removeprefix("GUARD_JSON "))
            return data
    return f"bench/guard_micro.py failed (exit {done.returncode}): {done.stderr[-500:]}"


# -- the report -------------------------------------------------------------------------------


def machine_facts() -> dict[str, str]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.startswith("model name")), "unknown")
    mhz = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                if line.startswith("cpu MHz")), "?")
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), "0")
    from mitmproxy.version import VERSION as mitm_version

    import sealgate

    os_release = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_release = line.split("=", 1)[1].strip('"')
    return {
        "nproc": str(os.cpu_count()),
        "CPU": f"{model}, {float(mhz):.0f} MHz" if mhz != "?" else model,
        "memory": f"{int(mem) / 1024 / 1024:.1f} GiB",
        "kernel / OS": f"Linux {platform.release()} / {os_release}",
        "python": platform.python_version(),
        "mitmproxy": mitm_version,
        "sealgate": f"{sealgate.__version__} ({_git_revision()})",
        "nginx / squid / wrk / hey": " / ".join(
            _deb_version(p) for p in ("nginx-light", "squid", "wrk", "hey")
        ),
    }


def _deb_version(package: str) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                              capture_output=True, text=True, timeout=10, check=False)
        if done.returncode == 0:
            return done.stdout.strip()
    return "?"


def _git_revision() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10, check=False)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10, check=False)
        if head.returncode == 0:
            suffix = " + uncommitted changes" if dirty.stdout.strip() else ""
            return f"git {head.stdout.strip()}{suffix}"
    return "git revision unknown"


LABELS = {
    "direct": "direct (no proxy)",
    "mitmdump": "mitmdump -q (stock, no addon)",
    "sealgate": "sealgate (guard + rule match)",
    "sealgate-w2": "sealgate --workers 2",
    "sealgate-tunnel": "sealgate, tunnelled CONNECT",
    "squid": "squid",
}


def _num(value: float) -> str:
    if value != value:  # NaN
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _ms(value: float) -> str:
    if value != value:
        return "-"
    if value == 0:
        return "<0.1"  # hey reports latency in 0.1 ms steps
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def report(
    results: list[Result], guard: dict[str, float] | str, meta: dict[str, str],
    facts: dict[str, str], chart: Path | None,
) -> str:
    table = rows(results)
    out = [
        "# Proxy overhead: direct, stock mitmdump, sealgate and squid",
        "",
        "Generated by `bench/proxy_overhead.py` (method: `bench/README.md`). Do not edit by hand; "
        "run the command again.",
        "",
        f"* **Command:** `{meta['command']}`",
        f"* **Date:** {meta['date']} ({meta['mode']}: {meta['rounds']} rounds, {meta['seconds']} s "
        f"per measurement, {meta['duration']} in all)",
        "* **Workload:** GET of a 1 KiB static body from nginx on 127.0.0.1. Proxies on CPU 1; "
        "load generator (one thread) and nginx on CPU 0 (`taskset`). sealgate reaches the origin "
        f"as `{ORIGIN_NAME}` through its own resolver (a stub DNS server) and a policy rule "
        "limited to `GET /1k` with `allow_networks: [127.0.0.1/32]`, authenticated with "
        "`Proxy-Authorization: Basic`, audit log on; the others get `127.0.0.1`. Upstream TLS is "
        "verified against the origin's CA by both mitmdump and sealgate.",
        "* **Ratios** are taken within each round (configurations measured seconds apart), then "
        "the median over rounds is shown with the lowest and highest round in brackets. "
        "Absolute req/s on this machine drift by ±30 % over minutes; trust the ratios more.",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in facts.items()],
        "",
        "## Targets",
        "",
        "The verdict is on req/s. The last column is the same comparison from the proxies' CPU "
        "time per request, for two single-process proxies that both saturate CPU 1: it does "
        "not move when other work on the machine takes time slices, so it is the steadier "
        "estimate of capacity.",
        "",
        "| target | needs | req/s ratio (median, range over rounds) | | from CPU per request |",
        "|---|---|---|---|---|",
    ]
    for g in TARGETS:
        values = ratios(results, g.kind, g.concurrency, g.num, g.den)
        verdict = "-" if not values else "**met**" if statistics.median(values) >= g.need \
            else "**not met**"
        cpu = "-"
        if g.den == "mitmdump":
            cpu = _fmt_ratio(cpu_ratios(results, g.kind, g.concurrency, g.num, g.den))
        out.append(f"| {g.label} | ≥ {g.need:g}x | {_fmt_ratio(values)} | {verdict} | {cpu} |")
    if isinstance(guard, dict) and "decision" in guard:
        ok = "**met**" if guard["decision"] < GUARD_TARGET_US else "**not met**"
        out.append(f"| guard decision (bench/guard_micro.py) | < {GUARD_TARGET_US:g} µs | "
                   f"{guard['decision']:.2f} µs | {ok} | - |")
    else:
        out.append(f"| guard decision (bench/guard_micro.py) | < {GUARD_TARGET_US:g} µs | "
                   f"not measured: {guard} | - | - |")
    if chart is not None:
        out += ["", f"![req/s by configuration and target ratios]({chart.name})"]

    for kind, title in KINDS.items():
        out += ["", f"## {title}", ""]
        out += _kind_table(results, [r for r in table if r.kind == kind], kind)
    out += _workers_section(results)
    out += _guard_section(guard)
    out += _noise_section(results)
    return "\n".join(out) + "\n"


def _kind_table(results: list[Result], table: list[Row], kind: str) -> list[str]:
    head = ("| c | configuration | req/s | x direct | x mitmdump | p50 ms | p99 ms "
            "| proxy CPU µs/req | proxy CPU use |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    order = list(LABELS)
    for row in sorted(table, key=lambda r: (r.concurrency, order.index(r.lane))):
        c = row.concurrency
        vs_direct = "-" if row.lane == "direct" else _fmt_ratio(
            ratios(results, kind, c, row.lane, "direct"))
        vs_mitm = "-" if row.lane in ("direct", "mitmdump") else _fmt_ratio(
            ratios(results, kind, c, row.lane, "mitmdump"))
        cpu = f"{row.cpu_us_per_req:,.0f}" if row.cpu_us_per_req is not None else "-"
        util = f"{row.proxy_util:.0%}" if row.proxy_util is not None else "-"
        name = LABELS[row.lane]
        if kind != "http" and row.lane == "squid":
            name = "squid (CONNECT tunnel, no interception)"
        if row.errors or row.failures:
            name += f" ⚠ {row.errors} errors, {row.failures} failed runs"
        lines.append(f"| {c} | {name} | {_num(row.rps)} | {vs_direct} | {vs_mitm} | "
                     f"{_ms(row.p50_ms)} | {_ms(row.p99_ms)} | {cpu} | {util} |")
    if kind == "https":
        lines += ["", "Tunnelled CONNECT against squid's tunnel: " + ", ".join(
            f"c={c} {_fmt_ratio(ratios(results, 'https', c, 'sealgate-tunnel', 'squid'))}"
            for c in (1, 16, 64)) + "."]
    if kind == "https":
        lines += ["", "hey's figures include each connection's first CONNECT and TLS handshakes "
                  "within the measurement; for the intercepting proxies at c=64 that is a visible "
                  "share of a short run."]
    return lines


def _workers_section(results: list[Result]) -> list[str]:
    lines = ["", "## sealgate --workers 2 against one worker", "",
             "Worker 0 runs on CPU 1 like the single worker; worker 1 is moved to CPU 0, which it "
             "shares with the load generator and nginx (the machine has two cores), so this is "
             "a lower bound of what a second core gives.", "",
             "| kind | c | 2 workers / 1 worker |", "|---|---|---|"]
    for kind in ("http", "https"):
        for c in (16, 64):
            lines.append(f"| {kind} | {c} | "
                         f"{_fmt_ratio(ratios(results, kind, c, 'sealgate-w2', 'sealgate'))} |")
    return lines


def _guard_section(guard: dict[str, float] | str) -> list[str]:
    lines = ["", "## Guard micro-benchmark (bench/guard_micro.py, µs per operation)", ""]
    if isinstance(guard, str):
        return [*lines, f"Not measured: {guard}."]
    lines += ["| operation | µs |", "|---|---|"]
    lines += [f"| {name} | {value:.2f} |" for name, value in guard.items()]
    return lines


def _noise_section(results: list[Result]) -> list[str]:
    lines = ["", "## Noise and raw runs", "",
             "CPU time taken by processes this run did not start (other work on the machine), "
             "per round, as a share of one core over the measurement time:", ""]
    per_round: dict[int, list[Result]] = {}
    for r in results:
        per_round.setdefault(r.round, []).append(r)
    for rnd, rs in sorted(per_round.items()):
        wall = sum(r.sample.wall_s for r in rs if r.sample)
        foreign = sum(r.foreign_cpu_s for r in rs)
        worst = max(rs, key=lambda r: r.foreign_cpu_s / r.sample.wall_s if r.sample else 0)
        worst_share = worst.foreign_cpu_s / worst.sample.wall_s if worst.sample else 0.0
        lines.append(f"* round {rnd}: {foreign / wall if wall else 0:.0%} on average, "
                     f"worst {worst_share:.0%} ({worst.cell.kind} c={worst.cell.concurrency} "
                     f"{worst.cell.lane})")
    failures = [r for r in results if r.failure]
    if failures:
        lines += ["", "Failed runs:", ""]
        lines += [f"* round {r.round} {r.cell.kind} c={r.cell.concurrency} {r.cell.lane}: "
                  f"`{r.failure.splitlines()[0] if r.failure else ''}`" for r in failures]
    lines += ["", "<details><summary>req/s of every run, with other work's CPU share during "
              "it</summary>", "",
              "| kind | c | configuration | req/s by round (other work) |", "|---|---|---|---|"]
    cells: dict[Cell, list[str]] = {}
    for r in sorted(results, key=lambda r: r.round):
        cells.setdefault(r.cell, []).append(
            f"{_num(r.sample.rps)} ({r.foreign_cpu_s / r.sample.wall_s:.0%})" if r.sample
            else "failed")
    for cell, values in cells.items():
        lines.append(f"| {cell.kind} | {cell.concurrency} | {cell.lane} | {', '.join(values)} |")
    lines += ["", "</details>"]
    return lines


def draw(results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = rows(results)
    fig, axes = plt.subplots(1, 3, figsize=(17, 6), width_ratios=[1, 1.2, 1.1])
    for ax, kind in zip(axes[:2], ("http", "https"), strict=True):
        kind_rows = [r for r in table if r.kind == kind]
        lanes = [lane for lane in LABELS if any(r.lane == lane for r in kind_rows)]
        levels = sorted({r.concurrency for r in kind_rows})
        width = 0.8 / len(lanes)
        for i, lane in enumerate(lanes):
            values = [next((r.rps for r in kind_rows
                            if r.lane == lane and r.concurrency == c), 0.0) for c in levels]
            ax.bar([x + i * width for x in range(len(levels))], values, width,
                   label=LABELS[lane])
        ax.set_xticks([x + width * (len(lanes) - 1) / 2 for x in range(len(levels))],
                      [f"c={c}" for c in levels])
        ax.set_yscale("log")
        ax.set_ylabel("requests/s (log scale, median over rounds)")
        ax.set_title(KINDS[kind], fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)
    ax = axes[2]
    for y, g in enumerate(TARGETS):
        values, need = ratios(results, g.kind, g.concurrency, g.num, g.den), g.need
        if not values:
            continue
        median = statistics.median(values)
        ax.barh(y, median, color="tab:green" if median >= need else "tab:red", alpha=0.75)
        ax.plot([min(values), max(values)], [y, y], color="dimgray", linewidth=2)
        ax.plot([need, need], [y - 0.42, y + 0.42], color="black", linestyle="--")
        ax.annotate(f"{median:.2f}x (needs {need:g}x)", (max(median, need), y),
                    xytext=(6, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(range(len(TARGETS)), [g.label.replace(", ", "\n", 1) for g in TARGETS],
                  fontsize=7)
    ax.set_xlim(0, max(g.need for g in TARGETS) * 1.6)
    ax.invert_yaxis()
    ax.set_xlabel("req/s ratio; grey: range over rounds; dashed: target")
    ax.set_title("targets (green met, red not met)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def console_summary(results: list[Result]) -> str:
    lines = [f"{'kind':<8}{'c':>4}  {'configuration':<32}{'req/s':>10}{'x direct':>10}"
             f"{'x mitmdump':>12}{'p50 ms':>9}{'p99 ms':>9}"]
    order = list(LABELS)
    for row in sorted(rows(results),
                      key=lambda r: (list(KINDS).index(r.kind), r.concurrency,
                                     order.index(r.lane))):
        d = ratios(results, row.kind, row.concurrency, row.lane, "direct")
        m = ratios(results, row.kind, row.concurrency, row.lane, "mitmdump")
        lines.append(
            f"{row.kind:<8}{row.concurrency:>4}  {row.lane:<32}{_num(row.rps):>10}"
            f"{(f'{statistics.median(d):.3f}' if d and row.lane != 'direct' else '-'):>10}"
            f"{(f'{statistics.median(m):.2f}' if m and row.lane != 'mitmdump' else '-'):>12}"
            f"{_ms(row.p50_ms):>9}{_ms(row.p99_ms):>9}"
        )
    lines.append("")
    for g in TARGETS:
        values = ratios(results, g.kind, g.concurrency, g.num, g.den)
        met = "met" if values and statistics.median(values) >= g.need else "NOT met"
        cpu = ""
        if g.den == "mitmdump":
            cpu_values = cpu_ratios(results, g.kind, g.concurrency, g.num, g.den)
            cpu = f"; from CPU per request {_fmt_ratio(cpu_values)}"
        lines.append(f"target {g.label}: {_fmt_ratio(values)} (needs >= {g.need:g}x) {met}{cpu}")
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------------


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _pinned_self(pin: bool) -> Iterator[None]:
    """The orchestrator (and the stub DNS thread) stay off the proxy CPU while measuring."""
    before = os.sched_getaffinity(0)
    if pin:
        os.sched_setaffinity(0, {int(LOAD_CPU)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 s (about 2 minutes)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3, quick 2)")
    parser.add_argument("--seconds", type=int, help="seconds per measurement (default 3, quick 1)")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs",
                        help="where performance.md and performance.png go (default docs/)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 3)
    seconds = args.seconds or (1 if args.quick else 3)
    if rounds < 1 or seconds < 1:
        parser.error("--rounds and --seconds must be at least 1")

    try:
        paths = tools()
    except BenchError as exc:
        print(f"proxy_overhead: {exc}", file=sys.stderr)
        return 2
    pin = (os.cpu_count() or 1) >= 2
    if not pin:
        print("proxy_overhead: fewer than 2 CPUs, running unpinned (numbers will mix proxy and "
              "load generator)", file=sys.stderr)
    # Also SIGINT: a shell starts background jobs with it ignored, and Ctrl-C must still stop us.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="sealgate-bench-"))
    setup = Setup(work, pin)
    keep_logs = True
    try:
        print("guard micro-benchmark ...", file=sys.stderr)
        guard = guard_micro(pin)
        with _pinned_self(pin):
            print(f"starting nginx, stub DNS, mitmdump, sealgate (1 and 2 workers), squid in "
                  f"{work} ...", file=sys.stderr)
            start_all(setup, paths)
            results = run_rounds(setup, rounds, seconds, args.quick)
        keep_logs = False
    except KeyboardInterrupt:
        keep_logs = False
        print("\nproxy_overhead: interrupted; stopping everything", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"\nproxy_overhead: {exc}", file=sys.stderr)
        return 1
    finally:
        # A second Ctrl-C must not cut the clean-up short and leave proxies running.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        setup.services.stop_all()
        if setup.dns is not None:
            setup.dns.stop()
        if keep_logs:
            print(f"proxy_overhead: logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)

    duration = time.monotonic() - started
    executable = Path(sys.executable)
    with contextlib.suppress(ValueError):
        executable = executable.relative_to(ROOT)
    script = Path(__file__).resolve().relative_to(ROOT)
    meta = {
        "command": shlex.join([str(executable), str(script), *(argv or sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": "custom" if args.rounds or args.seconds else "quick" if args.quick else "full",
        "rounds": str(rounds),
        "seconds": str(seconds),
        "duration": f"{duration / 60:.1f} min",
    }
    args.docs.mkdir(parents=True, exist_ok=True)
    chart = args.docs / "performance.png"
    draw(results, chart)
    document = args.docs / "performance.md"
    document.write_text(report(results, guard, meta, machine_facts(), chart))
    print(console_summary(results))
    if isinstance(guard, dict) and "decision" in guard:
        print(f"guard decision: {guard['decision']:.2f} µs (needs < {GUARD_TARGET_US:g} µs)")
    print(f"wrote {document} and {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
