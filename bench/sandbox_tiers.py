"""The isolation tiers side by side: `sealgate sandbox run --isolation T` for every tier this
machine can run (bubblewrap, gVisor, and any tier registered later), one table.

Per tier (and sandboxd's rows: create from its warm pool, its execs): start to the workload's
first instruction (the command is `date +%s%N`, which reads
the clock first thing; the time from the CLI's exec to that reading), the whole run of
`/bin/true` (set-up, run, teardown), the memory an idle sandbox holds (its cgroup's use and
the PSS of its processes while it runs `sleep`), and the slowdown against bubblewrap of a
CPU-bound, a system-call-heavy and a file-heavy workload, each timed inside the sandbox.

Where KVM cannot run the microVM's guest (this host's nested PVM), the microVM runs under
QEMU's emulation (TCG), as the tests run it; the document says which.

Writes docs/performance-sandbox-tiers.md and its chart, docs/performance-sandbox-tiers.png
(`--docs DIR` elsewhere); `--json` prints the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from report import figure, machine_facts, publish, save
from rounds import percentile
from sandbox_start import (
    GATEWAY,
    HOST_PATH,
    RANGE,
    rollup,
    run_true,
    sealgate_cmd,
    sealgate_env,
    start_daemon,
    start_proxy,
    timed,
)
from services import ROOT, BenchError
from session import bench_session

from sealgate.sandbox import tiers
from sealgate.sandbox.tiers import gvisor
from sealgate.sandbox.tiers.microvm import vm

SCRIPT = "sandbox_tiers"
IDLE_SECONDS = 30
# Timed inside the sandbox: (name, Python source printing its own seconds).
WORKLOADS = {
    "CPU-bound (pure Python arithmetic)":
        "import time; t = time.perf_counter(); sum(i * i for i in range(3_000_000)); "
        "print(time.perf_counter() - t)",
    "system calls (getppid x 200k)":
        "import os, time; t = time.perf_counter()\nfor _ in range(200_000): os.getppid()\n"
        "print(time.perf_counter() - t)",
    "files (create, write, read, unlink x 2k in /tmp)":
        "import os, time; t = time.perf_counter()\nfor i in range(2000):\n"
        "    p = f'/tmp/f{i}'\n    with open(p, 'w') as f: f.write('x' * 100)\n"
        "    with open(p) as f: f.read()\n    os.unlink(p)\n"
        "print(time.perf_counter() - t)",
}


def run_args(proxy: Any, tier: str, *command: str) -> list[str]:
    return ["sandbox", "run", "--sandbox", "bench-bot", "--state", str(proxy.state),
            "--proxy-port", str(proxy.port), "--transparent-port", str(proxy.transparent_port),
            "--range", RANGE, "--gateway", GATEWAY, "--isolation", tier, "--", *command]


def first_instruction(paths: dict[str, str], proxy: Any, tier: str) -> float:
    """ms from the CLI's exec to the workload's first clock reading."""
    started = time.time_ns()
    done = sealgate_cmd(paths, *run_args(proxy, tier, "date", "+%s%N"))
    if done.returncode != 0:
        raise BenchError(f"{tier}: date failed ({done.returncode}): {done.stderr}")
    return (int(done.stdout) - started) / 1e6


def whole_run(paths: dict[str, str], proxy: Any, tier: str) -> float:
    ms, done = timed(lambda: sealgate_cmd(paths, *run_args(proxy, tier, "/bin/true")))
    if done.returncode != 0:
        raise BenchError(f"{tier}: /bin/true failed ({done.returncode}): {done.stderr}")
    return ms


def idle(paths: dict[str, str], proxy: Any, tier: str, execs: int) -> dict[str, Any]:
    """MiB an idle sandbox holds: its memory cgroup's use and its processes' PSS; for gVisor,
    `runsc exec /bin/true` into it too (what a warm gVisor sandbox's exec would cost)."""
    proc = subprocess.Popen([paths["sealgate"], *run_args(proxy, tier, "sleep",
                                                           str(IDLE_SECONDS))],
                            cwd=ROOT, env=sealgate_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        groups: list[Path] = []
        for _ in range(200):  # until the run's groups hold its processes
            groups = [Path(g) for g in glob.glob(f"/sys/fs/cgroup/*/sealgate/run-*-{proc.pid}")
                      + glob.glob(f"/sys/fs/cgroup/sealgate/run-*-{proc.pid}")]
            if any(_members(g) for g in groups):
                break
            time.sleep(0.05)
        else:
            raise BenchError(f"{tier}: the idle sandbox did not start")
        time.sleep(3.0)  # past its start (a gVisor sandbox's are not host processes to see)
        usage, pids = 0, set[int]()
        for group in groups:
            for file in ("memory.current", "memory.usage_in_bytes"):
                with contextlib.suppress(OSError):
                    usage = max(usage, int((group / file).read_text()))
            pids.update(int(p) for p in _members(group))
        pss = sum(rollup(pid)[0] for pid in pids)
        index = int(groups[0].name.split("-")[1])
        return {"cgroup": usage / (1 << 20), "pss": pss / (1 << 20), "processes": len(pids),
                "exec_ms": [runsc_exec(index) for _ in range(execs)] if tier == "gvisor" else []}
    finally:
        proc.kill()
        proc.wait()
        sealgate_cmd(paths, "sandbox", "gc")  # the run killed outright left its link


def runsc_exec(index: int) -> float:
    """ms of `runsc exec` of /bin/true into the gVisor sandbox of link `index`, as the
    sandbox's user, from inside its namespace (the only place runsc reaches it from)."""
    name = gvisor.container(index)
    argv = ["ip", "netns", "exec", name, "runsc", "--root", str(gvisor.place(index) / "state"),
            "exec", "--user", "65534:65534", "--cwd", "/home/sandbox", name, "/bin/true"]
    ms, done = timed(lambda: subprocess.run(argv, capture_output=True, env={"PATH": HOST_PATH},
                                            check=False))
    if done.returncode != 0:
        raise BenchError(f"runsc exec: {done.stderr.decode(errors='replace')}")
    return ms


def _members(group: Path) -> list[str]:
    with contextlib.suppress(OSError):
        return (group / "cgroup.procs").read_text().split()
    return []


def workload(paths: dict[str, str], proxy: Any, tier: str, source: str) -> float:
    done = sealgate_cmd(paths, *run_args(proxy, tier, "python3", "-c", source))
    if done.returncode != 0:
        raise BenchError(f"{tier}: workload failed ({done.returncode}): {done.stderr}")
    return float(done.stdout) * 1000


def daemon_figures(session: Any, paths: dict[str, str], proxy: Any, tier: str,
                   cycles: int) -> dict[str, list[float]]:
    """sandboxd --isolation TIER with a warm pool: create, the first exec of /bin/true and
    later ones (client-side ms), each create from a full pool."""
    daemon = start_daemon(session.setup, paths, proxy, f"sandboxd-{tier}", 2, isolation=tier)
    found: dict[str, list[float]] = {"create": [], "first": [], "later": []}
    try:
        for _ in range(cycles):
            daemon.settle()
            ms, sb = timed(daemon.create)
            found["create"].append(ms)
            found["first"].append(run_true(sb)[0])
            found["later"] += [run_true(sb)[0] for _ in range(4)]
            sb.delete()
    finally:
        daemon.stop(session.setup)
    return found


def measure(paths: dict[str, str], proxy: Any, names: list[str], starts: int,
            repeats: int) -> dict[str, Any]:
    """Every figure, the tiers interleaved sample by sample: whatever else loads the machine
    meanwhile weighs on each tier alike."""
    figures: dict[str, Any] = {t: {"first_instruction_ms": [], "whole_run_ms": [],
                                   "workloads_ms": {name: [] for name in WORKLOADS}}
                               for t in names}
    for tier in names:
        whole_run(paths, proxy, tier)  # warm the page cache of the tier's own programs
    for i in range(starts):
        print(f"{SCRIPT}: start {i + 1}/{starts}", file=sys.stderr)
        for tier in names:
            figures[tier]["first_instruction_ms"].append(first_instruction(paths, proxy, tier))
            figures[tier]["whole_run_ms"].append(whole_run(paths, proxy, tier))
    for i in range(repeats):
        print(f"{SCRIPT}: workloads {i + 1}/{repeats}", file=sys.stderr)
        for name, source in WORKLOADS.items():
            for tier in names:
                figures[tier]["workloads_ms"][name].append(workload(paths, proxy, tier, source))
    for tier in names:
        figures[tier]["idle"] = idle(paths, proxy, tier, starts * 2)
    cli = [timed(lambda: sealgate_cmd(paths, "--version"))[0] for _ in range(starts)]
    return {"tiers": figures, "cli_ms": cli, "loadavg": Path("/proc/loadavg").read_text()}


def draw(result: dict[str, Any], chart: Path) -> None:
    """Latencies per tier (p50, log scale) and each workload's slowdown against the first."""
    figures = result["tiers"]
    names = list(figures)
    fig, (latency, slow) = figure([3, 2], (11, 3.8))
    series = {"start → first instruction": [
        percentile(figures[t]["first_instruction_ms"], 50) for t in names]}
    for key, label in (("create", "sandboxd create"), ("first", "sandboxd first exec"),
                       ("later", "sandboxd later exec")):
        series[label] = [percentile(d[key], 50) if (d := figures[t].get("sandboxd_ms")) else 0.0
                         for t in names]
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        latency.bar([x + i * width for x in range(len(names))], values, width, label=label)
    latency.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(names))], names)
    latency.set_yscale("log")
    latency.set_ylabel("ms, p50 (log)")
    latency.set_title("start and exec by tier")
    latency.legend(fontsize=8)
    base = names[0]
    width = 0.8 / len(names)
    for i, tier in enumerate(names):
        ratios = [statistics.median(figures[tier]["workloads_ms"][w])
                  / statistics.median(figures[base]["workloads_ms"][w]) for w in WORKLOADS]
        slow.bar([x + i * width for x in range(len(WORKLOADS))], ratios, width, label=tier)
    slow.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(WORKLOADS))],
                    [w.split(" (")[0] for w in WORKLOADS])
    slow.set_yscale("log")
    slow.axhline(1.0, color="black", linewidth=0.8)
    slow.set_ylabel(f"time / {base}'s (log)")
    slow.set_title("workload slowdown")
    slow.legend(fontsize=8)
    save(fig, chart)


def document(result: dict[str, Any], meta: dict[str, str], chart: Path) -> str:
    figures, cli = result["tiers"], statistics.median(result["cli_ms"])
    names = list(figures)
    lines = [
        "# Sandbox isolation tiers: start, memory, slowdown", "",
        f"Written by `{meta['command']}` on {meta['date']} ({meta['duration']}). Every figure is "
        "the one-shot `sealgate sandbox run --isolation TIER` on this machine, behind the same "
        "network boundary (namespace, nftables table, name server, registration with the "
        "proxy), with its default limits (1 core of CPU time, 4G memory).", "",
        f"![start, exec and slowdown by tier]({chart.name})", "",
        "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names),
    ]

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for key, label in (("first_instruction_ms", "start → first instruction"),
                       ("whole_run_ms", "whole run of /bin/true (set-up, run, teardown)")):
        row(f"{label}, p50 / p95 ms", [f"{percentile(figures[t][key], 50):.0f} / "
                                       f"{percentile(figures[t][key], 95):.0f}" for t in names])
    row("... less the CLI's own start (p50, ms)",
        [f"{percentile(figures[t]['first_instruction_ms'], 50) - cli:.0f}" for t in names])
    row("idle sandbox: cgroup memory / PSS (MiB)",
        [f"{figures[t]['idle']['cgroup']:.1f} / {figures[t]['idle']['pss']:.1f}" for t in names])
    row("idle sandbox: host processes", [str(figures[t]["idle"]["processes"]) for t in names])
    for key, label in (("create", "sandboxd: create from the warm pool"),
                       ("first", "sandboxd: first exec of /bin/true"),
                       ("later", "sandboxd: later execs of /bin/true")):
        row(f"{label}, p50 / p95 ms",
            [f"{percentile(d[key], 50):.0f} / {percentile(d[key], 95):.0f}"
             if (d := figures[t].get("sandboxd_ms")) else "n/a" for t in names])
    row("exec into a running sandbox (`runsc exec /bin/true`), p50 / p95 ms",
        [f"{percentile(e, 50):.0f} / {percentile(e, 95):.0f}"
         if (e := figures[t]["idle"]["exec_ms"]) else
         "n/a (sandboxd: [performance-sandbox.md](performance-sandbox.md))" for t in names])
    base = names[0]
    for name in WORKLOADS:
        reference = statistics.median(figures[base]["workloads_ms"][name])
        cells = []
        for t in names:
            value = statistics.median(figures[t]["workloads_ms"][name])
            cells.append(f"{value:.0f} ms (x{value / reference:.2f})")
        row(f"{name}, median", cells)
    lines += [
        "", f"The CLI's own start (`sealgate --version`) is {cli:.0f} ms (p50) of every run. "
        f"{len(figures[base]['first_instruction_ms'])} starts per tier; each workload "
        f"{len(figures[base]['workloads_ms'][next(iter(WORKLOADS))])} times, timed inside "
        f"the sandbox, slowdown against {base}; the tiers interleaved sample by sample. Load "
        f"average at the end: {' '.join(result['loadavg'].split()[:3])}.",
        *(["", f"microvm: {result['microvm_accel']}."] if result.get("microvm_accel") else []),
        "", "## Machine", "",
        *(f"- {k}: {v}" for k, v in machine_facts().items()),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if vm.kvm_problem() is not None:  # the microVM under emulation, as the tests run it
        os.environ.setdefault(vm.ACCEL_ENV, "tcg")
    names = [n for n in tiers.NAMES if tiers.available(n) is None]
    for name in tiers.NAMES:
        if (problem := tiers.available(name)) is not None:
            print(f"{SCRIPT}: {name} skipped: {problem}", file=sys.stderr)
    starts, repeats = (5, 1) if args.quick else (20, 3)
    started = time.monotonic()
    with bench_session(SCRIPT, ("sealgate",)) as session:
        paths = dict(session.paths)
        done = sealgate_cmd(paths, "sandbox", "setup", "--range", RANGE, "--gateway", GATEWAY)
        if done.returncode != 0:
            raise BenchError(f"sealgate sandbox setup: {done.stderr}")
        try:
            proxy = start_proxy(session.setup, paths)
            result = measure(paths, proxy, names, starts, repeats)
            if "microvm" in names:
                result["microvm_accel"] = vm.accelerator()[1]
            for tier in names:  # sandboxd serves every tier
                print(f"{SCRIPT}: sandboxd --isolation {tier}", file=sys.stderr)
                result["tiers"][tier]["sandboxd_ms"] = daemon_figures(session, paths, proxy,
                                                                      tier, starts)
        finally:
            session.setup.services.stop_all()
            sealgate_cmd(paths, "sandbox", "teardown", "--range", RANGE, "--gateway", GATEWAY)
    meta = {"command": " ".join(["bench/sandbox_tiers.py", *(argv or sys.argv[1:])]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "duration": f"{(time.monotonic() - started) / 60:.1f} min"}
    wrote = publish(args.docs, "performance-sandbox-tiers", lambda c: draw(result, c),
                    lambda c: document(result, meta, c))
    print(json.dumps(result, indent=1) if args.json else
          (args.docs / "performance-sandbox-tiers.md").read_text())
    print(wrote, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
