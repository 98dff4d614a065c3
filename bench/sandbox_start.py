"""Sandbox start-up and life cycle: `sealgate sandboxd`'s warm pool against bare fork/exec, bare
bubblewrap and the one-shot `sealgate sandbox run`, all with `/bin/true`, in one run.

Writes docs/performance-sandbox.md and docs/performance-sandbox.png (`--docs DIR` elsewhere);
`--json` prints every figure as one JSON object on stdout instead of the table.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fakes import free_port
from report import figure, finish, machine_facts, memory_tables, run_meta, save
from rounds import percentile
from services import ROOT, BenchError, Service, Setup, rules_yaml
from session import bench_session

from sealgate.sandbox.clients.client import Client, DaemonError, Sandbox

SCRIPT = "sandbox_start"
# A range, gateway and uid base of the benchmark's own: tests use 10.216/16 and 3100000.
RANGE, GATEWAY = "10.217.0.0/16", "10.217.255.254"
UID_BASE = 3_200_000
SANDBOX = "bench-bot"
COMMAND = ["/bin/true"]
POOL = 8
MAX_SANDBOXES = 256
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
READY_TIMEOUT = 120.0
STOP_TIMEOUT = 180.0  # SIGTERM deletes every sandbox the daemon holds, one after another
# What the seed measured for CodeRabbit's sandboxes (issue #11): the bar to beat.
SEED_START_MS, SEED_COMMAND_MS = 700.0, 250.0
MiB = 1 << 20


@dataclass(frozen=True)
class Plan:
    """How many samples of each kind; the full run's and `--quick`'s."""

    bare: int  # fork/exec and subprocess.run
    bwrap: int
    oneshot: int
    cold: int
    warm: int
    later: int  # later execs per warm sandbox
    api: int
    seconds: int  # sustained cycles, one client
    clients: int  # ... then this many clients at once
    clients_seconds: int
    concurrent: int  # sandboxes alive at once
    profile: int  # cycles of the instrumented daemon


FULL = Plan(bare=300, bwrap=100, oneshot=5, cold=40, warm=100, later=4, api=200, seconds=60,
            clients=4, clients_seconds=20, concurrent=200, profile=20)
QUICK = Plan(bare=100, bwrap=30, oneshot=3, cold=10, warm=20, later=3, api=50, seconds=5,
             clients=4, clients_seconds=3, concurrent=50, profile=5)


# -- figures --------------------------------------------------------------------------------


@dataclass
class Figures:
    """Everything measured: samples in ms by name, and single values."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[float]] = field(default_factory=dict)  # cycles per second, by second
    notes: list[str] = field(default_factory=list)
    profile: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, ms: float) -> None:
        self.samples.setdefault(name, []).append(ms)

    def p50(self, name: str) -> float:
        return percentile(self.samples.get(name, []), 50)

    def p95(self, name: str) -> float:
        return percentile(self.samples.get(name, []), 95)

    def summary(self) -> dict[str, Any]:
        return {
            "latency_ms": {name: {"n": len(v), "p50": round(percentile(v, 50), 3),
                                  "p95": round(percentile(v, 95), 3), "min": round(min(v), 3),
                                  "max": round(max(v), 3)}
                           for name, v in self.samples.items() if v},
            "values": {k: round(v, 3) for k, v in self.values.items()},
            "cycles_per_second_by_second": self.series,
            "profile_ms": {name: {"n": len(v), "p50": round(percentile(v, 50), 3),
                                  "mean": round(statistics.fmean(v), 3)}
                           for name, v in self.profile.items() if v},
            "notes": self.notes,
        }


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1000, out


class Progress:
    """One live line on stderr: the phase, the step within it, elapsed and estimated time."""

    def __init__(self, estimates: dict[str, float]) -> None:
        self.estimates = estimates  # phase -> seconds it is expected to take
        self.start = time.monotonic()
        self.phase = ""
        self.phase_start = self.start
        self.done_s = 0.0
        self.tty = sys.stderr.isatty()
        self._last = 0.0

    def begin(self, phase: str) -> None:
        if self.phase:
            self.done_s += self.estimates.get(self.phase, 0.0)
        self.phase, self.phase_start = phase, time.monotonic()
        self.show("")

    def show(self, what: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and self.tty and now - self._last < 0.2:
            return
        if not self.tty and not force and what:
            return  # a log file gets one line per phase, not a line per sample
        self._last = now
        left = sum(s for p, s in self.estimates.items()
                   if list(self.estimates).index(p) > list(self.estimates).index(self.phase)) \
            if self.phase in self.estimates else 0.0
        here = max(self.estimates.get(self.phase, 0.0), now - self.phase_start)
        total = (self.phase_start - self.start) + here + left
        index = list(self.estimates).index(self.phase) + 1 if self.phase in self.estimates else 0
        line = (f"[{index}/{len(self.estimates)}] {self.phase:<26} {what:<34} "
                f"elapsed {_clock(now - self.start)} / ~{_clock(total)}")
        sys.stderr.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        sys.stderr.flush()

    def note(self, text: str) -> None:
        sys.stderr.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        sys.stderr.flush()


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


# -- memory ---------------------------------------------------------------------------------


def rollup(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of a process in bytes; (0, 0) once it is gone."""
    pss = rss = 0
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == "Pss":
            pss = int(rest.split()[0]) * 1024
        elif name == "Rss":
            rss = int(rest.split()[0]) * 1024
    return pss, rss


def _meminfo() -> dict[str, int]:
    return {line.split(":")[0]: int(line.split()[1]) * 1024
            for line in Path("/proc/meminfo").read_text().splitlines()}


def host_used() -> int:
    """MemTotal - MemAvailable, bytes: what the whole machine holds, kernel objects included."""
    info = _meminfo()
    return info["MemTotal"] - info["MemAvailable"]


def unreclaimable_slab() -> int:
    """The kernel's unreclaimable slab, bytes: where namespaces, links and tables live."""
    return _meminfo()["SUnreclaim"]


def sandbox_groups(index: int, daemon_pid: int) -> list[Path]:
    """The cgroup directories of the daemon's slot `index` (v2 or the v1 hierarchies)."""
    name = f"run-{index}-{daemon_pid}"
    return [Path(p) for p in (f"/sys/fs/cgroup/sealgate/{name}",
                              *glob.glob(f"/sys/fs/cgroup/*/sealgate/{name}")) if Path(p).is_dir()]


def sandbox_memory(uid: int, daemon_pid: int, uid_base: int = UID_BASE
                   ) -> tuple[int, int, int, int]:
    """(PSS, RSS, cgroup memory use, processes) of one sandbox: the processes in its groups
    (bubblewrap outside and as the namespace's init, the agent), and its memory group's use
    (page cache and, on v1 with kmem accounting, kernel memory it was charged)."""
    groups = sandbox_groups(uid - uid_base, daemon_pid)
    pids: set[int] = set()
    usage = 0
    for group in groups:
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (group / "cgroup.procs").read_text().split())
        for file in ("memory.current", "memory.usage_in_bytes"):
            with contextlib.suppress(OSError):
                usage = max(usage, int((group / file).read_text()))
    pss = rss = 0
    for pid in pids:
        p, r = rollup(pid)
        pss, rss = pss + p, rss + r
    return pss, rss, usage, len(pids)


# -- the processes --------------------------------------------------------------------------


# The caller's PYTHONPATH passes, so a run can measure a checkout other than the venv's; and
# how the microVM tier runs its guest (emulation where KVM cannot run it) and where its image is.
PASSED = ("PYTHONPATH", "SEALGATE_MICROVM_ACCEL", "SEALGATE_MICROVM_DIR")


def sealgate_env() -> dict[str, str]:
    return {"PATH": HOST_PATH, **{k: os.environ[k] for k in PASSED if k in os.environ}}


def sealgate_cmd(paths: dict[str, str], *args: str, timeout: float = 120
                 ) -> subprocess.CompletedProcess[str]:
    env = sealgate_env()
    return subprocess.run([paths["sealgate"], *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


@dataclass
class Proxy:
    service: Service
    port: int
    transparent_port: int
    state: Path


def start_proxy(setup: Setup, paths: dict[str, str], gateway: str = GATEWAY) -> Proxy:
    """`sealgate proxy` on the gateway, knowing the benchmark's sandbox id. No request of the
    benchmark goes through it: the daemon needs it to register each sandbox's address."""
    rules = setup.work / "rules.yaml"
    policy = """
    mode: enforce
    allow:
      - host: example.invalid
        ports: [443]"""
    rules.write_text(rules_yaml({"bench": policy},
                                {SANDBOX: ("bench", secrets.token_urlsafe(18))}))
    port, transparent = free_port(), free_port()
    state = setup.work / "proxy"
    log = setup.work / "proxy.log"
    argv = [paths["sealgate"], "proxy", "--listen", f"{gateway}:{port}",
            "--transparent", f"{gateway}:{transparent}", "--rules", str(rules),
            "--state", str(state)]
    service = setup.services.start("proxy", argv, port, log, listeners=0)
    deadline = time.monotonic() + READY_TIMEOUT
    while "sealgate proxy ready" not in service.tail(1 << 20):
        if service.proc.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"the proxy did not start:\n{service.tail()}")
        time.sleep(0.05)
    return Proxy(service, port, transparent, state)


@dataclass
class Daemon:
    service: Service
    socket: Path
    pool: int

    @property
    def client(self) -> Client:
        return Client(str(self.socket), timeout=120)

    @property
    def pid(self) -> int:
        return self.service.proc.pid

    def health(self) -> dict[str, Any]:
        return self.client.health()

    def settle(self, timeout: float = 60.0) -> None:
        """Until the pool is full again and nothing is being prepared or taken down."""
        deadline = time.monotonic() + timeout
        while True:
            if self.service.proc.poll() is not None:
                raise BenchError(f"sandboxd exited {self.service.proc.returncode}:\n"
                                 f"{self.service.tail()}")
            with contextlib.suppress(DaemonError):
                h = self.health()
                if h.get("ready") and h.get("pool", 0) >= self.pool and not h.get("preparing") \
                        and not h.get("releasing"):
                    return
            if time.monotonic() > deadline:
                raise BenchError(f"sandboxd's pool did not fill within {timeout:.0f} s: "
                                 f"{self.service.tail()}")
            time.sleep(0.01)

    def create(self) -> Sandbox:
        return Sandbox.create(SANDBOX, daemon=str(self.socket))

    def stop(self, setup: Setup) -> None:
        """SIGTERM to the daemon alone (it deletes its sandboxes), then its process group."""
        proc = self.service.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.service.pgid, signal.SIGKILL)  # anything it left in its group
        with contextlib.suppress(ValueError):
            setup.services.started.remove(self.service)

    def warm_flags(self) -> dict[str, bool]:
        """Sandbox id -> whether its create took a prepared slot (the daemon's own log)."""
        flags: dict[str, bool] = {}
        for line in self.service.tail(1 << 26).splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == "created":
                    flags[str(event["id"])] = bool(event.get("warm"))
        return flags


# Runs `sealgate sandboxd` with timers around the steps of a slot's preparation, a create and a
# delete (JSON lines to the file in argv[1]): where the time goes, without touching the code.
_PROFILER = '''
import functools, json, sys, threading, time
from sealgate.sandbox.daemon import daemon, slot
from sealgate.sandbox.host import firewall, lease, network, rootfs, scratch, seccomp
from sealgate.sandbox.host.cgroup import Group

out = open(sys.argv[1], "a", buffering=1)
lock = threading.Lock()

def log(name, start):
    with lock:
        out.write(json.dumps({"f": name, "ms": (time.perf_counter() - start) * 1000}) + "\\n")

def wrap(owner, attr, name, kind="plain"):
    fn = getattr(owner, attr)
    fn = fn.__func__ if kind == "class" else fn
    if kind == "async":
        async def timer(*a, **k):
            start = time.perf_counter()
            try:
                return await fn(*a, **k)
            finally:
                log(name, start)
    else:
        def timer(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                log(name, start)
    functools.update_wrapper(timer, fn)
    setattr(owner, attr, classmethod(timer) if kind == "class" else timer)

wrap(daemon.Daemon, "_prepare", "prepare: all, agent hello included", "async")
wrap(slot, "prepare", "prepare: slot.prepare (thread)")
wrap(slot, "take_link", "prepare: take_link (lock, link, table)")
wrap(lease, "stale", "prepare: lease.stale (scan under lock)")
wrap(network, "build", "prepare: netns + veth (ip x11, sysctl x2)")
wrap(firewall, "load", "prepare: nft table load")
wrap(firewall, "exists", "prepare: nft gateway table check")
wrap(Group, "create", "prepare: cgroups", "class")
wrap(scratch, "create", "prepare: scratch tmpfs")
wrap(rootfs, "mount", "prepare: an image's root (idmapped layers, overlay)")
wrap(rootfs, "lay_over", "prepare: an image's root laid over")
wrap(seccomp, "program", "prepare: seccomp program")
wrap(slot, "trust", "prepare: CA bundle")
wrap(daemon.Daemon, "create", "create: all (in the daemon)", "async")
wrap(daemon.Daemon, "_register", "create: register with the proxy")
wrap(Group, "apply", "cgroups: limits set (at create, and in each prepare)")
wrap(daemon.Daemon, "delete", "delete: all (in the daemon)", "async")
wrap(slot, "release", "delete: slot.release (thread)")
wrap(Group, "remove", "delete: cgroups (kill, rmdir)")
wrap(scratch, "remove", "delete: scratch tmpfs")
wrap(slot, "unregister", "delete: unregister with the proxy")
wrap(slot, "remove_link", "delete: netns, veth, table")
wrap(network, "destroy", "delete: ip link del + netns del")
wrap(firewall, "remove", "delete: nft table delete")

from sealgate.cli import main
sys.argv = ["sealgate", *sys.argv[2:]]
sys.exit(main())
'''


def tear_down(setup: Setup, paths: dict[str, str], daemons: Sequence[Daemon],
              *nets: tuple[str, str]) -> None:
    """A run's end, whatever ended it: its daemons, its services and the gateway of each of
    its ranges (range, gateway), with no second Ctrl-C able to cut it short (none may be left
    behind)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    for daemon in daemons:
        daemon.stop(setup)
    setup.services.stop_all()
    for network, gateway in nets:
        sealgate_cmd(paths, "sandbox", "teardown", "--range", network, "--gateway", gateway)


def start_daemon(setup: Setup, paths: dict[str, str], proxy: Proxy, name: str, pool: int,
                 profile: Path | None = None, isolation: str = "bwrap", *,
                 net: tuple[str, str, int] = (RANGE, GATEWAY, UID_BASE),
                 extra: Sequence[str] = ()) -> Daemon:
    """`net` is (range, gateway, uid base); `extra`, more of sandboxd's flags (image pools)."""
    where = setup.work / name
    where.mkdir()
    sock = where / "sandboxd.sock"
    args = ["sandboxd", "--range", net[0], "--gateway", net[1], "--state", str(proxy.state),
            "--socket", str(sock), "--proxy-port", str(proxy.port),
            "--transparent-port", str(proxy.transparent_port), "--uid-base", str(net[2]),
            "--pool", str(pool), "--max-sandboxes", str(MAX_SANDBOXES), "--isolation", isolation,
            *extra]
    if profile is None:
        argv = [paths["sealgate"], *args]
    else:
        script = setup.work / "profiled_sandboxd.py"
        script.write_text(_PROFILER)
        argv = [sys.executable, str(script), str(profile), *args]
    service = setup.services.start(name, argv, 0, where / "sandboxd.log", listeners=0)
    daemon = Daemon(service, sock, pool)
    deadline = time.monotonic() + READY_TIMEOUT
    while not sock.exists():
        if service.proc.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"{name} did not start:\n{service.tail()}")
        time.sleep(0.02)
    daemon.settle(READY_TIMEOUT)
    return daemon


# -- the phases -----------------------------------------------------------------------------


def baselines(fig: Figures, plan: Plan, paths: dict[str, str], progress: Progress) -> None:
    """/bin/true by posix_spawn + waitpid and by subprocess.run, interleaved; bubblewrap."""
    progress.begin("bare fork/exec")
    env = {"PATH": HOST_PATH}
    for i in range(plan.bare):
        ms, _ = timed(lambda: spawn_wait(env))
        fig.add("fork/exec: posix_spawn + waitpid", ms)
        ms, done = timed(lambda: subprocess.run(COMMAND, env=env, check=False))
        if done.returncode != 0:
            raise BenchError("/bin/true failed")
        fig.add("fork/exec: subprocess.run", ms)
        progress.show(f"{i + 1}/{plan.bare}")
    progress.begin("bare bubblewrap")
    links: list[str] = []
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(path):
            links += ["--symlink", os.readlink(path), path]
    minimal = [paths["bwrap"], "--ro-bind", "/usr", "/usr", *links, "--", *COMMAND]
    # What the sandbox's bubblewrap itself does, less the network namespace (the sandbox's is
    # made ahead), setpriv, the cgroup join and seccomp.
    like = [paths["bwrap"], "--unshare-all", "--share-net", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr",
            "--ro-bind", "/etc", "/etc", *links, "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp", "--tmpfs", "/run", "--tmpfs", "/home", "--", *COMMAND]
    for i in range(plan.bwrap):
        for name, argv in (("bwrap: binds only", minimal), ("bwrap: the sandbox's namespaces",
                                                            like)):
            ms, done = timed(functools.partial(subprocess.run, argv, env=env,
                                               capture_output=True, check=False))
            if done.returncode != 0:
                raise BenchError(f"{' '.join(argv)}: {done.stderr.decode(errors='replace')}")
            fig.add(name, ms)
        progress.show(f"{i + 1}/{plan.bwrap}")


def spawn_wait(env: dict[str, str]) -> int:
    pid = os.posix_spawn(COMMAND[0], COMMAND, env)
    os.waitpid(pid, 0)
    return pid


def one_shot(fig: Figures, plan: Plan, paths: dict[str, str], proxy: Proxy,
             progress: Progress) -> None:
    """`sealgate sandbox run -- /bin/true`, and the CLI's own start for comparison."""
    progress.begin("one-shot sandbox run")
    for i in range(plan.oneshot):
        ms, done = timed(lambda: sealgate_cmd(paths, "--version"))
        fig.add("sealgate --version (CLI start)", ms)
        ms, done = timed(lambda: sealgate_cmd(
            paths, "sandbox", "run", "--sandbox", SANDBOX, "--state", str(proxy.state),
            "--proxy-port", str(proxy.port), "--transparent-port", str(proxy.transparent_port),
            "--range", RANGE, "--gateway", GATEWAY, "--", *COMMAND))
        if done.returncode != 0:
            raise BenchError(f"sealgate sandbox run failed ({done.returncode}): {done.stderr}")
        fig.add("sealgate sandbox run -- /bin/true", ms)
        progress.show(f"{i + 1}/{plan.oneshot}", force=True)


def run_true(sb: Sandbox) -> tuple[float, float]:
    """(client ms, daemon-side ms) of one /bin/true in the sandbox."""
    ms, result = timed(lambda: sb.run(COMMAND, timeout=60))
    if result.exit_code != 0:
        raise BenchError(f"/bin/true in {sb.id}: {result}")
    return ms, result.duration_ms


def cold(fig: Figures, plan: Plan, daemon: Daemon, progress: Progress) -> None:
    """--pool 0: every create prepares its slot there and then."""
    progress.begin("cold create (--pool 0)")
    for i in range(plan.cold):
        ms, sb = timed(daemon.create)
        fig.add("create, cold (--pool 0)", ms)
        fig.add("exec, first (cold daemon)", run_true(sb)[0])
        fig.add("delete (cold daemon)", timed(sb.delete)[0])
        progress.show(f"{i + 1}/{plan.cold}")


def warm(fig: Figures, plan: Plan, daemon: Daemon, progress: Progress) -> None:
    """From a full pool; the refill done before the first exec (so neither exec nor delete
    shares the machine with a slot being prepared: the cycles below measure that)."""
    progress.begin("API round trip")
    for _ in range(plan.api):
        fig.add("API round trip (GET /v1/health)", timed(daemon.health)[0])
    progress.begin("warm create, exec, delete")
    for i in range(plan.warm):
        daemon.settle()
        ms, sb = timed(daemon.create)
        fig.add("create, warm pool", ms)
        daemon.settle()
        client, inside = run_true(sb)
        fig.add("exec, first", client)
        fig.add("exec, first (daemon-side duration_ms)", inside)
        for _ in range(plan.later):
            client, inside = run_true(sb)
            fig.add("exec, later", client)
            fig.add("exec, later (daemon-side duration_ms)", inside)
        fig.add("delete", timed(sb.delete)[0])
        progress.show(f"{i + 1}/{plan.warm}")


def cycles(fig: Figures, plan: Plan, daemon: Daemon, progress: Progress, clients: int,
           seconds: int) -> None:
    """create -> exec -> delete back to back, by `clients` threads, for `seconds`, the pool
    refilling behind them as it would in use."""
    label = f"{clients} client{'s' if clients > 1 else ''}"
    progress.begin(f"cycles/s, {label}")
    daemon.settle()
    done: list[tuple[float, str, float, float, float]] = []  # end, id, create, exec, delete
    errors: list[str] = []
    lock = threading.Lock()
    start = time.monotonic()
    deadline = start + seconds

    def worker() -> None:
        while time.monotonic() < deadline and not errors:
            try:
                c_ms, sb = timed(daemon.create)
                e_ms = run_true(sb)[0]
                d_ms = timed(sb.delete)[0]
            except (DaemonError, BenchError) as exc:
                with lock:
                    errors.append(str(exc))
                return
            with lock:
                done.append((time.monotonic(), sb.id, c_ms, e_ms, d_ms))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        progress.show(f"{len(done)} cycles, {len(done) / max(0.1, time.monotonic() - start):.1f}"
                      "/s")
    wall = max(e for e, *_ in done) - start if done else float(seconds)
    if errors:
        fig.notes.append(f"cycles with {label}: {len(errors)} failed: {errors[0][:200]}")
    key = f"cycle ({label})"
    flags = daemon.warm_flags()
    for _, ident, c_ms, e_ms, d_ms in done:
        kind = "warm" if flags.get(ident, True) else "cold"
        fig.add(f"{key}: create", c_ms)
        fig.add(f"{key}: create, {kind}", c_ms)
        fig.add(f"{key}: exec", e_ms)
        fig.add(f"{key}: delete", d_ms)
        fig.add(f"{key}: create+exec+delete", c_ms + e_ms + d_ms)
    fig.values[f"cycles/s ({label})"] = len(done) / wall
    fig.values[f"cycles ({label})"] = len(done)
    fig.values[f"cold creates in cycles ({label})"] = sum(
        1 for _, ident, *_ in done if not flags.get(ident, True))
    # Whole seconds up to the last cycle's end: those still running at the deadline finish.
    per_second = [0.0] * max(1, int(wall + 0.999))
    for end, *_ in done:
        per_second[min(len(per_second) - 1, int(end - start))] += 1
    fig.series[label] = per_second
    progress.note(f"  {label}: {len(done)} cycles in {wall:.1f} s = {len(done) / wall:.1f}/s, "
                  f"{fig.values[f'cold creates in cycles ({label})']:.0f} cold creates")


def concurrent(fig: Figures, n: int, daemon: Daemon, progress: Progress,
               create: Callable[[], Sandbox] | None = None, uid_base: int = UID_BASE) -> None:
    """`n` sandboxes alive at once (made by `create`, default the daemon's host-root create):
    created, one exec in each, their idle memory measured, deleted."""
    make = create or daemon.create
    progress.begin(f"{n} sandboxes alive")
    daemon.settle()
    time.sleep(1.0)
    d_pss0, d_rss0 = rollup(daemon.pid)
    host0, slab0 = host_used(), unreclaimable_slab()
    alive: list[Sandbox] = []
    try:
        for i in range(n):
            ms, sb = timed(make)
            alive.append(sb)
            fig.add(f"{n} alive: create", ms)
            progress.show(f"create {i + 1}/{n}")
        for i, sb in enumerate(alive):
            fig.add(f"{n} alive: exec", run_true(sb)[0])
            progress.show(f"exec {i + 1}/{n}")
        if daemon.health().get("sandboxes") != n:
            raise BenchError(f"the daemon does not hold {n} sandboxes: {daemon.health()}")
        daemon.settle()
        time.sleep(2.0)  # freed pages back, refills done
        d_pss1, d_rss1 = rollup(daemon.pid)
        host1, slab1 = host_used(), unreclaimable_slab()
        pss = rss = usage = procs = 0
        for sb in alive:
            p, r, u, k = sandbox_memory(int(sb.info["uid"]), daemon.pid, uid_base)
            pss, rss, usage, procs = pss + p, rss + r, usage + u, procs + k
        flags = daemon.warm_flags()
        fig.values.update({
            "concurrent sandboxes": n,
            "concurrent: cold creates": sum(1 for sb in alive if not flags.get(sb.id, True)),
            "memory/sandbox: processes PSS MiB": pss / n / MiB,
            "memory/sandbox: processes RSS MiB": rss / n / MiB,
            "memory/sandbox: processes": procs / n,
            "memory/sandbox: cgroup use MiB": usage / n / MiB,
            "memory/sandbox: daemon PSS growth MiB": (d_pss1 - d_pss0) / n / MiB,
            "memory/sandbox: daemon RSS growth MiB": (d_rss1 - d_rss0) / n / MiB,
            "memory/sandbox: host used growth MiB": (host1 - host0) / n / MiB,
            "memory/sandbox: kernel unreclaimable slab growth MiB": (slab1 - slab0) / n / MiB,
            "daemon RSS MiB before": d_rss0 / MiB,
            "daemon RSS MiB with all alive": d_rss1 / MiB,
        })
        for i, sb in enumerate(list(alive)):
            fig.add(f"{n} alive: delete", timed(sb.delete)[0])
            alive.remove(sb)
            progress.show(f"delete {i + 1}/{n}")
    finally:
        for sb in alive:
            with contextlib.suppress(DaemonError):
                sb.delete()
    daemon.settle()
    time.sleep(1.0)
    fig.values["daemon RSS MiB after deleting all"] = rollup(daemon.pid)[1] / MiB
    fig.values["host used growth MiB, 1 s after deleting all"] = (host_used() - host0) / MiB
    # The kernel frees a namespace's objects in the background, some time after its deletion.
    time.sleep(9.0)
    fig.values["host used growth MiB, 10 s after deleting all"] = (host_used() - host0) / MiB
    fig.values["kernel unreclaimable slab growth MiB, 10 s after deleting all"] = (
        unreclaimable_slab() - slab0) / MiB


def profile(fig: Figures, plan: Plan, daemon: Daemon, log: Path, progress: Progress) -> None:
    """The instrumented daemon: warm create, exec, delete, the refill after each, timed step
    by step inside the daemon."""
    progress.begin("where the time goes")
    for i in range(plan.profile):
        daemon.settle()
        sb = daemon.create()
        daemon.settle()
        run_true(sb)
        sb.delete()
        progress.show(f"{i + 1}/{plan.profile}")
    daemon.settle()
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        fig.profile.setdefault(entry["f"], []).append(float(entry["ms"]))


# -- the report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    label: str
    needs: str
    value: float
    unit: str
    met: bool


def targets(fig: Figures) -> list[Target]:
    bare = fig.p50("fork/exec: subprocess.run")
    later = fig.p50("exec, later") - bare
    first = fig.p50("exec, first") - bare
    rate = fig.values.get("cycles/s (1 client)", float("nan"))
    n = int(fig.values.get("concurrent sandboxes", 0))
    mem = (fig.values.get("memory/sandbox: processes PSS MiB", float("nan"))
           + max(0.0, fig.values.get("memory/sandbox: daemon PSS growth MiB", float("nan"))))
    return [
        Target("warm create p50", "≤ 20 ms", fig.p50("create, warm pool"), "ms",
               fig.p50("create, warm pool") <= 20),
        Target("warm create p95", "≤ 50 ms", fig.p95("create, warm pool"), "ms",
               fig.p95("create, warm pool") <= 50),
        Target("exec p50 over bare fork/exec (later exec - subprocess.run)", "≤ 5 ms", later,
               "ms", later <= 5),
        Target("first exec p50 over bare fork/exec", "≤ 5 ms", first, "ms", first <= 5),
        Target("cold create p50 (--pool 0)", "≤ 150 ms", fig.p50("create, cold (--pool 0)"),
               "ms", fig.p50("create, cold (--pool 0)") <= 150),
        Target("create → exec → delete cycles/s, one client, sustained", "≥ 20/s", rate, "/s",
               rate >= 20),
        Target(f"{n} sandboxes alive at once", "200", n, "", n >= 200),
        Target("host memory per sandbox outside the workload (processes' PSS + daemon's "
               "growth)", "≤ 10 MiB", mem, "MiB", mem <= 10),
    ]


def _f(value: float, unit: str = "") -> str:
    if value != value:
        return "-"
    text = f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}" if abs(value) < 100 \
        else f"{value:,.0f}"
    return f"{text} {unit}".rstrip()


# Rows of the latency table, in order: (name in Figures, what it is).
ROWS = [
    ("fork/exec: posix_spawn + waitpid", "baseline"),
    ("fork/exec: subprocess.run", "baseline"),
    ("bwrap: binds only", "baseline"),
    ("bwrap: the sandbox's namespaces", "baseline"),
    ("sealgate --version (CLI start)", "baseline"),
    ("sealgate sandbox run -- /bin/true", "one-shot"),
    ("API round trip (GET /v1/health)", "sandboxd"),
    ("create, warm pool", "sandboxd"),
    ("create, cold (--pool 0)", "sandboxd"),
    ("exec, first", "sandboxd"),
    ("exec, first (daemon-side duration_ms)", "sandboxd"),
    ("exec, later", "sandboxd"),
    ("exec, later (daemon-side duration_ms)", "sandboxd"),
    ("delete", "sandboxd"),
    ("exec, first (cold daemon)", "sandboxd --pool 0"),
    ("delete (cold daemon)", "sandboxd --pool 0"),
]


def latency_rows(fig: Figures) -> list[tuple[str, str, int, float, float]]:
    names = [n for n, _ in ROWS]
    extra = [n for n in fig.samples if n not in names]
    kinds = dict(ROWS)
    return [(name, kinds.get(name, "sandboxd"), len(fig.samples[name]), fig.p50(name),
             fig.p95(name)) for name in names + extra if fig.samples.get(name)]


def console(fig: Figures) -> str:
    lines = [f"{'measurement':<52}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}"]
    lines += [f"{name[:51]:<52}{n:>6}{_f(p50):>10}{_f(p95):>10}"
              for name, _, n, p50, p95 in latency_rows(fig)]
    lines.append("")
    lines += [f"{k:<52}{_f(v):>10}" for k, v in fig.values.items()]
    lines.append("")
    lines += [f"target {t.label}: {_f(t.value, t.unit)} (needs {t.needs}) "
              f"{'met' if t.met else 'NOT met'}" for t in targets(fig)]
    lines.append(f"seed: start {SEED_START_MS:.0f} ms -> warm create + first exec "
                 f"{_f(fig.p50('create, warm pool') + fig.p50('exec, first'), 'ms')}; "
                 f"per command {SEED_COMMAND_MS:.0f} ms -> {_f(fig.p50('exec, later'), 'ms')}")
    lines += fig.notes
    return "\n".join(lines)


def facts() -> dict[str, str]:
    out = machine_facts()
    out.pop("nginx / squid / wrk / hey", None)
    out.pop("mitmproxy", None)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True,
                               timeout=10, check=False).stdout.strip()
        out["bubblewrap"] = bwrap or "?"
    cgroup = "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else \
        "v1 hierarchies (hybrid)"
    out["cgroups"] = cgroup
    return out


def document(fig: Figures, meta: dict[str, str], plan: Plan, chart: Path) -> str:
    n = int(fig.values.get("concurrent sandboxes", 0))
    out = [
        "# Sandbox start-up: sandboxd's warm pool, one-shot runs, bare bubblewrap",
        "",
        "Generated by `bench/sandbox_start.py` (method: `bench/README.md`). Do not edit by "
        "hand above the hand-written part; run the command again.",
        "",
        f"* **Command:** `{meta['command']}`",
        f"* **Date:** {meta['date']} ({meta['mode']}, {meta['duration']} in all)",
        "* **Workload:** `/bin/true` everywhere. Baselines in the same run: `posix_spawn` + "
        "`waitpid` and `subprocess.run` from Python, bubblewrap run directly (as root, binds "
        "only; and with the sandbox's own namespaces, less the network one), the one-shot "
        "`sealgate sandbox run`. Then `sealgate sandboxd` (a `sealgate proxy` on the gateway "
        f"{GATEWAY} beside it, range {RANGE}, uid base {UID_BASE}) through the Python client "
        "`sealgate.sandbox.clients.client` over its unix socket: a daemon with `--pool 0` for cold "
        f"creates, then one with `--pool {POOL}`.",
        f"* **Samples:** {plan.warm} warm sandboxes (create; the refill awaited; first exec; "
        f"{plan.later} later execs; delete), {plan.cold} cold, {plan.bare} bare fork/execs, "
        f"{plan.bwrap} bubblewrap runs of each kind, {plan.oneshot} one-shot runs; cycles for "
        f"{plan.seconds} s with one client and {plan.clients_seconds} s with {plan.clients}; "
        f"{n} sandboxes alive at once. Times are wall-clock at the client, p50 and p95 "
        "(linear between samples). Nothing is pinned: the daemon prepares slots in threads, "
        "and the client, the daemon and the sandboxes share the two cores, as they would.",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in facts().items()],
        "",
        "## Targets (issue #11)",
        "",
        "| target | needs | measured | |",
        "|---|---|---|---|",
        *[f"| {t.label} | {t.needs} | {_f(t.value, t.unit)} | "
          f"{'**met**' if t.met else '**not met**'} |" for t in targets(fig)],
        "",
        "Against the seed's figures for CodeRabbit's sandboxes (~700 ms to start one, ~250 ms "
        "per command): a warm create plus its first exec takes "
        f"{_f(fig.p50('create, warm pool') + fig.p50('exec, first'), 'ms')} at p50 "
        f"({SEED_START_MS / (fig.p50('create, warm pool') + fig.p50('exec, first')):.0f}x "
        f"less), a later command {_f(fig.p50('exec, later'), 'ms')} "
        f"({SEED_COMMAND_MS / fig.p50('exec, later'):.0f}x less); the one-shot "
        f"`sealgate sandbox run` takes {_f(fig.p50('sealgate sandbox run -- /bin/true'), 'ms')}.",
        "",
        f"![latencies, cycles per second and memory per sandbox]({chart.name})",
        "",
        "## Latency",
        "",
        "| kind | measurement | n | p50 ms | p95 ms |",
        "|---|---|---|---|---|",
        *[f"| {kind} | {name} | {count} | {_f(p50)} | {_f(p95)} |"
          for name, kind, count, p50, p95 in latency_rows(fig)],
        "",
        "`exec` at the client is the whole HTTP request (connect to the unix socket, the "
        "NDJSON stream, its end); `daemon-side duration_ms` is the daemon's own figure, from "
        "handing the request to the agent to the command's status.",
        "",
        "## Sustained create → exec → delete",
        "",
        "| clients | cycles | cycles/s | of them cold creates |",
        "|---|---|---|---|",
    ]
    for label in fig.series:
        out.append(f"| {label} | {fig.values[f'cycles ({label})']:.0f} | "
                   f"{fig.values[f'cycles/s ({label})']:.1f} | "
                   f"{fig.values[f'cold creates in cycles ({label})']:.0f} |")
    out += ["", f"The pool holds {POOL} slots and refills one at a time: when cycles come faster "
            "than a slot is prepared, the pool runs dry and creates prepare their own (cold) "
            "beside the refill.", ""]
    out += [
        f"## {n} sandboxes alive at once, idle",
        "",
        *memory_tables(fig.values, _f),
        "",
        "Processes: the ones in each sandbox's cgroups (bubblewrap outside, bubblewrap as the "
        "namespace's init, the agent), PSS from `/proc/<pid>/smaps_rollup` (shared pages "
        "divided among their users: the agents share one Python), RSS beside it. cgroup use: "
        "the sandbox's memory group (`memory.usage_in_bytes` on v1, `memory.current` on v2: "
        "with page cache and kernel memory it was charged). Daemon growth: its PSS and RSS "
        "with them all alive less before the first create, over their number (their name "
        "servers and sessions live there). Host used growth: MemTotal - MemAvailable, which "
        "also counts what no process owns (namespaces, veths, nftables tables, tmpfs), but "
        "also anything else the machine did meanwhile (on a shared machine, a rough figure); "
        "the kernel's unreclaimable slab is the part of it namespaces and links live in.",
    ]
    if fig.profile:
        out += ["", "## Where the time goes (an instrumented daemon)", "",
                f"A third daemon (`--pool 2`) run through a wrapper that times the steps of a "
                f"slot's preparation, a create and a delete inside the daemon; {plan.profile} "
                "warm create → exec → delete cycles, the refill awaited after each. The counts "
                "also take in the self-test's two canaries, the pool's first fill and the slots "
                "released at the stop.", "",
                "| step | n | p50 ms | mean ms |", "|---|---|---|---|"]
        out += [f"| {name} | {len(v)} | {_f(percentile(v, 50))} | {_f(statistics.fmean(v))} |"
                for name, v in sorted(fig.profile.items()) if v]
    if fig.notes:
        out += ["", "## Notes", "", *[f"* {note}" for note in fig.notes]]
    return "\n".join(out) + "\n"


def draw(fig: Figures, path: Path) -> None:
    canvas, (lat, rate, mem) = figure([1.5, 1, 0.8], (18, 6.5))
    table = latency_rows(fig)
    names = [f"{name}" for name, *_ in table]
    p50 = [row[3] for row in table]
    p95 = [row[4] for row in table]
    colours = {"baseline": "tab:gray", "one-shot": "tab:orange", "sandboxd": "tab:blue",
               "sandboxd --pool 0": "tab:purple"}
    ys = range(len(table))
    lat.barh(ys, p50, color=[colours.get(row[1], "tab:blue") for row in table], alpha=0.8)
    lat.errorbar(p95, ys, fmt="|", color="black", markersize=8, label="p95")
    lat.set_yticks(list(ys), names, fontsize=7)
    lat.invert_yaxis()
    lat.set_xscale("log")
    for x, label in ((20, "warm create target"), (150, "cold create target"),
                     (SEED_START_MS, "seed start"), (SEED_COMMAND_MS, "seed per command")):
        lat.axvline(x, linestyle="--", linewidth=1, color="tab:red" if "target" in label
                    else "tab:green")
        lat.annotate(label, (x, -0.6), rotation=90, fontsize=7, va="top", ha="right")
    lat.set_xlabel("ms, log scale (bar p50, tick p95)")
    lat.set_title("latency of /bin/true and sandbox life cycle", fontsize=10)
    lat.grid(axis="x", which="both", alpha=0.3)
    for label, series in fig.series.items():
        rate.plot(range(1, len(series) + 1), series, label=label, marker=".")
    rate.axhline(20, linestyle="--", color="tab:red", label="target 20/s")
    rate.set_xlabel("second")
    rate.set_ylabel("create → exec → delete cycles completed")
    rate.set_title("sustained cycles per second", fontsize=10)
    rate.set_ylim(bottom=0)
    rate.grid(alpha=0.3)
    rate.legend(fontsize=8)
    parts = [("processes PSS", fig.values.get("memory/sandbox: processes PSS MiB", 0.0)),
             ("daemon PSS growth",
              max(0.0, fig.values.get("memory/sandbox: daemon PSS growth MiB", 0.0)))]
    bottom = 0.0
    for label, value in parts:
        mem.bar(0, value, bottom=bottom, label=label)
        bottom += value
    mem.bar(1, fig.values.get("memory/sandbox: cgroup use MiB", 0.0), color="tab:olive",
            label="cgroup use")
    mem.bar(2, max(0.0, fig.values.get("memory/sandbox: host used growth MiB", 0.0)),
            color="tab:brown", label="host used growth")
    mem.axhline(10, linestyle="--", color="tab:red", label="target 10 MiB")
    mem.set_xticks([0, 1, 2], ["PSS +\ndaemon", "cgroup", "host"], fontsize=8)
    mem.set_ylabel("MiB per sandbox")
    mem.set_title(f"idle memory per sandbox, {int(fig.values.get('concurrent sandboxes', 0))} "
                  "alive", fontsize=10)
    mem.legend(fontsize=7)
    save(canvas, path)


# -- main -----------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true",
                        help="fewer samples, 5 s of cycles, 50 sandboxes at once (~1.5 min)")
    parser.add_argument("--seconds", type=int, help="seconds of sustained cycles (default 60, "
                                                    "quick 5)")
    parser.add_argument("--concurrent", type=int,
                        help="sandboxes alive at once (default 200, quick 50)")
    parser.add_argument("--json", action="store_true",
                        help="print the figures as one JSON object on stdout, not the table")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs",
                        help="where performance-sandbox.md and .png go (default docs/)")
    args = parser.parse_args(argv)
    if (args.seconds is not None and args.seconds < 1) or (
            args.concurrent is not None and not 1 <= args.concurrent <= MAX_SANDBOXES):
        parser.error(f"--seconds at least 1, --concurrent 1..{MAX_SANDBOXES}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    plan = QUICK if args.quick else FULL
    if args.seconds is not None or args.concurrent is not None:
        plan = Plan(**{**asdict(plan),
                       "seconds": args.seconds if args.seconds is not None else plan.seconds,
                       "concurrent": args.concurrent or plan.concurrent})
    if os.geteuid() != 0:
        print(f"{SCRIPT}: needs root (namespaces, nftables, cgroups)", file=sys.stderr)
        return 2
    missing = [t for t in ("bwrap", "setpriv", "ip", "nft") if shutil.which(t, path=HOST_PATH)
               is None]
    if missing or not os.access("/usr/bin/python3", os.X_OK):
        print(f"{SCRIPT}: missing {' '.join(missing) or '/usr/bin/python3'}; "
              "bash scripts/debian-deps.sh bubblewrap util-linux iproute2 nftables",
              file=sys.stderr)
        return 2
    fig = Figures()
    progress = Progress({
        "bare fork/exec": plan.bare * 0.004, "bare bubblewrap": plan.bwrap * 0.01,
        "one-shot sandbox run": plan.oneshot * 1.0, "cold create (--pool 0)": plan.cold * 0.3,
        "API round trip": plan.api * 0.002, "warm create, exec, delete": plan.warm * 0.4,
        "cycles/s, 1 client": plan.seconds,
        f"cycles/s, {plan.clients} clients": plan.clients_seconds,
        f"{plan.concurrent} sandboxes alive": plan.concurrent * 0.35 + 12,
        "where the time goes": plan.profile * 0.4,
    })
    started = time.monotonic()
    with bench_session(SCRIPT, ("sealgate",)) as session:
        setup, paths = session.setup, dict(session.paths)
        paths["bwrap"] = shutil.which("bwrap", path=HOST_PATH) or "bwrap"
        daemons: list[Daemon] = []
        done = sealgate_cmd(paths, "sandbox", "setup", "--range", RANGE, "--gateway", GATEWAY)
        if done.returncode != 0:
            raise BenchError(f"sealgate sandbox setup: {done.stderr}")
        try:
            baselines(fig, plan, paths, progress)
            progress.note(f"starting sealgate proxy on {GATEWAY} in {setup.work} ...")
            proxy = start_proxy(setup, paths)
            one_shot(fig, plan, paths, proxy, progress)

            daemons.append(start_daemon(setup, paths, proxy, "sandboxd-cold", 0))
            cold(fig, plan, daemons[-1], progress)
            daemons.pop().stop(setup)

            daemons.append(start_daemon(setup, paths, proxy, "sandboxd", POOL))
            warm(fig, plan, daemons[-1], progress)
            cycles(fig, plan, daemons[-1], progress, 1, plan.seconds)
            cycles(fig, plan, daemons[-1], progress, plan.clients, plan.clients_seconds)
            concurrent(fig, plan.concurrent, daemons[-1], progress)
            daemons.pop().stop(setup)

            timings = setup.work / "profile.jsonl"
            try:  # a breakdown only: its failure must not cost the run its figures
                daemons.append(start_daemon(setup, paths, proxy, "sandboxd-profiled", 2,
                                            timings))
                profile(fig, plan, daemons[-1], timings, progress)
            except BenchError as exc:
                fig.notes.append(f"the instrumented daemon failed: {str(exc)[-600:]}")
                progress.note(f"  instrumented daemon failed: {str(exc)[-300:]}")
            if daemons:
                daemons.pop().stop(setup)
        finally:
            tear_down(setup, paths, daemons, (RANGE, GATEWAY))
    progress.note(f"done in {_clock(time.monotonic() - started)}")

    meta = run_meta("sandbox_start.py", argv if argv is not None else sys.argv[1:], started,
                    args.quick)
    return finish(args.docs, "performance-sandbox", lambda chart: draw(fig, chart),
                  lambda chart: document(fig, meta, plan, chart),
                  machine={"meta": meta, "plan": asdict(plan), **fig.summary()}
                  if args.json else None, console=console(fig), notes=fig.notes)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
