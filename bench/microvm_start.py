"""The microVM tier's costs: cold boot to first command, the first command of a VM from the warm
pool, a command on a running VM, the idle memory of one VM (QEMU's RSS and PSS), and a CPU-bound
and a syscall-heavy workload inside against the same on the host.

The VMs are booted as the tier boots them (`sandbox.tiers.microvm.vm`, the image `make test`
builds), without a network: the network's cost is the namespace's, the same for every tier
(bench/sandbox_start.py). Then `sealgate sandboxd --isolation microvm` with its warm pool, as
bench/sandbox_tiers.py measures every tier's daemon: create (a booted VM handed out, its
address registered), its first exec and later ones, through the API (`--sandboxd 0` skips it).
The accelerator is KVM where it runs Debian's kernel, else QEMU's emulation (TCG), as the
document says.

Writes docs/performance-microvm.md and docs/performance-microvm.png (`--docs DIR` elsewhere);
`--json` prints the figures as one JSON object instead.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from report import figure, machine_facts, publish, save
from rounds import percentile
from services import ROOT, BenchError

from sealgate.reasons import SealgateError
from sealgate.sandbox.tiers.microvm import image, pool, vm

SCRIPT = "microvm_start"
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/sandbox", "LANG": "C.UTF-8"}
NOBODY = 65534
GUEST_MIB = 512
TARGET_COLD_MS, TARGET_WARM_MS = 500.0, 30.0
CPU_LOOP = "s = 0\nfor i in range(3_000_000):\n    s += i * i\n"
SYSCALL_LOOP = "import os\nfor _ in range(200_000):\n    os.getppid()\n"


def spec(found: image.Image, accel: str) -> vm.Spec:
    return vm.Spec(found, accel, NOBODY, NOBODY, memory_mib=GUEST_MIB)


def true(booted: pool.Booted) -> None:
    done = booted.channel.run(["true"], ENV, uid=NOBODY, gid=NOBODY, timeout=60)
    if done.code != 0:
        raise BenchError(f"true in the guest exited with {done.code}")


def cold(found: image.Image, accel: str, rounds: int) -> dict[str, list[float]]:
    ready, first = [], []
    for _ in range(rounds):
        started = time.monotonic()
        booted = pool.boot(spec(found, accel))
        try:
            ready.append((time.monotonic() - started) * 1000)
            true(booted)
            first.append((time.monotonic() - started) * 1000)
        finally:
            booted.close()
    return {"agent_ready_ms": ready, "first_command_ms": first}


def warm(found: image.Image, accel: str, rounds: int) -> dict[str, list[float]]:
    """From a pool holding a booted VM: take it, run its first command."""
    taken, again = [], []
    warm_pool = pool.Pool(lambda: spec(found, accel), size=1)
    try:
        for _ in range(rounds):
            deadline = time.monotonic() + pool.BOOT_SECONDS
            while warm_pool.idle() == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            started = time.monotonic()
            booted = warm_pool.take()
            try:
                true(booted)
                taken.append((time.monotonic() - started) * 1000)
                for _ in range(5):
                    one = time.monotonic()
                    true(booted)
                    again.append((time.monotonic() - one) * 1000)
            finally:
                booted.close()
    finally:
        warm_pool.close()
    return {"pool_first_command_ms": taken, "exec_ms": again}


def memory(found: image.Image, accel: str) -> dict[str, Any]:
    booted = pool.boot(spec(found, accel))
    try:
        true(booted)
        time.sleep(2)  # idle, as a VM waits in the pool
        pid = booted.machine.proc.pid
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next(int(line.split()[1]) for line in status.splitlines()
                   if line.startswith("VmRSS:"))
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        pss = next(int(line.split()[1]) for line in rollup.splitlines()
                   if line.startswith("Pss:"))
        return {"rss_mib": rss / 1024, "pss_mib": pss / 1024, "guest_mib": GUEST_MIB,
                "kernel": booted.channel.kernel}
    finally:
        booted.close()


def workloads(found: image.Image, accel: str, rounds: int) -> dict[str, dict[str, float]]:
    """Wall time of the same python3 program in the guest and on the host (best of rounds)."""
    out: dict[str, dict[str, float]] = {}
    booted = pool.boot(spec(found, accel))
    try:
        for name, program in (("cpu", CPU_LOOP), ("syscalls", SYSCALL_LOOP)):
            guest = best(rounds, functools.partial(_in_guest, booted, program))
            host = best(rounds, functools.partial(_on_host, program))
            out[name] = {"guest_s": guest, "host_s": host, "slowdown": guest / host}
    finally:
        booted.close()
    return out


def best(rounds: int, once: Callable[[], None]) -> float:
    times = []
    for _ in range(rounds):
        started = time.monotonic()
        once()
        times.append(time.monotonic() - started)
    return min(times)


def _in_guest(booted: pool.Booted, program: str) -> None:
    done = booted.channel.run(["python3", "-I", "-S", "-c", program], ENV, uid=NOBODY,
                              gid=NOBODY, timeout=600)
    if done.code != 0:
        raise BenchError(f"the workload failed in the guest: {done.stderr[-300:]!r}")


def _on_host(program: str) -> None:
    done = subprocess.run(["/usr/bin/python3", "-I", "-S", "-c", program], capture_output=True,
                          text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise BenchError(f"the workload failed on the host: {done.stderr[-300:]!r}")


def daemon(cycles: int) -> dict[str, list[float]]:
    """sandboxd --isolation microvm behind a real proxy on the benchmark's gateway: client-side
    ms of create from a full pool, the first exec of /bin/true, later ones (sandbox_tiers')."""
    from sandbox_start import GATEWAY, RANGE, sealgate_cmd, start_proxy
    from sandbox_tiers import daemon_figures
    from session import bench_session

    with bench_session(SCRIPT, ("sealgate",)) as session:
        paths = dict(session.paths)
        plan = ("--range", RANGE, "--gateway", GATEWAY)
        done = sealgate_cmd(paths, "sandbox", "setup", *plan)
        if done.returncode != 0:
            raise BenchError(f"sealgate sandbox setup: {done.stderr}")
        try:
            proxy = start_proxy(session.setup, paths)
            return daemon_figures(session, paths, proxy, "microvm", cycles)
        finally:
            session.setup.services.stop_all()
            sealgate_cmd(paths, "sandbox", "teardown", *plan)


def summary(figures: dict[str, Any]) -> dict[str, float]:
    flat: dict[str, float] = {}
    for key in ("agent_ready_ms", "first_command_ms", "pool_first_command_ms", "exec_ms"):
        values = figures[key]
        flat[f"{key}_p50"] = percentile(values, 50)
        flat[f"{key}_p95"] = percentile(values, 95)
    return flat


def draw(figures: dict[str, Any], chart: Path) -> None:
    fig, (latency, slow) = figure([3, 1.4], (10, 3.6))
    labels = ["cold: boot to\nfirst command", "warm pool:\nfirst command", "running VM:\ncommand"]
    keys = ["first_command_ms", "pool_first_command_ms", "exec_ms"]
    p50 = [percentile(figures[k], 50) for k in keys]
    p95 = [percentile(figures[k], 95) for k in keys]
    xs = range(len(keys))
    latency.bar([x - 0.2 for x in xs], p50, width=0.4, label="p50", color="#4c72b0")
    latency.bar([x + 0.2 for x in xs], p95, width=0.4, label="p95", color="#dd8452")
    latency.axhline(TARGET_COLD_MS, color="#c44e52", linestyle="--", linewidth=1,
                    label=f"cold target {TARGET_COLD_MS:.0f} ms")
    latency.axhline(TARGET_WARM_MS, color="#55a868", linestyle=":", linewidth=1,
                    label=f"warm target {TARGET_WARM_MS:.0f} ms")
    latency.set_yscale("log")
    latency.set_xticks(list(xs), labels)
    latency.set_ylabel("ms (log)")
    latency.set_title(f"microVM ({figures['accel']}): latency")
    latency.legend(fontsize=8)
    names = list(figures["workloads"])
    slow.bar(names, [figures["workloads"][n]["slowdown"] for n in names], color="#8172b2")
    slow.axhline(1.0, color="black", linewidth=0.8)
    slow.set_ylabel("guest time / host time")
    slow.set_title("workload slowdown")
    save(fig, chart)


def render(figures: dict[str, Any], meta: dict[str, str], chart: Path) -> str:
    flat = summary(figures)
    facts = "\n".join(f"| {k} | {v} |" for k, v in meta.items() if k != "command")
    rows = [
        ("cold: QEMU start to the agent's first word", "agent_ready_ms", ""),
        ("cold: QEMU start to the first command's exit", "first_command_ms",
         f"≤ {TARGET_COLD_MS:.0f} ms"),
        ("warm pool: take a booted VM, first command's exit", "pool_first_command_ms",
         f"≤ {TARGET_WARM_MS:.0f} ms"),
        ("a command on a running VM (`true`)", "exec_ms", ""),
    ]
    table = "\n".join(f"| {label} | {flat[key + '_p50']:.0f} | {flat[key + '_p95']:.0f} | "
                      f"{target} |" for label, key, target in rows)
    served = figures.get("sandboxd") or {}
    if served.get("create"):
        daemon_rows = [
            ("sandboxd: create from the warm pool (a booted VM, its address registered)",
             "create", ""),
            ("sandboxd: first exec of /bin/true, through the API", "first",
             f"≤ {TARGET_WARM_MS:.0f} ms"),
            ("sandboxd: later execs of /bin/true, through the API", "later", ""),
        ]
        table += "\n" + "\n".join(
            f"| {label} | {percentile(served[key], 50):.0f} | {percentile(served[key], 95):.0f} | "
            f"{target} |" for label, key, target in daemon_rows)
    served_rounds = (f"{len(served['create'])} creates, "
                     f"{len(served['later']) // max(1, len(served['create']))} later execs each"
                     if served.get("create") else "not run")
    mem = figures["memory"]
    loads = "\n".join(f"| {name} | {w['host_s']:.2f} | {w['guest_s']:.2f} | "
                      f"{w['slowdown']:.1f}x |" for name, w in figures["workloads"].items())
    return f"""# microVM tier: performance

Generated by `{' '.join(meta['command'].split())}` ({SCRIPT}.py); the chart is
[{chart.name}]({chart.name}).

**Accelerator: {figures['accel']}** ({figures['accel_why']}).

| machine | |
| --- | --- |
{facts}

## Start and exec (ms, {figures['rounds']} rounds each; sandboxd's {served_rounds})

| what | p50 | p95 | target |
| --- | --- | --- | --- |
{table}

## Idle memory of one VM (guest RAM {mem['guest_mib']} MiB)

| QEMU RSS | QEMU PSS |
| --- | --- |
| {mem['rss_mib']:.0f} MiB | {mem['pss_mib']:.0f} MiB |

## Workloads: one python3 program on the host and in the guest (s, best of {figures['work_rounds']})

| workload | host | guest | slowdown |
| --- | --- | --- | --- |
{loads}

The guest's times include starting python3 over 9p and the agent's round trip (a run on the host
includes its own start too).

![microVM latency and slowdown]({chart.name})
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--work-rounds", type=int, default=3)
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sandboxd", type=int, default=20, metavar="N",
                        help="creates from sandboxd's warm pool to time (0: none)")
    args = parser.parse_args()
    if vm.kvm_problem() is not None:
        os.environ.setdefault(vm.ACCEL_ENV, "tcg")
    accel, why = vm.accelerator()
    found = image.find()
    if accel is None or found is None or vm.qemu() is None or os.geteuid() != 0:
        missing = "no image (scripts/microvm-image), no QEMU or not root"
        print(f"{SCRIPT}: cannot run a microVM here: {why if accel is None else missing}",
              file=sys.stderr)
        return 1
    load = os.getloadavg()[0]
    try:
        figures: dict[str, Any] = {"accel": accel, "accel_why": why, "rounds": args.rounds,
                                   "work_rounds": args.work_rounds}
        figures.update(cold(found, accel, args.rounds))
        figures.update(warm(found, accel, args.rounds))
        figures["memory"] = memory(found, accel)
        figures["workloads"] = workloads(found, accel, args.work_rounds)
        if args.sandboxd > 0:
            figures["sandboxd"] = daemon(args.sandboxd)
    except (BenchError, SealgateError) as exc:
        # Most of the run is outside bench_session (which ends a run on a BenchError with its
        # message), and the microVM tier and sandboxd's client raise their own errors.
        print(f"{SCRIPT}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**figures, **summary(figures)}))
        return 0
    # Emulated guests take whole cores: what else ran on the machine shows in every figure.
    meta = {**machine_facts(), "QEMU": qemu_version(),
            "load average (1 min), start / end": f"{load:.2f} / {os.getloadavg()[0]:.2f}",
            "guest kernel": f"{figures['memory']['kernel']} (image {found.key})",
            "command": " ".join(["python", f"bench/{SCRIPT}.py", *sys.argv[1:]])}
    print(publish(args.docs, "performance-microvm", lambda c: draw(figures, c),
                  lambda c: render(figures, meta, c)))
    return 0


def qemu_version() -> str:
    done = subprocess.run([vm.QEMU, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0] if done.stdout else "?"


if __name__ == "__main__":
    sys.exit(main())
