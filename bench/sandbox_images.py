"""Sandboxes started from OCI images (issue #24) beside today's host-root warm pool, in one run:
warm and cold creates of busybox and debian, first exec, memory per sandbox with many alive
sharing an image, `sealgate image import`, a snapshot of 100 MiB and a create from it, pause
and resume.

Writes docs/performance-sandbox-images.md and .png (`--docs DIR` elsewhere); `--json` prints
every figure as one JSON object on stdout instead of the table. Needs the test images
(`scripts/test-images`, under var/images-src/).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from report import figure, finish, memory_tables, ms, run_meta, save
from rounds import percentile
from sandbox_start import (
    COMMAND,
    HOST_PATH,
    SANDBOX,
    Daemon,
    Figures,
    MiB,
    Progress,
    Target,
    concurrent,
    facts,
    run_true,
    sealgate_cmd,
    spawn_wait,
    start_daemon,
    start_proxy,
    tear_down,
    timed,
)
from services import ROOT, BenchError
from session import bench_session

from sealgate.sandbox.clients.client import DaemonError, Sandbox

SCRIPT = "sandbox_images"
# Its own range, gateway and uid base: the tests use 10.216/16 and 3100000, sandbox_start.py
# 10.217/16 and 3200000.
RANGE, GATEWAY = "10.218.0.0/16", "10.218.255.254"
UID_BASE = 3_300_000
NET = (RANGE, GATEWAY, UID_BASE)
POOL = 4  # warm slots of each kind: the host root, busybox, debian
IMAGES = ("busybox", "debian")
KINDS: tuple[tuple[str, str | None], ...] = (("host root", None), ("busybox", "busybox"),
                                             ("debian", "debian"))
MEMORY_IMAGE = "debian"  # the many alive share this image
BIG = "head -c 100M /dev/urandom > /workspace/big"
BIG_BYTES = 100 * MiB
DIR_ENV = "SEALGATE_TEST_IMAGES_DIR"  # where scripts/test-images writes, as it reads it


@dataclass(frozen=True)
class Plan:
    bare: int  # fork/execs of each kind
    warm: int  # creates of each kind from the warm pools
    cold: int  # creates of each kind with no pool
    imports: int  # of the debian layout, each into a fresh store
    snapshots: int
    pauses: int  # pause + resume of each kind
    concurrent: int  # debian sandboxes alive at once


FULL = Plan(bare=300, warm=100, cold=30, imports=3, snapshots=5, pauses=50, concurrent=200)
QUICK = Plan(bare=100, warm=20, cold=8, imports=1, snapshots=2, pauses=20, concurrent=50)


def layout(name: str) -> Path:
    base = Path(os.environ.get(DIR_ENV, str(ROOT / "var" / "images-src")))
    path = base / name
    if not (path / "index.json").is_file():
        why = base / f"{name}.why"
        reason = why.read_text().strip() if why.is_file() else "run scripts/test-images"
        raise BenchError(f"no {name} image at {path}: {reason}")
    return path.resolve()


def du(path: Path, *apparent: str) -> int:
    done = subprocess.run(["du", "-s", "-B1", *apparent, str(path)], capture_output=True,
                          text=True, timeout=300, check=True)
    return int(done.stdout.split()[0])


def create(daemon: Daemon, image: str | None) -> Sandbox:
    return Sandbox.create(SANDBOX, image=image, daemon=str(daemon.socket), call_timeout=120)


def run_ok(sb: Sandbox, argv: list[str]) -> bytes:
    result = sb.run(argv, timeout=120)
    if result.exit_code != 0:
        raise BenchError(f"{argv} in {sb.id}: {result}")
    return result.stdout


# -- the phases -----------------------------------------------------------------------------


def bare(fig: Figures, plan: Plan, progress: Progress) -> None:
    progress.begin("bare fork/exec")
    env = {"PATH": HOST_PATH}
    for i in range(plan.bare):
        fig.add("fork/exec: posix_spawn + waitpid", timed(lambda: spawn_wait(env))[0])
        fig.add("fork/exec: subprocess.run",
                timed(functools.partial(subprocess.run, COMMAND, env=env, check=True))[0])
        progress.show(f"{i + 1}/{plan.bare}")


def imports(fig: Figures, plan: Plan, paths: dict[str, str], store: Path, work: Path,
            progress: Progress) -> None:
    """debian into the daemons' store first (a fresh one), then busybox beside it; then more
    imports of debian, each into a fresh store of its own, measured and removed."""
    progress.begin("sealgate image import")
    source = layout("debian")
    fig.values["debian layout on disk MiB"] = du(source) / MiB
    for i in range(plan.imports):
        where = store if i == 0 else work / f"import-{i}" / "images"
        took, done = timed(functools.partial(
            sealgate_cmd, paths, "image", "import", str(source), "--name", "debian", "--store",
            str(where), timeout=900))
        if done.returncode != 0:
            raise BenchError(f"sealgate image import debian: {done.stderr[-2000:]}")
        fig.add("import debian: seconds", took / 1000)
        fig.add("import debian: store disk used MiB (du)", du(where) / MiB)
        fig.add("import debian: store apparent size MiB (du --apparent-size)",
                du(where, "--apparent-size") / MiB)
        if where != store:
            shutil.rmtree(where.parent)
        progress.show(f"{i + 1}/{plan.imports}", force=True)
    took, done = timed(lambda: sealgate_cmd(paths, "image", "import", str(layout("busybox")),
                                            "--name", "busybox", "--store", str(store)))
    if done.returncode != 0:
        raise BenchError(f"sealgate image import busybox: {done.stderr[-2000:]}")
    fig.values["import busybox: seconds"] = took / 1000
    fig.values["store with debian and busybox: disk used MiB (du)"] = du(store) / MiB


def cold(fig: Figures, plan: Plan, daemon: Daemon, progress: Progress) -> None:
    """--pool 0: every create prepares its slot, the image's overlay included, there and then."""
    progress.begin("cold create (--pool 0)")
    for i in range(plan.cold):
        for kind, image in KINDS[i % 3:] + KINDS[:i % 3]:
            daemon.settle()
            start = time.perf_counter()
            sb = create(daemon, image)
            created = time.perf_counter()
            run_true(sb)
            answered = time.perf_counter()
            fig.add(f"cold {kind}: create → first exec", (answered - start) * 1000)
            fig.add(f"cold {kind}: create", (created - start) * 1000)
            fig.add(f"cold {kind}: first exec", (answered - created) * 1000)
            sb.delete()
        progress.show(f"{i + 1}/{plan.cold}")


def snapshots(fig: Figures, plan: Plan, daemon: Daemon, progress: Progress) -> None:
    """A debian sandbox writes 100 MiB to /workspace; sb.snapshot(); a create from the snapshot
    (no pool of it: cold) to its first exec; then the file is checked in it."""
    progress.begin("snapshot, create from it")
    for i in range(plan.snapshots):
        daemon.settle()
        sb = create(daemon, "debian")
        try:
            fig.add("snapshot: write 100 MiB in the sandbox",
                    timed(functools.partial(run_ok, sb, ["sh", "-c", BIG]))[0])
            took, made = timed(functools.partial(sb.snapshot, f"bench-snapshot-{i}"))
            fig.add("snapshot: sb.snapshot() of 100 MiB written", took)
        finally:
            sb.delete()
        daemon.settle()
        start = time.perf_counter()
        copy = create(daemon, str(made["name"]))
        created = time.perf_counter()
        try:
            run_true(copy)
            answered = time.perf_counter()
            fig.add("from snapshot: create → first exec", (answered - start) * 1000)
            fig.add("from snapshot: create", (created - start) * 1000)
            size = run_ok(copy, ["stat", "-c", "%s", "/workspace/big"])
            if int(size) != BIG_BYTES:
                raise BenchError(f"the snapshot's /workspace/big has {size!r} bytes")
        finally:
            copy.delete()
        progress.show(f"{i + 1}/{plan.snapshots}", force=True)


def warm(fig: Figures, plan: Plan, daemon: Daemon, progress: Progress) -> None:
    """From full pools, the kinds in turn. Even samples time create and its first exec back to
    back, the refill of the pool running meanwhile (as a caller sees it); odd ones await the
    refill between them (as bench/sandbox_start.py does), so the exec has the machine alone."""
    progress.begin("warm create, first exec")
    ids: dict[str, str] = {}
    for i in range(plan.warm):
        for kind, image in KINDS[i % 3:] + KINDS[:i % 3]:
            daemon.settle()
            start = time.perf_counter()
            sb = create(daemon, image)
            created = time.perf_counter()
            ids[sb.id] = kind
            fig.add(f"warm {kind}: create", (created - start) * 1000)
            if i % 2 == 0:
                run_true(sb)
                answered = time.perf_counter()
                fig.add(f"warm {kind}: create → first exec", (answered - start) * 1000)
                fig.add(f"warm {kind}: first exec, refill running", (answered - created) * 1000)
            else:
                daemon.settle()
                fig.add(f"warm {kind}: first exec, pool refilled first", run_true(sb)[0])
                fig.add(f"warm {kind}: later exec", run_true(sb)[0])
            fig.add(f"warm {kind}: delete", timed(sb.delete)[0])
        progress.show(f"{i + 1}/{plan.warm}")
    flags = daemon.warm_flags()
    for kind, _ in KINDS:
        fig.values[f"warm {kind}: creates that found the pool empty"] = sum(
            1 for ident, k in ids.items() if k == kind and not flags.get(ident, True))


def pauses(fig: Figures, plan: Plan, daemon: Daemon, progress: Progress) -> None:
    """pause then resume an idle sandbox of each kind, over and over; an exec after."""
    progress.begin("pause, resume")
    daemon.settle()
    alive = [(kind, create(daemon, image)) for kind, image in KINDS]
    try:
        daemon.settle()
        for i in range(plan.pauses):
            for kind, sb in alive:
                fig.add(f"pause ({kind})", timed(sb.pause)[0])
                if not sb.info.get("paused"):
                    raise BenchError(f"{sb.id} not paused: {sb.info}")
                fig.add(f"resume ({kind})", timed(sb.resume)[0])
            progress.show(f"{i + 1}/{plan.pauses}")
        for _, sb in alive:
            run_true(sb)
    finally:
        for _, sb in alive:
            with contextlib.suppress(DaemonError):
                sb.delete()


# -- the report -----------------------------------------------------------------------------


def targets(fig: Figures) -> list[Target]:
    bare = fig.p50("fork/exec: subprocess.run")
    host = fig.p50("warm host root: create → first exec")
    out = []
    for image in IMAGES:
        p50 = fig.p50(f"warm {image}: create → first exec")
        out += [Target(f"warm create → first exec p50, {image}", "≤ 20 ms", p50, "ms", p50 <= 20),
                Target(f"warm create → first exec p50, {image}, against the host root's "
                       f"({ms(host)} ms): the difference", "≤ 0 ms", p50 - host, "ms", p50 <= host)]
    for image in IMAGES:
        p50 = fig.p50(f"cold {image}: create → first exec")
        out.append(Target(f"cold create → first exec p50, {image} (no pool of it)", "≤ 150 ms",
                          p50, "ms", p50 <= 150))
    for kind, _ in KINDS:
        for how in ("pool refilled first", "refill running"):
            over = fig.p50(f"warm {kind}: first exec, {how}") - bare
            out.append(Target(f"first exec p50 over bare fork/exec (subprocess.run), {kind}, "
                              f"{how}", "≤ 5 ms", over, "ms", over <= 5))
    n = int(fig.values.get("concurrent sandboxes", 0))
    mem = fig.values.get("memory/sandbox: host used growth MiB", float("nan"))
    out.append(Target(f"host memory used per sandbox, {n} {MEMORY_IMAGE} sandboxes alive "
                      "(MemTotal - MemAvailable growth / n)", "≤ 10 MiB", mem, "MiB", mem <= 10))
    snap = fig.p50("snapshot: sb.snapshot() of 100 MiB written")
    out.append(Target("sb.snapshot() p50, 100 MiB in the upper", "≤ 1 s", snap, "ms",
                      snap <= 1000))
    after = fig.p50("from snapshot: create → first exec")
    out.append(Target("create from the snapshot → first exec p50 (cold)", "≤ 150 ms", after,
                      "ms", after <= 150))
    for step in ("pause", "resume"):
        p50 = percentile([v for name, vs in fig.samples.items() if name.startswith(f"{step} (")
                          for v in vs], 50)
        out.append(Target(f"{step} p50 (all kinds)", "≤ 20 ms", p50, "ms", p50 <= 20))
    return out


def _v(value: float, unit: str = "") -> str:
    """A figure: whole numbers (counts) as such, the rest as report.ms does."""
    text = f"{value:.0f}" if value == value and value == int(value) else ms(value)
    return f"{text} {unit}".rstrip()


# The latency table's groups, in order: a sample goes to the first group its name starts with.
ORDER = ("fork/exec", "warm host root", "warm busybox", "warm debian", "cold host root",
         "cold busybox", "cold debian", "snapshot", "from snapshot", "pause", "resume")


def latency_rows(fig: Figures) -> list[tuple[str, int, float, float]]:
    def group(name: str) -> int:
        return next((i for i, p in enumerate(ORDER) if name.startswith(p + " ")
                     or name.startswith(p + ":")), len(ORDER))

    names = sorted((n for n in fig.samples if not n.startswith("import ")), key=group)
    return [(n, len(fig.samples[n]), fig.p50(n), fig.p95(n)) for n in names]


def console(fig: Figures) -> str:
    lines = [f"{'measurement':<58}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}"]
    lines += [f"{name[:57]:<58}{n:>6}{ms(p50):>10}{ms(p95):>10}"
              for name, n, p50, p95 in latency_rows(fig)]
    lines.append("")
    lines += [f"{name[:57]:<58}{len(v):>6}{ms(percentile(v, 50)):>10}"
              for name, v in fig.samples.items() if name.startswith("import ")]
    lines += [f"{k[:57]:<58}{_v(v):>16}" for k, v in fig.values.items()]
    lines.append("")
    lines += [f"target {t.label}: {_v(t.value, t.unit)} (needs {t.needs}) "
              f"{'met' if t.met else 'NOT met'}" for t in targets(fig)]
    lines += fig.notes
    return "\n".join(lines)


def document(fig: Figures, meta: dict[str, str], plan: Plan, chart: Path) -> str:
    n = int(fig.values.get("concurrent sandboxes", 0))
    imp = fig.samples.get("import debian: seconds", [])
    out = [
        "# Sandboxes from OCI images: warm and cold creates, memory, import, snapshot, pause",
        "",
        "Generated by `bench/sandbox_images.py` (method: `bench/README.md`). Do not edit by hand "
        "above the hand-written part; run the command again.",
        "",
        f"* **Command:** `{meta['command']}` (as root; the runs on this machine take "
        "`flock /tmp/sealgate-sandbox.lock` around it, other sandbox tests share the machine)",
        f"* **Date:** {meta['date']} ({meta['mode']}, {meta['duration']} in all)",
        "* **Images:** the test images of `scripts/test-images` (OCI layouts under "
        "var/images-src/): busybox (one layer) and debian (bookworm minbase with python3, two "
        "layers), imported by `sealgate image import` into a fresh store of the run's own.",
        f"* **Daemons:** `sealgate sandboxd` on the bubblewrap tier (a `sealgate proxy` on the "
        f"gateway {GATEWAY} beside it, range {RANGE}, uid base {UID_BASE}), driven through "
        "`sealgate.sandbox.clients.client` over its unix socket: first `--pool 0 --images STORE` "
        f"(cold creates; the snapshots), then `--pool {POOL} --pool busybox={POOL} --pool "
        f"debian={POOL} --images STORE` (warm creates of today's host root and of each image, "
        f"in turn; pause and resume; {n} debian sandboxes alive at once).",
        f"* **Samples:** {plan.warm} warm creates of each kind (the pool refilled before each; "
        "even ones timed to the first `/bin/true` answered with the refill running, odd ones "
        "with the refill awaited between create and exec, as in performance-sandbox.md), "
        f"{plan.cold} cold creates of each kind, {plan.bare} bare fork/execs, {plan.imports} "
        f"import(s) of debian, {plan.snapshots} snapshots, {plan.pauses} pause + resume of each "
        f"kind, {n} sandboxes alive. Times are wall-clock at the client; p50 and p95 linear "
        "between samples. Nothing is pinned: the client, the daemon (its refills in threads) "
        "and the sandboxes share the cores.",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in facts().items()],
        "",
        "## Targets (issue #24)",
        "",
        "| target | needs | measured | |",
        "|---|---|---|---|",
        *[f"| {t.label} | {t.needs} | {_v(t.value, t.unit)} | "
          f"{'**met**' if t.met else '**not met**'} |" for t in targets(fig)],
        "",
        "Not measured: gVisor checkpoint/restore and fork of a running sandbox are not built "
        "yet (issue #24 names them); `pause`/`resume` here is the cgroup freezer, which keeps "
        "the processes in memory, and a snapshot is of the filesystem only.",
        "",
        f"![latency by kind, memory per sandbox]({chart.name})",
        "",
        "## Latency",
        "",
        "| measurement | n | p50 ms | p95 ms |",
        "|---|---|---|---|",
        *[f"| {name} | {count} | {ms(p50)} | {ms(p95)} |"
          for name, count, p50, p95 in latency_rows(fig)],
        "",
        "`create → first exec` is one span at the client: the create's answer, then `/bin/true` "
        "run in the sandbox to its exit status. Creates that found their pool empty (and so "
        "were cold) are counted under Notes.",
        "",
        "## `sealgate image import` of the debian layout, into a fresh store",
        "",
        "| | |",
        "|---|---|",
        f"| imports | {len(imp)} |",
        f"| time, p50 (min - max) | {ms(percentile(imp, 50))} s "
        f"({ms(min(imp, default=float('nan')))} - {ms(max(imp, default=float('nan')))}) |",
        f"| store's disk used (`du -s -B1`) | "
        f"{ms(percentile(fig.samples.get('import debian: store disk used MiB (du)', []), 50))}"
        " MiB |",
        "| store's apparent size (`du --apparent-size`) | "
        f"{ms(percentile(fig.samples.get('import debian: store apparent size MiB (du --apparent-size)', []), 50))} MiB |",  # noqa: E501
        f"| the OCI layout imported (compressed layers) | "
        f"{ms(fig.values.get('debian layout on disk MiB', float('nan')))} MiB |",
        f"| busybox imported beside it | "
        f"{ms(fig.values.get('import busybox: seconds', float('nan')))} s |",
        f"| the daemons' store, both images | "
        f"{ms(fig.values.get('store with debian and busybox: disk used MiB (du)', float('nan')))}"
        " MiB |",
        "",
        "The layout is read from the page cache after the first import; the store is on the "
        "machine's disk (the run's temporary directory).",
        "",
        f"## {n} {MEMORY_IMAGE} sandboxes alive at once, idle",
        "",
        *memory_tables(fig.values, _v),
        "",
        "Host used growth (the target's figure): MemTotal - MemAvailable with them all alive, "
        "less before the first create, over their number: it counts what no process owns too "
        "(namespaces, veths, nftables tables, the overlays and their tmpfs), and anything else "
        "the machine did meanwhile. Processes: those in each sandbox's cgroups, PSS from "
        "`/proc/<pid>/smaps_rollup`; cgroup use: the sandbox's memory group (with page cache "
        "it was charged); daemon growth: its PSS and RSS growth over their number. Every "
        "sandbox runs one `/bin/true` before the reading.",
    ]
    if fig.notes:
        out += ["", "## Notes", "", *[f"* {note}" for note in fig.notes]]
    return "\n".join(out) + "\n"


def draw(fig: Figures, path: Path) -> None:
    canvas, (lat, mem) = figure([2.2, 1], (16, 7))
    rows = [r for r in latency_rows(fig) if "first exec" in r[0] or r[0].startswith(
        ("fork/exec: subprocess", "pause (", "resume (", "snapshot: sb.snapshot"))]
    ys = range(len(rows))
    colours = [("tab:gray" if name.startswith("fork") else "tab:blue" if name.startswith("warm")
                else "tab:purple" if name.startswith("cold") else "tab:green")
               for name, *_ in rows]
    lat.barh(ys, [r[2] for r in rows], color=colours, alpha=0.8)
    lat.errorbar([r[3] for r in rows], ys, fmt="|", color="black", markersize=8, label="p95")
    lat.set_yticks(list(ys), [r[0] for r in rows], fontsize=7)
    lat.invert_yaxis()
    lat.set_xscale("log")
    for x, label in ((20, "warm create, pause, resume target"), (150, "cold create target"),
                     (1000, "snapshot target")):
        lat.axvline(x, linestyle="--", linewidth=1, color="tab:red")
        lat.annotate(label, (x, -0.6), rotation=90, fontsize=7, va="top", ha="right")
    lat.set_xlabel("ms, log scale (bar p50, tick p95)")
    lat.set_title("sandboxes from images beside the host root: latency", fontsize=10)
    lat.grid(axis="x", which="both", alpha=0.3)
    bars = [("host used\ngrowth", fig.values.get("memory/sandbox: host used growth MiB", 0.0)),
            ("processes\nPSS", fig.values.get("memory/sandbox: processes PSS MiB", 0.0)),
            ("cgroup\nuse", fig.values.get("memory/sandbox: cgroup use MiB", 0.0))]
    mem.bar(range(len(bars)), [max(0.0, v) for _, v in bars],
            color=["tab:brown", "tab:blue", "tab:olive"])
    mem.axhline(10, linestyle="--", color="tab:red", label="target 10 MiB (host used growth)")
    mem.set_xticks(list(range(len(bars))), [b for b, _ in bars], fontsize=8)
    mem.set_ylabel("MiB per sandbox")
    mem.set_title(f"idle memory per sandbox, {int(fig.values.get('concurrent sandboxes', 0))} "
                  f"{MEMORY_IMAGE} alive", fontsize=10)
    mem.legend(fontsize=7)
    save(canvas, path)


# -- main -----------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true",
                        help="fewer samples, 50 sandboxes alive at once (~2 min)")
    parser.add_argument("--concurrent", type=int,
                        help="sandboxes alive at once (default 200, quick 50)")
    parser.add_argument("--json", action="store_true",
                        help="print the figures as one JSON object on stdout, not the table")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs",
                        help="where performance-sandbox-images.md and .png go (default docs/)")
    args = parser.parse_args(argv)
    if args.concurrent is not None and not 1 <= args.concurrent <= 200:
        parser.error("--concurrent 1..200")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    plan = QUICK if args.quick else FULL
    if args.concurrent is not None:
        plan = Plan(**{**asdict(plan), "concurrent": args.concurrent})
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
    try:
        for name in IMAGES:
            layout(name)
    except BenchError as exc:
        print(f"{SCRIPT}: {exc}", file=sys.stderr)
        return 2
    fig = Figures()
    progress = Progress({
        "bare fork/exec": plan.bare * 0.004, "sealgate image import": plan.imports * 12 + 2,
        "cold create (--pool 0)": plan.cold * 3 * 0.3,
        "snapshot, create from it": plan.snapshots * 3,
        "warm create, first exec": plan.warm * 3 * 0.5, "pause, resume": plan.pauses * 3 * 0.03,
        f"{plan.concurrent} sandboxes alive": plan.concurrent * 0.4 + 12,
    })
    started = time.monotonic()
    with bench_session(SCRIPT, ("sealgate",)) as session:
        setup, paths = session.setup, dict(session.paths)
        store = setup.work / "images"
        daemons: list[Daemon] = []
        done = sealgate_cmd(paths, "sandbox", "setup", "--range", RANGE, "--gateway", GATEWAY)
        if done.returncode != 0:
            raise BenchError(f"sealgate sandbox setup: {done.stderr}")
        try:
            bare(fig, plan, progress)
            imports(fig, plan, paths, store, setup.work, progress)
            progress.note(f"starting sealgate proxy on {GATEWAY} in {setup.work} ...")
            proxy = start_proxy(setup, paths, GATEWAY)
            images = ["--images", str(store)]

            daemons.append(start_daemon(setup, paths, proxy, "sandboxd-cold", 0, net=NET,
                                        extra=images))
            cold(fig, plan, daemons[-1], progress)
            snapshots(fig, plan, daemons[-1], progress)
            daemons.pop().stop(setup)

            pools = [flag for name in IMAGES for flag in ("--pool", f"{name}={POOL}")]
            daemons.append(start_daemon(setup, paths, proxy, "sandboxd", POOL, net=NET,
                                        extra=[*images, *pools]))
            daemons[-1].pool = POOL * len(KINDS)  # settle() waits for every pool to be full
            warm(fig, plan, daemons[-1], progress)
            pauses(fig, plan, daemons[-1], progress)
            concurrent(fig, plan.concurrent, daemons[-1], progress,
                       functools.partial(create, daemons[-1], MEMORY_IMAGE), UID_BASE)
            daemons.pop().stop(setup)
        finally:
            tear_down(setup, paths, daemons, (RANGE, GATEWAY))
    for kind, _ in KINDS:
        empty = fig.values.get(f"warm {kind}: creates that found the pool empty", 0)
        if empty:
            fig.notes.append(f"warm {kind}: {empty:.0f} of {plan.warm} creates found the pool "
                             "empty (cold), counted in its figures")
    progress.note(f"done in {(time.monotonic() - started) / 60:.1f} min")

    meta = run_meta("sandbox_images.py", argv if argv is not None else sys.argv[1:], started,
                    args.quick)
    machine = {"meta": meta, "plan": asdict(plan), **fig.summary(),
               "targets": [asdict(t) for t in targets(fig)]}
    return finish(args.docs, "performance-sandbox-images", lambda chart: draw(fig, chart),
                  lambda chart: document(fig, meta, plan, chart),
                  machine=machine if args.json else None, console=console(fig),
                  notes=fig.notes)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
