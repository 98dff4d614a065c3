"""`sealgate sandboxd`'s lifecycle against the host's real state: a sandbox that ends, however it
ends (deleted, its time to live, its idle timeout, its agent killed, its daemon killed or
stopped), leaves nothing behind: no namespace, link, firewall table, cgroup, tmpfs, lease,
process of its uid, registration with the proxy or descriptor of the daemon's.

Other runs may share the host (another daemon, `sandbox run` tests): what they hold is told apart
by its lease, and a snapshot is taken under the links' lock, so nothing is half made or half
removed while it is counted. Anything of a sandbox's without a live lease is a leak whoever
made it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sealgate.proxy.process.controlclient import call
from sealgate.reasons import Reason
from sealgate.sandbox.clients.client import DaemonError, Sandbox
from sealgate.sandbox.host.network import RUN_DIR, lock
from tests.harness import ROOT, SEALGATE, Proxy
from tests.sandboxd.conftest import UID_BASE, Daemon, start_daemon
from tests.sandboxd.test_sessions import host_processes

pytestmark = pytest.mark.root

# As the issue asks: 1,000 (create, one exec, delete), ~40 s on the dev VM now that a delete
# returns once the sandbox is over and its teardown runs beside the next prepare.
SANDBOXES = 1000
POOL = 2  # the package daemon's --pool
_UIDS = 1 << 14  # the range's /30 links: 10.216.0.0/16 has 16,383
_SLOTS = Path("/run/sealgate-slots")
_CGROUPS = Path("/sys/fs/cgroup")


def until(what: Callable[[], Any], seconds: float, why: str) -> Any:
    """Poll `what` until it is true-ish (every loop here is bounded)."""
    deadline = time.monotonic() + seconds
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {why}")
        time.sleep(0.02)


# -- the host's state ---------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    """What sandboxes hold on the host, by link index, and who holds each index."""

    leases: dict[int, int]  # index -> pid
    netns: set[int]
    links: set[int]
    tables: set[int]
    cgroups: Counter[tuple[int, int]]  # (index, pid)
    mounts: Counter[int]
    processes: Counter[int]  # index (uid - base) -> processes running as that uid
    # of those uids, by parent: dead, never reaped (they hold a pid, nothing else). Those of
    # the host's pid 1 are its to reap (a daemon killed outright leaves them there), and this
    # VM's reaps late; the daemon's own are what it must not leave.
    zombies: Counter[int]

    def of(self, pid: int) -> Counter[str]:
        """How much a daemon of `pid` holds, kind by kind."""
        mine = {i for i, p in self.leases.items() if p == pid}
        return Counter({
            "leases": len(mine), "netns": len(self.netns & mine),
            "links": len(self.links & mine), "tables": len(self.tables & mine),
            "cgroups": sum(n for (i, p), n in self.cgroups.items() if p == pid),
            "mounts": sum(n for i, n in self.mounts.items() if i in mine),
            "processes": sum(n for i, n in self.processes.items() if i in mine),
        })

    def orphans(self) -> list[str]:
        """Whatever is left of a sandbox whose holder is gone: a leak, whoever made it."""
        live = {i for i, p in self.leases.items() if _alive(p)}
        found = [f"lease {i} of dead pid {p}" for i, p in self.leases.items() if i not in live]
        for kind, indices in (("netns", self.netns), ("link", self.links),
                              ("table", self.tables), ("mount", set(self.mounts)),
                              ("process", set(self.processes))):
            found += [f"{kind} {i}" for i in sorted(indices - live)]
        # A live process's groups are its own business (`of` counts a daemon's by its pid).
        found += [f"cgroup run-{i}-{p}" for (i, p) in sorted(self.cgroups) if not _alive(p)]
        return found


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _indices(names: Iterator[str], pattern: str) -> set[int]:
    found = set()
    for name in names:
        if (m := re.fullmatch(pattern, name)) is not None:
            found.add(int(m[1]))
    return found


def host() -> Host:
    with lock():  # nothing is half taken or half removed while it is counted
        leases = {}
        claimed = {}  # a cgroup a successor daemon holds, named for its predecessor -> holder
        for path in RUN_DIR.glob("lease-*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                lease = json.loads(path.read_text())
                leases[int(lease["index"])] = int(lease["pid"])
                if lease.get("group"):
                    claimed[lease["group"]] = int(lease["pid"])
        netns = _indices(iter(os.listdir("/run/netns") if os.path.isdir("/run/netns") else []),
                         r"sg-(\d+)")
        # Asked of netlink: /sys/class/net is the namespace's that mounted sysfs.
        links_text = subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                                    text=True, check=True, timeout=20).stdout
        links = _indices((line.split()[1].split("@")[0].rstrip(":")
                          for line in links_text.splitlines() if line), r"sgh(\d+)")
        tables_text = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True,
                                     check=True, timeout=20).stdout
        tables = _indices((line.split()[-1] for line in tables_text.splitlines() if line),
                          r"sealgate_(\d+)")
        cgroups: Counter[tuple[int, int]] = Counter()
        # cgroup v2's one tree, or v1's hierarchy per controller (a group in each)
        for group in [*_CGROUPS.glob("sealgate/run-*"), *_CGROUPS.glob("*/sealgate/run-*")]:
            if (m := re.fullmatch(r"run-(\d+)-(\d+)", group.name)) is not None:
                cgroups[int(m[1]), claimed.get(group.name, int(m[2]))] += 1
        mounts: Counter[int] = Counter()
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point.startswith(f"{_SLOTS}/"):
                mounts[int(point.removeprefix(f"{_SLOTS}/").split("/")[0])] += 1
        processes: Counter[int] = Counter()
        zombies: Counter[int] = Counter()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                status = dict(line.split(":", 1) for line in
                              (proc / "status").read_text().splitlines() if ":" in line)
                uid = int(status["Uid"].split()[0])
                if UID_BASE <= uid < UID_BASE + _UIDS:
                    if status["State"].split()[0] == "Z":
                        zombies[int(status["PPid"])] += 1
                    else:
                        processes[uid - UID_BASE] += 1
        return Host(leases, netns, links, tables, cgroups, mounts, processes, zombies)


def registered(proxy: Proxy) -> dict[str, str]:
    status, body = call(proxy.state / "control.sock", "GET", "/v1/sources")
    assert status == 200, body
    return dict(body["sources"])


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled(daemon: Daemon, pool: int = POOL, seconds: float = 30) -> dict[str, Any]:
    """Once the pool is back at its target with nothing being prepared or taken down."""
    def full() -> dict[str, Any] | None:
        health = daemon.client.health()
        done = health.get("pool") == pool and health.get("preparing") == 0 \
            and health.get("releasing") == 0
        return health if done else None
    try:
        return until(full, seconds, f"the pool back at {pool}")  # type: ignore[no-any-return]
    except AssertionError as exc:
        raise AssertionError(f"{exc}; health: {daemon.client.health()}") from None


@dataclass
class Picture:
    """A daemon and everything it holds, to compare before and after."""

    held: Counter[str]
    orphans: list[str]
    zombies: int
    sources: dict[str, str]
    fds: int
    sandboxes: int


def picture(daemon: Daemon, proxy: Proxy, pool: int = POOL) -> Picture:
    health = settled(daemon, pool)
    state = host()
    return Picture(state.of(daemon.process.pid), state.orphans(),
                   state.zombies[daemon.process.pid],
                   registered(proxy),
                   fds(daemon.process.pid), health["sandboxes"])


def same_as(daemon: Daemon, proxy: Proxy, before: Picture, pool: int = POOL) -> Picture:
    """The daemon holds what it held before (descriptors of finished calls may take a moment
    to be closed, and a sandbox whose agent died a moment to be reaped by its init, which the
    kernel makes wait for every process of the namespace: a bounded wait for them)."""
    def again() -> Picture | None:
        now = picture(daemon, proxy, pool)
        return now if now == before else None
    try:
        return until(again, 10, "the same state")  # type: ignore[no-any-return]
    except AssertionError:
        now = picture(daemon, proxy, pool)
        assert now == before
        raise


def create(daemon: Daemon, **options: Any) -> Sandbox:
    return Sandbox.create("ci-bot", daemon=str(daemon.socket), **options)


def ended(sb: Sandbox) -> DaemonError:
    with pytest.raises(DaemonError) as caught:
        sb.refresh()
    return caught.value


def gone_or_ended(sb: Sandbox) -> bool:
    try:
        sb.refresh()
    except DaemonError as exc:
        return exc.reason is Reason.SANDBOX_ENDED
    return False


@pytest.fixture
def another(dproxy: Proxy, tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Daemons of the test's own, stopped (or killed) at its end whatever happened."""
    started: list[Daemon] = []

    def start(*flags: str) -> Daemon:
        daemon = start_daemon(dproxy, tmp_path / str(len(started)), *flags)
        started.append(daemon)
        return daemon

    for n in range(4):
        (tmp_path / str(n)).mkdir()
    yield start
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.stop()


# -- 1. deleting is complete --------------------------------------------------------------


# A thousand creates, execs and deletes: ~70 s on an idle two-CPU host, past the default
# 120 s limit when other work shares it (seen: 641 done at 120 s).
@pytest.mark.timeout(600)
def test_deleting_leaves_nothing_behind(sandboxd: Daemon, dproxy: Proxy) -> None:
    before = picture(sandboxd, dproxy)
    assert before.orphans == [] and before.sandboxes == 0
    assert before.held["leases"] == POOL and before.held["mounts"] == POOL
    started = time.monotonic()
    for n in range(SANDBOXES):
        with create(sandboxd) as sb:  # deleted at the end of the block
            if n % 7 == 3:  # a command still running when it is deleted
                stream = sb.stream(["sh", "-c", "echo up; sleep 60"])
                assert next(stream) == ("stdout", b"up\n")
                sb.delete()
                with contextlib.suppress(DaemonError, OSError, ValueError):
                    stream.close()
            elif n % 5 == 1:  # files written on its tmpfs
                sb.write("out/data.bin", b"x" * 4096)
                done = sb.run(["sh", "-c", "head -c 65536 /dev/zero > /tmp/t; echo ok > ~/h; "
                                            "wc -c < out/data.bin"])
                assert done.stdout == b"4096\n", done
            else:
                done = sb.run(["true"])
                assert done.exit_code == 0, done
    took = time.monotonic() - started
    print(f"\n{SANDBOXES} sandboxes (create, exec, delete) in {took:.1f} s, "
          f"{took / SANDBOXES * 1000:.1f} ms each")
    after = same_as(sandboxd, dproxy, before)
    assert after.sources == {}



# -- 2. time to live and idle timeout -----------------------------------------------------


def test_ttl_and_idle_end_sandboxes_on_their_own(sandboxd: Daemon, dproxy: Proxy) -> None:
    before = picture(sandboxd, dproxy)
    short = create(sandboxd, ttl=3)
    idle = create(sandboxd, idle_timeout=1)
    busy = create(sandboxd, idle_timeout=1)
    try:
        # A command running for longer than the idle timeout: the sandbox is not idle meanwhile.
        done = busy.run(["sleep", "1.8"])
        assert done.exit_code == 0, done
        live = {s["id"] for s in sandboxd.client.list()}
        assert short.id in live and idle.id not in live  # ttl 3 s not yet over, idle 1 s is
        assert busy.refresh()["id"] == busy.id
        assert busy.run(["true"]).exit_code == 0  # and serves on after it
        until(lambda: not {short.id, idle.id, busy.id} & {s["id"] for s in sandboxd.client.list()},
              8, "the expired sandboxes ended")
        for sb, why in ((short, "ttl"), (idle, "idle"), (busy, "idle")):
            refused = ended(sb)
            assert (refused.status, refused.reason) == (410, Reason.SANDBOX_ENDED), refused
            assert why in str(refused)
            with pytest.raises(DaemonError) as caught:
                sb.run(["true"])
            assert (caught.value.status, caught.value.reason) == (410, Reason.SANDBOX_ENDED)
    finally:
        for sb in (short, idle, busy):
            sb.delete()
    same_as(sandboxd, dproxy, before)


# -- 3. the daemon killed, or stopped -----------------------------------------------------


def _running(sb: Sandbox) -> Iterator[tuple[str, Any]]:
    stream = sb.stream(["sh", "-c", "echo up; sleep 60"])
    assert next(stream) == ("stdout", b"up\n")
    return stream


def test_a_killed_daemon_is_cleaned_up_after(
    sandboxd: Daemon, dproxy: Proxy, another: Callable[..., Daemon]
) -> None:
    settled(sandboxd)  # the package daemon idle: it cleans up stale leases too, at a prepare
    doomed = another("--pool", "1", "--no-selftest")
    settled(doomed, 1)
    boxes = [create(doomed) for _ in range(3)]
    streams = [_running(sb) for sb in boxes[:2]]
    boxes[2].write("kept.txt", b"data")
    settled(doomed, 1)
    pid = doomed.process.pid
    held = host().of(pid)
    assert held["leases"] == held["netns"] == held["links"] == held["tables"] == 4, held
    assert held["mounts"] == 4, held
    assert held["processes"] >= 4 * 3, held  # bubblewrap, its init and the agent, per slot
    addresses = {sb.info["address"] for sb in boxes}
    assert addresses <= set(registered(dproxy))

    doomed.process.kill()
    doomed.process.wait(10)
    for stream in streams:
        with contextlib.suppress(DaemonError, OSError, ValueError):
            stream.close()
    # bubblewrap dies with its parent, and every sandbox with its bubblewrap.
    until(lambda: host().of(pid)["processes"] == 0, 5, "the sandboxes' processes dead")
    left = host()
    others = {p for p in left.leases.values() if p not in (pid, sandboxd.process.pid)}
    if not any(_alive(p) for p in others):  # else another run may be cleaning up already
        kinds = Counter(o.split()[0] for o in left.orphans())
        assert kinds == {"lease": 4, "netns": 4, "link": 4, "table": 4, "mount": 4,
                         "cgroup": 4}, left.orphans()

    successor = another("--pool", "1", "--no-selftest")  # ready once it has cleaned up
    after = host()
    assert after.of(pid) == Counter(), after.of(pid)
    assert after.orphans() == [], after.orphans()
    assert not addresses & set(registered(dproxy))
    assert successor.stop() == 0


def test_a_stopped_daemon_deletes_everything(
    sandboxd: Daemon, dproxy: Proxy, another: Callable[..., Daemon]
) -> None:
    daemon = another("--pool", "2", "--no-selftest")
    boxes = [create(daemon) for _ in range(3)]
    settled(daemon)
    stream = _running(boxes[0])
    pid = daemon.process.pid
    assert host().of(pid)["leases"] == 5
    assert daemon.stop() == 0
    with contextlib.suppress(DaemonError, OSError, ValueError):
        stream.close()
    after = host()
    assert after.of(pid) == Counter(), after.of(pid)
    assert after.orphans() == [], after.orphans()
    assert not {sb.info["address"] for sb in boxes} & set(registered(dproxy))


# -- 4. the agent dying -------------------------------------------------------------------


def test_the_agent_dying_ends_its_sandbox(sandboxd: Daemon, dproxy: Proxy) -> None:
    before = picture(sandboxd, dproxy)
    sb = create(sandboxd)
    try:
        # No command can reach the agent (test_agent_reach): it dies here as a crash would,
        # killed from the host; no command runs, so the one process of the sandbox is it.
        agents = [pid for pid, line in host_processes(sb.info["uid"]).items()
                  if line.startswith("/usr/bin/python3 -I -S /run/sealgate/agent.py")]
        assert len(agents) == 1, host_processes(sb.info["uid"])
        os.kill(agents[0], 9)
        until(lambda: gone_or_ended(sb), 5, "the sandbox ended with its agent")
        refused = ended(sb)
        assert (refused.status, refused.reason) == (410, Reason.SANDBOX_ENDED)
        assert "agent" in str(refused)
    finally:
        sb.delete()
    same_as(sandboxd, dproxy, before)
    with create(sandboxd) as next_one:  # the pool serves on
        assert next_one.run(["echo", "ok"]).stdout == b"ok\n"
    same_as(sandboxd, dproxy, before)


# -- 5. the pool refills ------------------------------------------------------------------


def test_the_pool_refills_after_a_rush(sandboxd: Daemon, dproxy: Proxy) -> None:
    before = picture(sandboxd, dproxy)
    rush = POOL + 3
    boxes = [create(sandboxd) for _ in range(rush)]  # past the pool: some are cold
    try:
        assert len({sb.id for sb in boxes}) == rush
        assert len({sb.info["address"] for sb in boxes}) == rush
        for sb in boxes:
            assert sb.run(["echo", sb.id]).stdout == sb.id.encode() + b"\n"
        health = settled(sandboxd)  # back to its target while they are all still live
        assert health["sandboxes"] == rush
        held = host().of(sandboxd.process.pid)
        assert held["leases"] == held["netns"] == held["mounts"] == rush + POOL, held
        assert len(registered(dproxy)) == rush
    finally:
        for sb in boxes:
            sb.delete()
    same_as(sandboxd, dproxy, before)


# -- 6. how long things take --------------------------------------------------------------


def _p50(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f} ms"


def test_timings(sandboxd: Daemon, dproxy: Proxy, another: Callable[..., Daemon]) -> None:
    """Printed, not asserted beyond sanity: a loaded CI host is slower."""
    warm, deletes = [], []
    for _ in range(15):
        settled(sandboxd)
        started = time.perf_counter()
        sb = create(sandboxd)
        warm.append(time.perf_counter() - started)
        started = time.perf_counter()
        sb.delete()
        deletes.append(time.perf_counter() - started)
    cold_daemon = another("--pool", "0", "--no-selftest")
    cold = []
    for _ in range(8):
        started = time.perf_counter()
        sb = create(cold_daemon)
        cold.append(time.perf_counter() - started)
        sb.delete()
    print(f"\nwarm create p50 {_p50(warm)}, cold create p50 {_p50(cold)}, "
          f"delete p50 {_p50(deletes)}")
    assert statistics.median(warm) < statistics.median(cold)
    assert max(warm + cold + deletes) < 10


def test_gc_cleans_up_after_a_killed_daemon_without_a_new_one(
    sandboxd: Daemon, dproxy: Proxy, another: Callable[..., Daemon]
) -> None:
    settled(sandboxd)
    doomed = another("--pool", "1", "--no-selftest")
    settled(doomed, 1)
    boxes = [create(doomed) for _ in range(2)]
    addresses = {sb.info["address"] for sb in boxes}
    pid = doomed.process.pid
    doomed.process.kill()
    doomed.process.wait(10)
    until(lambda: host().of(pid)["processes"] == 0, 5, "the sandboxes' processes dead")
    left = host()
    # Any other live holder of links on this host cleans up stale leases as it takes a link.
    alone = not any(_alive(p) for p in left.leases.values()
                    if p not in (pid, sandboxd.process.pid))
    done = subprocess.run([*SEALGATE, "sandbox", "gc"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    if alone:  # the pool's slot and the two sandboxes
        assert done.stdout.count(f"cleaned up after process {pid} ") == 3, done.stdout
    assert host().of(pid) == Counter(), host().of(pid)
    assert not addresses & set(registered(dproxy))
