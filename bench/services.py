"""The processes a benchmark measures: nginx origin, stub DNS, mitmdump, sealgate and squid.

Each starts in its own process group on 127.0.0.1 and a free port, its output in a log file
in the run's work directory; `Services.stop_all` ends every group that was started. Proxies go
on `PROXY_CPU`, the origin and load generator on `LOAD_CPU` (`taskset`), when the machine has
two CPUs to pin to. The stand-ins (CA, stub DNS) are bench/fakes.py.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fakes import OriginCA, StubDNS, free_port
from loadgen import Target

ROOT = Path(__file__).resolve().parent.parent
ORIGIN_NAME = "origin.bench"  # sealgate resolves it through the stub DNS server
BODY_PATH = "/1k"
BODY = b"x" * 1024
PROXY_CPU, LOAD_CPU = "1", "0"
START_TIMEOUT = 60.0

# tool -> Debian package; mitmdump and sealgate come from the venv instead
DEBIAN_TOOLS = {"wrk": "wrk", "hey": "hey", "nginx": "nginx-light", "squid": "squid",
                "taskset": "util-linux"}
VENV_TOOLS = ("mitmdump", "sealgate")

# A policy's tail that lets the origin on loopback through and never runs out of budget.
OPEN_POLICY_TAIL = """
    allow_networks: [127.0.0.1/32]
    budgets:
      requests_per_second: 1000000
      burst: 1000000
      max_connections: 100000
      max_total_bytes: 1000000000000000"""


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
        self, name: str, argv: list[str], port: int, log: Path, listeners: int = 1,
        env: Mapping[str, str] | None = None,
    ) -> Service:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
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


# -- lanes and the set-up ---------------------------------------------------------------------


@dataclass
class Lane:
    """One configuration a client talks to: direct or through one proxy."""

    name: str
    label: str
    http_url: str | None
    https_url: str | None
    service: Service | None = None
    credentials: tuple[str, str] | None = None
    headers: tuple[str, ...] = ()  # sent on every request to the origin
    # False: the client talks to `service` as to a server (base-URL mode), not as to a proxy;
    # `service` is still the process whose CPU is counted.
    proxied: bool = True

    def target(self, kind: str) -> Target:
        url = self.http_url if kind == "http" else self.https_url
        assert url is not None
        proxy = None
        if self.service is not None and self.proxied:
            proxy = ("127.0.0.1", self.service.port)
        return Target(url, proxy, self.credentials, self.headers)


@dataclass
class Setup:
    work: Path
    pin: bool
    services: Services = field(default_factory=Services)
    lanes: dict[str, Lane] = field(default_factory=dict)
    dns: StubDNS | None = None

    def prefix(self, cpu: str) -> list[str]:
        return ["taskset", "-c", cpu] if self.pin else []

    def orchestrator_pinned(self) -> contextlib.AbstractContextManager[None]:
        """This thread, and the stub DNS thread it starts, off the proxy CPU while measuring."""
        return pinned(int(LOAD_CPU) if self.pin else None)


@dataclass(frozen=True)
class Build:
    """How to start one commit's sealgate: its command and what its environment adds."""

    label: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Origin:
    """The running nginx: one body over plain HTTP and over HTTPS, signed by `ca`."""

    ca: OriginCA
    http_port: int
    https_port: int

    def url(self, scheme: str, host: str = "127.0.0.1") -> str:
        port = self.http_port if scheme == "http" else self.https_port
        return f"{scheme}://{host}:{port}{BODY_PATH}"


def tools(*wanted: str) -> dict[str, str]:
    """Paths of the external programs `wanted`, or a BenchError naming the Debian packages to
    install."""
    venv_bin = Path(sys.executable).parent
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    found: dict[str, str] = {}
    missing: list[str] = []
    for tool in wanted:
        if tool in VENV_TOOLS:
            path = shutil.which(tool, path=str(venv_bin))
            if path is None:
                raise BenchError(f"{tool} not found next to {sys.executable}; "
                                 "run `make` set-up first")
        elif tool in DEBIAN_TOOLS:
            path = shutil.which(tool, path=search)
            if path is None:
                missing.append(DEBIAN_TOOLS[tool])
                continue
        else:
            raise BenchError(f"{tool}: not a tool this benchmark knows how to find")
        found[tool] = path
    if missing:
        raise BenchError(
            "missing tools; install the Debian packages with\n"
            f"    apt-get install -y {' '.join(missing)}\n"
            f"or: bash scripts/debian-deps.sh {' '.join(missing)}"
        )
    return found


def can_pin(script: str) -> bool:
    """Whether there are two CPUs to keep proxies and load generator apart; says so if not."""
    if (os.cpu_count() or 1) >= 2:
        return True
    print(f"{script}: fewer than 2 CPUs, running unpinned (numbers will mix proxy and "
          "load generator)", file=sys.stderr)
    return False


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    """Pin the calling thread (Linux affinity is per thread; threads it starts inherit it) to
    `cpu`, None leaving it where it is; the old affinity comes back afterwards."""
    before = os.sched_getaffinity(0)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# -- starting each service --------------------------------------------------------------------


def start_origin(setup: Setup, paths: Mapping[str, str], *names: str) -> Origin:
    """nginx on the load CPU, its certificate for `names` and 127.0.0.1."""
    work = setup.work / "nginx"
    ca = OriginCA(setup.work)
    cert, key = ca.issue(*names, "127.0.0.1")
    origin = Origin(ca, free_port(), free_port())
    work.mkdir()
    conf = work / "nginx.conf"
    conf.write_text(_nginx_conf(work, origin.http_port, origin.https_port, cert, key))
    setup.services.start(
        "nginx",
        [*setup.prefix(LOAD_CPU), paths["nginx"], "-e", str(work / "error.log"),
         "-p", str(work), "-c", str(conf)],
        origin.https_port, work / "stdout.log",
    )
    return origin


def start_dns(setup: Setup, *names: str) -> str:
    """The stub DNS server in this process, answering `names` with 127.0.0.1; its host:port."""
    setup.dns = StubDNS().start()
    for name in names:
        setup.dns.set(name, "A 127.0.0.1")
    host, port = setup.dns.address
    return f"{host}:{port}"


def start_mitmdump(
    setup: Setup, paths: Mapping[str, str], name: str, origin: Origin, *extra: str
) -> Service:
    """Stock mitmdump on the proxy CPU, verifying upstream TLS against the origin's CA."""
    port = free_port()
    return setup.services.start(
        name,
        [*setup.prefix(PROXY_CPU), paths["mitmdump"], "-q", "--listen-host", "127.0.0.1",
         "-p", str(port), "--set", f"confdir={setup.work / name}",
         "--set", f"ssl_verify_upstream_trusted_ca={origin.ca.path}", *extra],
        port, setup.work / f"{name}.log",
    )


def start_sealgate(
    setup: Setup, paths: Mapping[str, str], name: str, rules: Path, resolver: str,
    origin: Origin, *extra: str, workers: int = 1, build: Build | None = None,
) -> Service:
    """`sealgate proxy` on the proxy CPU, its state (audit log included) in work/`name`; of
    `build` (another commit's, bench/ab.py) or else this checkout's."""
    port = free_port()
    command = build.command if build is not None else [paths["sealgate"]]
    argv = [*setup.prefix(PROXY_CPU), *command, "proxy",
            "--listen", f"127.0.0.1:{port}", "--rules", str(rules),
            "--state", str(setup.work / name), "--resolver", resolver,
            "--upstream-ca", str(origin.ca.path), *extra]
    if workers > 1:
        argv += ["--workers", str(workers)]
    service = setup.services.start(name, argv, port, setup.work / f"{name}.log",
                                   listeners=workers, env=build.env if build else None)
    if workers > 1 and setup.pin:
        _spread_workers(service)
    return service


def start_squid(setup: Setup, paths: Mapping[str, str]) -> Service:
    """squid on the proxy CPU: no cache, no access log; HTTPS through it is a CONNECT tunnel."""
    port = free_port()
    squid_dir = setup.work / "squid"
    squid_dir.mkdir()
    _let_squid_write(setup.work, squid_dir)
    (squid_dir / "squid.conf").write_text(_squid_conf(squid_dir, port))
    return setup.services.start(
        "squid",
        [*setup.prefix(PROXY_CPU), paths["squid"], "-N", "-f", str(squid_dir / "squid.conf")],
        port, squid_dir / "stdout.log",
    )


def origin_policy(origin: Origin, tunnel: str, inject: str = "") -> str:
    """A policy's lines up to `allow` (for `rules_yaml`): the origin by name, GET of the body
    only (so HTTPS to it is intercepted), with `inject` (a rule's inject list) if given; and
    `tunnel`, the same origin under another name, without method or path limits (so its TLS
    passes through undecrypted)."""
    inject_line = f"\n        inject: [{inject}]" if inject else ""
    return f"""
    mode: enforce
    allow:
      - host: {ORIGIN_NAME}
        ports: [{origin.http_port}, {origin.https_port}]
        methods: [GET]
        paths: ["{BODY_PATH}"]{inject_line}
      - host: {tunnel}
        ports: [{origin.https_port}]"""


def rules_yaml(policies: Mapping[str, str], sandboxes: Mapping[str, tuple[str, str]]) -> str:
    """A rules file: each policy (name -> its lines up to and including `allow`) gets
    `OPEN_POLICY_TAIL`; each sandbox (id -> (policy, key)) the digest of its key."""
    body = "".join(f"\n  {name}:{head}{OPEN_POLICY_TAIL}" for name, head in policies.items())
    entries = "".join(
        f"\n  {sandbox}: {{policy: {policy}, "
        f"key_sha256: \"{hashlib.sha256(key.encode()).hexdigest()}\"}}"
        for sandbox, (policy, key) in sandboxes.items()
    )
    return f"version: 1\npolicies:{body}\nsandboxes:{entries}\ndefault_policy: null\n"


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


def probe(lane: Lane) -> None:
    """One request through the proxy before measuring: a 403 or 407 measured fast is no result.
    A lane that is not proxied (base-URL mode) is asked for its https URL, as its load is."""
    assert lane.service is not None
    url = lane.http_url if lane.proxied else lane.https_url
    assert url is not None
    authority = url.split("/")[2]
    headers = {"Host": authority}
    if lane.credentials is not None:
        token = base64.b64encode(":".join(lane.credentials).encode()).decode()
        headers["Proxy-Authorization"] = f"Basic {token}"
    for line in lane.headers:
        name, _, value = line.partition(":")
        headers[name.strip()] = value.strip()
    target = url if lane.proxied else "/" + url.split("/", 3)[3]
    conn = http.client.HTTPConnection("127.0.0.1", lane.service.port, timeout=20)
    try:
        conn.request("GET", target, headers=headers)
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status != 200 or body != BODY:
        raise BenchError(f"{lane.name}: probe got {response.status} "
                         f"{body[:300]!r}\n{lane.service.tail()}")


def micro_figures(argv: list[str], what: str, timeout: float) -> dict[str, float] | str:
    """The figures a micro-benchmark prints as a JSON object on its last line of stdout; or
    why there are none."""
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return f"{what} did not finish within {timeout:.0f} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return f"{what} failed (exit {done.returncode}): {done.stderr[-500:]}"
    figures: dict[str, float] = json.loads(lines[-1])
    return figures


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
