"""Two builds of sealgate's sandboxd in one run, interleaved: is the sandbox hot path slower?

`bench/ab.py` asks this of the proxy; this asks it of `sealgate sandboxd` (bubblewrap): a warm
create from an image's pool to the end of its first command, and a command (`true`) in a live
sandbox. Both daemons run at once (each its own address range, the same image store and proxy)
and each round measures both, in an order that rotates; the ratio new/old is taken within a
round and its median and range over the rounds reported, with a verdict: "slower" only when
every round's ratio is above 1 + NOISE. The old build is installed from its commit as ab.py's.

    .venv/bin/python bench/sandbox_ab.py af5179f            # that commit against the work tree
    .venv/bin/python bench/sandbox_ab.py A B --rounds 7 --json

Needs root and the test images (scripts/test-images, under var/images-src/).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ab import WORK_TREE, build_of
from sandbox_images import layout
from sandbox_start import (
    SANDBOX,
    Daemon,
    sealgate_cmd,
    start_daemon,
    start_proxy,
    tear_down,
)
from services import Build, Setup
from session import bench_session

from sealgate.sandbox.clients.client import Sandbox

SCRIPT = "sandbox_ab"
NETS = {"old": ("10.221.0.0/16", "10.221.255.254", 3_500_000),
        "new": ("10.222.0.0/16", "10.222.255.254", 3_600_000)}
POOL = 2
NOISE = 0.05  # a round's ratio within 5 % of 1 says nothing on a shared two-CPU VM


@dataclass
class Side:
    name: str
    build: Build
    daemon: Daemon | None = None


def command_file(setup: Setup, side: str, build: Build) -> str:
    """An executable that runs `build`'s sealgate, for the helpers that take one path."""
    path = setup.work / f"sealgate-{side}"
    env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in build.env.items())
    argv = " ".join(shlex.quote(a) for a in build.command)
    path.write_text(f"#!/bin/sh\n{env}exec {argv} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def create_and_run(daemon: Daemon, image: str) -> float:
    """ms from the create's call to its first command's end (the pool refilled before)."""
    daemon.settle()
    started = time.perf_counter()
    sb = Sandbox.create(SANDBOX, image=image, daemon=str(daemon.socket), call_timeout=120)
    try:
        if not sb.run(["true"]).ok:
            raise RuntimeError("true failed in the sandbox")
        return (time.perf_counter() - started) * 1000
    finally:
        sb.delete()


def execs(daemon: Daemon, image: str, n: int) -> list[float]:
    with Sandbox.create(SANDBOX, image=image, daemon=str(daemon.socket),
                        call_timeout=120) as sb:
        took = []
        for _ in range(n):
            started = time.perf_counter()
            sb.run(["true"])
            took.append((time.perf_counter() - started) * 1000)
        return took


def verdict(ratios: list[float]) -> str:
    if all(r > 1 + NOISE for r in ratios):
        return "slower"
    if all(r < 1 - NOISE for r in ratios):
        return "faster"
    return "same (within noise)"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", help="a commit (the baseline)")
    p.add_argument("new", nargs="?", default=WORK_TREE, help="a commit, or . (default: this "
                                                              "work tree)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--creates", type=int, default=10, help="creates per side per round")
    p.add_argument("--execs", type=int, default=50, help="commands per side per round")
    p.add_argument("--image", default="busybox", help="the image of the pools (a test image)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args(argv)
    if min(args.rounds, args.creates, args.execs) < 1:
        p.error("--rounds, --creates and --execs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if os.geteuid() != 0:
        print(f"{SCRIPT}: needs root (namespaces, nftables, cgroups)", file=sys.stderr)
        return 2
    sides = [Side("old", build_of(args.old)), Side("new", build_of(args.new))]
    with bench_session(SCRIPT, ("sealgate",)) as session:
        setup, paths = session.setup, dict(session.paths)
        store = setup.work / "images"
        done = sealgate_cmd(paths, "image", "import", str(layout(args.image)), "--name",
                            args.image, "--store", str(store), timeout=900)
        if done.returncode != 0:
            print(f"{SCRIPT}: image import: {done.stderr[-2000:]}", file=sys.stderr)
            return 1
        for side in sides:
            net = NETS[side.name]
            sealgate_cmd(paths, "sandbox", "setup", "--range", net[0], "--gateway", net[1])
        proxy = start_proxy(setup, paths, NETS["new"][1])
        try:
            for side in sides:
                own = {**paths, "sealgate": command_file(setup, side.name, side.build)}
                side.daemon = start_daemon(
                    setup, own, proxy, f"sandboxd-{side.name}", 0, net=NETS[side.name],
                    extra=["--images", str(store), "--pool", f"{args.image}={POOL}",
                           "--no-selftest"])
                side.daemon.pool = POOL
            figures = measure(sides, args)
        finally:
            tear_down(setup, paths, [side.daemon for side in sides if side.daemon],
                      *((net[0], net[1]) for net in (NETS[side.name] for side in sides)))
    report(figures, sides, args)
    return 0


def measure(sides: list[Side], args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Per measure and side, each round's median (ms)."""
    out: dict[str, dict[str, list[float]]] = {"create+first exec": {"old": [], "new": []},
                                              "exec": {"old": [], "new": []}}
    for round_ in range(args.rounds):
        order = sides if round_ % 2 == 0 else sides[::-1]
        for side in order:
            assert side.daemon is not None
            made = [create_and_run(side.daemon, args.image) for _ in range(args.creates)]
            out["create+first exec"][side.name].append(statistics.median(made))
            out["exec"][side.name].append(statistics.median(
                execs(side.daemon, args.image, args.execs)))
        print(f"{SCRIPT}: round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    return out


def report(figures: dict[str, dict[str, list[float]]], sides: list[Side],
           args: argparse.Namespace) -> None:
    rows = []
    for what, by_side in figures.items():
        ratios = [n / o for n, o in zip(by_side["new"], by_side["old"], strict=True)]
        rows.append({"measure": what, "old_ms": statistics.median(by_side["old"]),
                     "new_ms": statistics.median(by_side["new"]),
                     "ratio": statistics.median(ratios), "low": min(ratios),
                     "high": max(ratios), "verdict": verdict(ratios)})
    if args.json:
        print(json.dumps({"old": sides[0].build.label, "new": sides[1].build.label,
                          "image": args.image, "rounds": args.rounds, "rows": rows}))
        return
    print(f"old: {sides[0].build.label}\nnew: {sides[1].build.label}\n"
          f"image {args.image}, {args.rounds} rounds, {args.creates} creates and "
          f"{args.execs} commands per side per round (medians)\n")
    print(f"{'measure':<20} {'old ms':>8} {'new ms':>8} {'new/old':>8}  {'range':<13} verdict")
    for r in rows:
        print(f"{r['measure']:<20} {r['old_ms']:>8.2f} {r['new_ms']:>8.2f} {r['ratio']:>8.3f}  "
              f"{r['low']:.3f}-{r['high']:.3f}  {r['verdict']}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
