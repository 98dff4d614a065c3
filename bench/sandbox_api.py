"""Background processes, terminals and ports (issue #25), each beside a baseline in the same
run: a background start against a foreground `true`; a terminal opened to its first byte
against a `true` run to its exit; a sandbox's HTTP server reached through the
daemon (`sb.port`) against a direct connection made in the sandbox's network namespace; an
exec's cost with background processes running against none.

Writes docs/performance-sandbox-api.md and .png (`--docs DIR` elsewhere); `--json` prints every
figure as one JSON object on stdout instead of the table.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from report import figure, finish, ms, run_meta, save
from sandbox_start import (
    HOST_PATH,
    SANDBOX,
    Daemon,
    Figures,
    MiB,
    Progress,
    facts,
    sealgate_cmd,
    start_daemon,
    start_proxy,
    tear_down,
    timed,
)
from services import ROOT, BenchError
from session import bench_session

from sealgate.sandbox.clients.client import DaemonError, Sandbox, Terminal
from sealgate.sandbox.host.nsocket import socket_in

SCRIPT = "sandbox_api"
# Its own range, gateway and uid base: the tests use 10.215-10.217, 10.219, 10.223, 10.233 and
# 3100000; sandbox_start.py 10.217/16 and 3200000; sandbox_images.py 10.218/16 and 3300000.
RANGE, GATEWAY = "10.220.0.0/16", "10.220.255.254"
UID_BASE = 3_400_000
NET = (RANGE, GATEWAY, UID_BASE)
PORT = 8000
SERVER = ["python3", "-m", "http.server", str(PORT), "--bind", "127.0.0.1", "--directory",
          "/workspace"]
SMALL, BIG = 16, 64 * MiB
FILES = f"printf 0123456789abcdef > /workspace/small && head -c {BIG} /dev/urandom > /workspace/big"
CURL = "through the daemon, read by curl"
BACKGROUND = 4  # sleeps running for the exec-cost comparison
ROUND = 10  # samples of each side in a round, the sides alternating


@dataclass(frozen=True)
class Plan:
    starts: int  # background starts, and as many foreground `true`s interleaved
    execs: int  # `true`s with none and with BACKGROUND sleeps running, each
    small: int  # requests for the 16-byte file, through the daemon and direct, each
    big: int  # transfers of the 64 MiB file, each way
    ptys: int  # terminals opened to their first byte, and as many `true`s interleaved


FULL = Plan(starts=200, execs=200, small=1000, big=10, ptys=200)
QUICK = Plan(starts=50, execs=50, small=200, big=3, ptys=50)


def run_true(sb: Sandbox) -> float:
    took, result = timed(lambda: sb.run(["true"], timeout=60))
    if result.exit_code != 0:
        raise BenchError(f"true in {sb.id}: {result}")
    return took


def starts(fig: Figures, plan: Plan, sb: Sandbox, progress: Progress) -> None:
    """A foreground `true` to its exit, then `sleep 60` started in the background (timed to its
    201), then killed and awaited (not timed), over and over."""
    progress.begin("background start")
    for i in range(plan.starts):
        fig.add("foreground: sb.run(['true']) to its exit", run_true(sb))
        took, proc = timed(lambda: sb.start(["sleep", "60"]))
        fig.add("background: sb.start(['sleep', '60']) answered", took)
        proc.kill()
        proc.wait(call_timeout=60)
        progress.show(f"{i + 1}/{plan.starts}")


def execs(fig: Figures, plan: Plan, sb: Sandbox, progress: Progress) -> None:
    """Rounds of ROUND `true`s with no background process, then ROUND with BACKGROUND sleeps
    running (started before, killed and awaited after)."""
    progress.begin("exec with background")
    for done in range(0, plan.execs, ROUND):
        for _ in range(ROUND):
            fig.add("exec: sb.run(['true']), 0 background", run_true(sb))
        procs = [sb.start(["sleep", "600"]) for _ in range(BACKGROUND)]
        for _ in range(ROUND):
            fig.add(f"exec: sb.run(['true']), {BACKGROUND} background", run_true(sb))
        for proc in procs:
            proc.kill()
            proc.wait(call_timeout=60)
        progress.show(f"{done + ROUND}/{plan.execs}")


OPENED = "terminal: sb.pty(printf x) opened to its first byte"
BESIDE = "foreground beside terminals: sb.run(['true']) to its exit"


def first_byte(sb: Sandbox) -> tuple[Terminal, bytes]:
    terminal = sb.pty(24, 80, ["printf", "x"], call_timeout=60)
    return terminal, terminal.read(timeout=60)


def terminals(fig: Figures, plan: Plan, sb: Sandbox, progress: Progress) -> None:
    """A foreground `true` to its exit, then a terminal opened (`sb.pty`, the WebSocket's
    upgrade, the exec, the terminal made inside) until `printf x`'s byte comes, then awaited
    to its end (not timed), over and over."""
    progress.begin("terminal open")
    for i in range(plan.ptys):
        fig.add(BESIDE, run_true(sb))
        took, (terminal, shown) = timed(lambda: first_byte(sb))
        with terminal:
            fig.add(OPENED, took)
            if shown != b"x" or terminal.wait(timeout=60).exit_code != 0:
                raise BenchError(f"a terminal in {sb.id} showed {shown!r}: {terminal.result}")
        progress.show(f"{i + 1}/{plan.ptys}")


def netns_of(address: str) -> Path:
    """The namespace (/run/netns/sg-N) whose veth has `address`: the daemon does not say which
    slot a sandbox has, so look, as `ip -n NAME -4 addr` shows it."""
    for path in sorted(Path("/run/netns").glob("sg-*")):
        shown = subprocess.run(["ip", "-n", path.name, "-4", "-o", "addr"], capture_output=True,
                               text=True, timeout=20, check=False).stdout
        if f"inet {address}/" in shown:
            return path
    raise BenchError(f"no /run/netns/sg-* has {address}")


def direct(netns: Path, path: str) -> bytes:
    """GET `path` of the server over a socket made in the sandbox's namespace, HTTP/1.1."""
    sock = socket_in(netns)
    sock.settimeout(60)
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    try:
        sock.connect(("127.0.0.1", PORT))
        conn.sock = sock
        conn.request("GET", path)
        answer = conn.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise BenchError(f"direct GET {path}: {answer.status}")
        return body
    finally:
        conn.close()
        sock.close()


def forwarded(sb: Sandbox, path: str) -> bytes:
    status, _, body = sb.port(PORT, path, call_timeout=120)
    if status != 200:
        raise BenchError(f"sb.port({PORT}, {path!r}): {status}")
    return body


def by_curl(daemon: Daemon, sb: Sandbox, path: str) -> bytes:
    """The same request through the daemon, read by curl rather than the Python client."""
    url = f"http://sandboxd/v1/sandboxes/{sb.id}/ports/{PORT}{path}"
    done = subprocess.run(["curl", "-sS", "--fail", "--unix-socket", str(daemon.socket), url],
                          capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        raise BenchError(f"curl {url}: {done.stderr.decode(errors='replace')}")
    return done.stdout


def ports(fig: Figures, plan: Plan, sb: Sandbox, daemon: Daemon, progress: Progress) -> None:
    """The files written, the server started in the background; then the small file and the
    big one, through the daemon and direct, alternating in rounds."""
    progress.begin("port: server up")
    if sb.run(["sh", "-c", FILES], timeout=120).exit_code != 0:
        raise BenchError("could not write the files")
    server = sb.start(SERVER)
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(DaemonError, BenchError):
            if forwarded(sb, "/small") == b"0123456789abcdef":
                break
        if time.monotonic() > deadline:
            raise BenchError(f"the server did not answer: {list(server.output())}")
        time.sleep(0.05)
    netns = netns_of(str(sb.info["address"]))
    fig.notes.append(f"the sandbox's namespace, found by its address: {netns}")
    ways = {"through the daemon": lambda p: forwarded(sb, p), "direct": lambda p: direct(netns, p)}
    progress.begin("port: small requests")
    for done in range(0, plan.small, ROUND):
        for way, get in ways.items():
            for _ in range(ROUND):
                took, body = timed(lambda get=get: get("/small"))
                if len(body) != SMALL:
                    raise BenchError(f"/small {way}: {len(body)} bytes")
                fig.add(f"port /small (16 B): {way}", took)
        progress.show(f"{done + ROUND}/{plan.small}")
    progress.begin("port: 64 MiB transfers")
    if shutil.which("curl", path=HOST_PATH):  # whose reading costs: the client's or the daemon's
        ways[CURL] = lambda p: by_curl(daemon, sb, p)
    for i in range(plan.big):
        for way, get in ways.items():
            took, body = timed(lambda get=get: get("/big"))
            if len(body) != BIG:
                raise BenchError(f"/big {way}: {len(body)} bytes")
            fig.add(f"port /big (64 MiB): {way}", took)
        progress.show(f"{i + 1}/{plan.big}", force=True)
    for way in list(ways)[:2]:  # n over the time they took, one after another
        took = fig.samples[f"port /small (16 B): {way}"]
        fig.values[f"small requests/s, sequential: {way}"] = len(took) * 1000 / sum(took)
    for way in ways:
        fig.values[f"64 MiB throughput MB/s: {way}"] = BIG / 1e6 / (
            fig.p50(f"port /big (64 MiB): {way}") / 1000)
    server.kill()


# A file named by the time it is made, from the clock the bubblewrap sandbox shares with the
# host: the event's arrival at the client less that is the watch's own latency.
MAKER = ("import sys, time\n"
         "for line in sys.stdin:\n"
         "    open(f'watched/{time.time():.6f}', 'w').close()\n")
WATCH = "watch: a file made in the sandbox to its create event at the client"


def watch_latency(fig: Figures, plan: Plan, sb: Sandbox, progress: Progress) -> None:
    """A background process makes a file whenever it reads a line; the client, watching the
    directory through `sb.files.watch`, reads the create event: the shim's inotify in the
    sandbox, its pipe, the daemon's queue and the HTTP stream, one change at a time."""
    count = 200 if plan == FULL else 50
    progress.begin("watch events")
    sb.files.mkdir("watched", parents=True)
    maker = sb.start(["python3", "-u", "-c", MAKER])
    try:
        with sb.files.watch("watched", call_timeout=300) as watch:
            events = iter(watch)
            for i in range(count):
                maker.write(b"\n")
                event = next(e for e in events if e.event == "create")
                fig.add(WATCH, (time.time() - float(event.path.rsplit("/", 1)[1])) * 1000)
                progress.show(f"{i + 1}/{count}")
    finally:
        maker.kill()
    fig.notes.append(f"{WATCH}: {count} files made one at a time by a background Python "
                     "process, each named by `time.time()` when it is made (the sandbox shares "
                     "the host's clock); the latency is the event's arrival at the client less "
                     "that time.")


# -- the report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    label: str
    needs: str
    value: str
    met: bool | None  # None: a figure beside its baseline, no target set


def ratio(fig: Figures, what: str) -> float:
    return fig.values[f"{what}: through the daemon"] / fig.values[f"{what}: direct"]


def targets(fig: Figures) -> list[Target]:
    run = fig.p50("foreground: sb.run(['true']) to its exit")
    start = fig.p50("background: sb.start(['sleep', '60']) answered")
    bare = fig.p50("exec: sb.run(['true']), 0 background")
    busy = fig.p50(f"exec: sb.run(['true']), {BACKGROUND} background")
    rate, tput = ratio(fig, "small requests/s, sequential"), ratio(fig, "64 MiB throughput MB/s")
    return [
        Target("background start answered p50, against a foreground `true` to its exit p50 "
               f"({ms(run)} ms)", "≤ the foreground's", f"{ms(start)} ms", start <= run),
        Target("port, 64 MiB throughput through the daemon / direct (p50 transfers)", "≥ 0.5",
               f"{tput:.2f}", tput >= 0.5),
        Target("port, sequential 16-byte requests/s through the daemon / direct", "(none)",
               f"{rate:.2f}", None),
        Target("terminal opened to its first byte p50, against a `true` to its exit p50 "
               f"({ms(fig.p50(BESIDE))} ms)", "(none)", f"{ms(fig.p50(OPENED))} ms", None),
        Target(f"exec `true` p50 with {BACKGROUND} background sleeps, against none "
               f"({ms(bare)} ms)", "unchanged: within 10 %", f"{ms(busy)} ms "
               f"({(busy / bare - 1) * 100:+.0f} %)", busy <= bare * 1.10),
    ]


def verdict(t: Target) -> str:
    return "-" if t.met is None else "**met**" if t.met else "**not met**"


def rows(fig: Figures) -> list[tuple[str, int, float, float]]:
    return [(n, len(v), fig.p50(n), fig.p95(n)) for n, v in fig.samples.items()]


def console(fig: Figures) -> str:
    lines = [f"{'measurement':<58}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}"]
    lines += [f"{name[:57]:<58}{n:>6}{ms(p50):>10}{ms(p95):>10}"
              for name, n, p50, p95 in rows(fig)]
    lines += [f"{k[:57]:<58}{ms(v):>16}" for k, v in fig.values.items()]
    lines += [f"target {t.label}: {t.value} (needs {t.needs}) "
              f"{verdict(t).strip('*')}" for t in targets(fig)]
    return "\n".join(["", *lines, *fig.notes])


def document(fig: Figures, meta: dict[str, str], plan: Plan, chart: Path) -> str:
    v, whats = fig.values, ("small requests/s, sequential", "64 MiB throughput MB/s")
    out = [
        "# Sandbox API: background processes and ports", "",
        "Generated by `bench/sandbox_api.py` (method: `bench/README.md`). Do not edit by hand "
        "above the hand-written part; run the command again.", "",
        f"* **Command:** `{meta['command']}` (as root)",
        f"* **Date:** {meta['date']} ({meta['mode']}, {meta['duration']} in all)",
        f"* **Daemon:** `sealgate sandboxd --pool 1`, bubblewrap tier, host root (gateway "
        f"{GATEWAY}, range {RANGE}, uid base {UID_BASE}), driven by the sync client "
        "`sealgate.sandbox.clients.client.Sandbox` over its unix socket; one sandbox for all.",
        f"* **Samples:** {plan.starts} background starts interleaved with as many foreground "
        f"`true`s; {plan.execs} `true`s with no background process and as many with "
        f"{BACKGROUND} `sleep`s running, alternating in rounds of {ROUND}; {plan.small} requests "
        f"for the 16-byte file and {plan.big} transfers of the 64 MiB one each way, alternating. "
        "Wall-clock at the client; p50 and p95 linear between samples; nothing pinned.",
        f"* **Server:** `{' '.join(SERVER)}` started by `sb.start`, serving `/workspace/small` "
        f"(16 bytes) and `/workspace/big` (`head -c {BIG} /dev/urandom`). Through the daemon: "
        "`sb.port(8000, path)` (client → unix socket → daemon → a socket it makes in the "
        "sandbox's namespace → the server). Direct: a socket the benchmark makes in that "
        "namespace (`socket_in(/run/netns/sg-N)`, N found by the sandbox's address in `ip -n "
        "NAME -4 addr`), HTTP/1.1 by `http.client`, a connection per request as the daemon "
        "makes (`http.server` answers HTTP/1.0 and closes). Both read the whole body into "
        "memory. `read by curl`: the daemon's port URL fetched by `curl --unix-socket`, to tell "
        "the Python client's reading from the daemon's forwarding.", "",
        "| machine | |", "|---|---|", *[f"| {k} | {val} |" for k, val in facts().items()], "",
        "## Targets (issue #25)", "",
        "| target | needs | measured | |", "|---|---|---|---|",
        *[f"| {t.label} | {t.needs} | {t.value} | {verdict(t)} |" for t in targets(fig)], "",
        "The background start's bar is this benchmark's own (a start answers before its command "
        "ends, so it should cost no more than a `true` run to its end).", "",
        f"![latency, through the daemon against direct]({chart.name})", "",
        "## Port: through the daemon against direct", "",
        "| | through the daemon | direct | ratio |", "|---|---|---|---|",
        *[f"| {w} | {ms(v[f'{w}: through the daemon'])} | {ms(v[f'{w}: direct'])} | "
          f"{ratio(fig, w):.2f} |" for w in whats],
        *([f"| 64 MiB throughput MB/s, {CURL} | {ms(v[f'64 MiB throughput MB/s: {CURL}'])} | "
           "| |"] if f"64 MiB throughput MB/s: {CURL}" in v else []), "",
        "Requests/s: all the requests over the time they took, one after another; throughput: "
        "64 MiB over the p50 transfer (MB = 10^6 bytes).",
        "", "## Latency", "", "| measurement | n | p50 ms | p95 ms |", "|---|---|---|---|",
        *[f"| {name} | {n} | {ms(p50)} | {ms(p95)} |" for name, n, p50, p95 in rows(fig)],
    ]
    if fig.notes:
        out += ["", "## Notes", "", *[f"* {note}" for note in fig.notes]]
    return "\n".join(out) + "\n"


def draw(fig: Figures, path: Path) -> None:
    canvas, (lat, rat) = figure([2, 1], (14, 5))
    shown = [r for r in rows(fig) if "/big" not in r[0]]
    ys = range(len(shown))
    lat.barh(ys, [r[2] for r in shown], color="tab:blue", alpha=0.8)
    lat.errorbar([r[3] for r in shown], ys, fmt="|", color="black", markersize=8, label="p95")
    lat.set_yticks(list(ys), [r[0] for r in shown], fontsize=8)
    lat.invert_yaxis()
    lat.set_xlabel("ms (bar p50, tick p95)")
    lat.set_title("background start, exec, port requests: latency", fontsize=10)
    lat.grid(axis="x", alpha=0.3)
    whats = ("small requests/s, sequential", "64 MiB throughput MB/s")
    v = fig.values
    rat.bar(range(2), [ratio(fig, w) for w in whats], color=["tab:gray", "tab:green"])
    rat.axhline(0.5, linestyle="--", color="tab:red", label="throughput target 0.5")
    labels = [f"{w.split(',')[0].split(' MB')[0]}\n{ms(v[w + ': through the daemon'])} / "
              f"{ms(v[w + ': direct'])}" for w in whats]
    rat.set_xticks([0, 1], labels, fontsize=8)
    rat.set_ylim(0, 1.1)
    rat.set_ylabel("through the daemon / direct")
    rat.set_title("port: through the daemon against direct", fontsize=10)
    rat.legend(fontsize=7)
    save(canvas, path)


# -- main -----------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--json", action="store_true",
                        help="print the figures as one JSON object on stdout, not the table")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs",
                        help="where performance-sandbox-api.md and .png go (default docs/)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    plan = QUICK if args.quick else FULL
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
    progress = Progress({"background start": plan.starts * 0.03,
                         "exec with background": plan.execs * 0.02,
                         "terminal open": plan.ptys * 0.03, "port: server up": 2,
                         "port: small requests": plan.small * 0.01,
                         "port: 64 MiB transfers": plan.big * 1.0, "watch events": 2})
    started = time.monotonic()
    with bench_session(SCRIPT, ("sealgate",)) as session:
        setup, paths = session.setup, dict(session.paths)
        daemons: list[Daemon] = []
        done = sealgate_cmd(paths, "sandbox", "setup", "--range", RANGE, "--gateway", GATEWAY)
        if done.returncode != 0:
            raise BenchError(f"sealgate sandbox setup: {done.stderr}")
        try:
            progress.note(f"starting sealgate proxy on {GATEWAY} in {setup.work} ...")
            proxy = start_proxy(setup, paths, GATEWAY)
            daemons.append(start_daemon(setup, paths, proxy, "sandboxd", 1, net=NET))
            sb = Sandbox.create(SANDBOX, daemon=str(daemons[-1].socket), call_timeout=120)
            try:
                daemons[-1].settle()
                starts(fig, plan, sb, progress)
                execs(fig, plan, sb, progress)
                terminals(fig, plan, sb, progress)
                ports(fig, plan, sb, daemons[-1], progress)
                watch_latency(fig, plan, sb, progress)
            finally:
                with contextlib.suppress(DaemonError):
                    sb.delete()
            daemons.pop().stop(setup)
        finally:
            tear_down(setup, paths, daemons, (RANGE, GATEWAY))
    progress.note(f"done in {(time.monotonic() - started) / 60:.1f} min")

    meta = run_meta("sandbox_api.py", argv if argv is not None else sys.argv[1:], started,
                    args.quick, locked=True)
    machine = {"meta": meta, "plan": asdict(plan), **fig.summary(),
               "targets": [asdict(t) for t in targets(fig)]}
    return finish(args.docs, "performance-sandbox-api", lambda chart: draw(fig, chart),
                  lambda chart: document(fig, meta, plan, chart),
                  machine=machine if args.json else None, console=console(fig),
                  notes=fig.notes)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
