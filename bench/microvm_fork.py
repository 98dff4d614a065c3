"""fork on the microVM tier (#24): copies of a running sandbox from an image, resumed from one
memory snapshot of it, beside a cold create of the same image in the same run (what a copy
costs without fork: a boot and the image's root made) and the anchors' published figures.

Each round takes a debian sandbox from the warm pool, writes a file and leaves a process
running in it, then calls fork(n) for each n: the call's time until n copies answer (the save,
each copy's restore, renewal and registration), and each copy's first command after. The
baseline: a create of debian with no warm pool (cold: the daemon runs with `--pool 0`) to its
first command.
The accelerator is KVM where it runs Debian's kernel, else emulation (TCG), as the document
says.

    flock /tmp/sealgate-sandbox.lock .venv/bin/python bench/microvm_fork.py [--rounds 3]

Writes docs/performance-microvm-fork.md and .png (`--docs DIR` elsewhere); `--json` prints
the figures as one JSON object on stdout instead of the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from microvm_start import qemu_version
from report import figure, finish, machine_facts, run_meta, save
from rounds import percentile
from sandbox_images import layout, run_ok
from sandbox_start import (
    SANDBOX,
    Daemon,
    run_true,
    sealgate_cmd,
    start_daemon,
    start_proxy,
    tear_down,
    timed,
)
from services import ROOT, BenchError
from session import bench_session

from sealgate.sandbox.clients.client import Sandbox
from sealgate.sandbox.tiers.microvm import vm

SCRIPT = "microvm_fork"
# Its own range, gateway and uid base (the tests', sandbox_start's, sandbox_images',
# sandbox_api's and sandbox_ab's are 10.215-10.223 and 10.233, 3100000-3600000).
RANGE, GATEWAY = "10.224.0.0/16", "10.224.255.254"
NET = (RANGE, GATEWAY, 3_700_000)
FORKS = (1, 4, 10)
# The anchors (../shared/research): E2B, Daytona and mitos fork a sandbox in 100-300 ms;
# Firecracker resumes a snapshot in under 8 ms (both on KVM).
ANCHOR_FORK_MS = (100.0, 300.0)
ANCHOR_RESUME_MS = 8.0


def create(daemon: Daemon, image: str) -> Sandbox:
    return Sandbox.create(SANDBOX, image=image, daemon=str(daemon.socket), call_timeout=600)


def measure(daemon: Daemon, rounds: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        found.setdefault(key, []).append(value)

    for i in range(rounds):
        print(f"{SCRIPT}: round {i + 1}/{rounds}", file=sys.stderr)
        daemon.settle(600)
        ms, cold = timed(lambda: create(daemon, "debian"))
        try:
            add("cold: create", ms)
            add("cold: create → first exec", ms + run_true(cold)[0])
        finally:
            cold.delete()
        daemon.settle(600)
        source = create(daemon, "debian")  # cold as well: no pool
        try:
            run_ok(source, ["sh", "-c", "echo kept > /workspace/kept"])
            source.start(["sleep", "3600"])
            for n in FORKS:
                ms, copies = timed(lambda n=n, sb=source: sb.fork(n, call_timeout=600))
                try:
                    if len(copies) != n:
                        raise BenchError(f"fork({n}) gave {len(copies)} sandboxes")
                    add(f"fork({n}): call", ms)
                    for copy in copies:
                        first = run_true(copy)[0]
                        add(f"fork({n}): a copy's first exec", first)
                    if run_ok(copies[-1], ["cat", "/workspace/kept"]) != b"kept\n":
                        raise BenchError("a copy lacks the source's file")
                finally:
                    for copy in copies:
                        copy.delete()
        finally:
            source.delete()
    return found


def draw(found: dict[str, list[float]], accel: str, chart: Path) -> None:
    fig, (ax,) = figure([1], (11, 3.8))
    keys = ["cold: create → first exec", *(f"fork({n}): call" for n in FORKS)]
    labels = ["cold create\n→ first exec", *(f"fork({n})\n(all copies)" for n in FORKS)]
    p50 = [percentile(found[k], 50) for k in keys]
    p95 = [percentile(found[k], 95) for k in keys]
    xs = range(len(keys))
    ax.bar([x - 0.2 for x in xs], p50, width=0.4, label="p50", color="#4c72b0")
    ax.bar([x + 0.2 for x in xs], p95, width=0.4, label="p95", color="#dd8452")
    ax.axhspan(*ANCHOR_FORK_MS, color="#55a868", alpha=0.2,
               label="E2B / Daytona / mitos fork (KVM)")
    ax.axhline(ANCHOR_RESUME_MS, color="#c44e52", linestyle=":", linewidth=1,
               label="Firecracker resume (KVM)")
    ax.set_yscale("log")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("ms (log)")
    ax.set_title(f"microVM fork ({accel}), debian image")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save(fig, chart)


def render(found: dict[str, list[float]], meta: dict[str, str], accel: str, why: str,
           chart: Path) -> str:
    cold = percentile(found["cold: create → first exec"], 50)
    rows = []
    for key, values in found.items():
        ratio = (f"{percentile(values, 50) / cold:.2f}x" if key.endswith(": call")
                 else "")
        rows.append(f"| {key} | {len(values)} | {percentile(values, 50):.0f} | "
                    f"{percentile(values, 95):.0f} | {ratio} |")
    per_copy = {n: percentile(found[f"fork({n}): call"], 50) / n for n in FORKS}
    facts = "\n".join(f"| {k} | {v} |" for k, v in meta.items() if k != "command")
    return f"""# microVM fork: performance

Generated by `{meta['command']}` ({SCRIPT}.py); the chart is [{chart.name}]({chart.name}).

**Accelerator: {accel}** ({why}).

| run | |
| --- | --- |
{facts}

## fork(n) against a cold create of the same image (ms, client side)

| what | samples | p50 | p95 | p50 / cold create → first exec |
| --- | --- | --- | --- | --- |
{chr(10).join(rows)}

Per copy, fork(n)'s p50 over n: {", ".join(f"fork({n}) {v:.0f} ms" for n, v in per_copy.items())}.
The anchors (KVM): E2B, Daytona and mitos fork in
{ANCHOR_FORK_MS[0]:.0f}-{ANCHOR_FORK_MS[1]:.0f} ms, Firecracker resumes a snapshot in under
{ANCHOR_RESUME_MS:.0f} ms.

![microVM fork]({chart.name})
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print(f"{SCRIPT}: needs root (namespaces, nftables, cgroups, QEMU's taps)",
              file=sys.stderr)
        return 2
    if vm.kvm_problem() is not None:
        os.environ.setdefault(vm.ACCEL_ENV, "tcg")
    accel, why = vm.accelerator()
    if accel is None:
        print(f"{SCRIPT}: cannot run a microVM here: {why}", file=sys.stderr)
        return 2
    try:
        source = layout("debian")
    except BenchError as exc:
        print(f"{SCRIPT}: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    with bench_session(SCRIPT, ("sealgate",)) as session:
        setup, paths = session.setup, dict(session.paths)
        store = setup.work / "images"
        done = sealgate_cmd(paths, "image", "import", str(source), "--name", "debian",
                            "--store", str(store), timeout=900)
        if done.returncode != 0:
            raise BenchError(f"sealgate image import: {done.stderr[-2000:]}")
        done = sealgate_cmd(paths, "sandbox", "setup", "--range", RANGE, "--gateway", GATEWAY)
        if done.returncode != 0:
            raise BenchError(f"sealgate sandbox setup: {done.stderr}")
        daemons: list[Daemon] = []
        try:
            proxy = start_proxy(setup, paths, GATEWAY)
            daemons.append(start_daemon(
                setup, paths, proxy, "sandboxd-microvm", 0, isolation="microvm", net=NET,
                extra=["--images", str(store), "--no-selftest"]))
            found = measure(daemons[-1], args.rounds)
        finally:
            tear_down(setup, paths, daemons, (RANGE, GATEWAY))
    meta = {**run_meta(f"{SCRIPT}.py", sys.argv[1:] if argv is None else argv, started, False,
                       locked=True), **machine_facts(), "QEMU": qemu_version()}
    summary = {key: {"p50": percentile(v, 50), "p95": percentile(v, 95), "n": len(v)}
               for key, v in found.items()}
    return finish(args.docs, "performance-microvm-fork", lambda c: draw(found, accel, c),
                  lambda c: render(found, meta, accel, why, c),
                  machine={"accel": accel, **summary} if args.json else None,
                  console=json.dumps(summary, indent=1), notes=[])


if __name__ == "__main__":
    sys.exit(main())
