"""Two builds of sealgate in one run, interleaved: is the new one slower anywhere?

    .venv/bin/python bench/ab.py HEAD~1                 # HEAD~1 against this work tree
    .venv/bin/python bench/ab.py 9767791 HEAD --quick   # two commits, about 4 minutes
    .venv/bin/python bench/ab.py HEAD~1 --json          # the figures for a machine

The same workloads as proxy_overhead.py and injection_overhead.py, each through both builds
(plain HTTP, intercepted HTTPS keep-alive, the tunnel, a new intercepted connection per
request, base-URL mode kept alive and new, a brokered secret injected), at c=16 against one
nginx and one stub DNS server. Both proxies run on the proxy CPU, one at a time: every round
measures each workload through old and new back to back, in an order that rotates, and each
ratio new/old is taken within its round, so the machine's drift over minutes cancels. Each
path prints its median ratio with the lowest and highest round, for req/s and for the proxy's
CPU time per request (old's over new's: above 1 is new cheaper), and a verdict: `slower` when
even the best round of both measures is below 1 - TOLERANCE. This is the check a change to the
request path or the engine records in its issue note (docs/performance.md says why).

A commit is exported with `git archive` and installed with pip into var/ab/<commit>/ (once,
reused), then run with this venv's Python and dependencies; "." is this work tree as the venv
has it installed (editable).
"""

from __future__ import annotations

import argparse
import base64
import json
import secrets
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from report import figure, fmt_ratio, machine_facts, publish, ratio_bar, save
from rounds import Cell, Result, cpu_ratios, ratios, run_rounds
from services import (
    ORIGIN_NAME,
    ROOT,
    BenchError,
    Build,
    Lane,
    Setup,
    origin_policy,
    probe,
    rules_yaml,
    start_dns,
    start_origin,
    start_sealgate,
)
from session import bench_session, parse_options, run_meta

SCRIPT = "ab"
TOOLS = ("wrk", "hey", "nginx", "taskset", "sealgate")
TUNNEL_NAME = "tunnel.bench"
CONCURRENCY = 16
TOLERANCE = 0.03  # a path whose every round is this much slower is reported `slower`
MIN_ROUNDS = 3  # fewer say nothing: one round is one sample of a noisy machine
WORK_TREE = "."
# path -> (load kind, lane suffix, what it is)
PATHS = {
    "plain": ("http", "", "plain HTTP keep-alive (wrk)"),
    "intercepted": ("https", "", "intercepted HTTPS keep-alive (hey)"),
    "tunnel": ("https", "-tunnel", "CONNECT tunnel, not decrypted"),
    "new-conn": ("newconn", "", "a new intercepted connection per request"),
    "base-url": ("https", "-base", "base-URL mode keep-alive"),
    "base-url-new": ("newconn", "-base", "base-URL mode, a new connection per request"),
    "broker": ("https", "-broker", "intercepted, a brokered secret injected"),
}
SECRET_NAME = "bench_key"


_ISOLATED = """import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if "Editable" not in getattr(f, "__qualname__", type(f).__qualname__)]
sys.path_hooks[:] = [h for h in sys.path_hooks if "Editable" not in getattr(h, "__qualname__", "")]
sys.path_importer_cache.clear()
from sealgate.cli import main
sys.argv[0] = "sealgate"
sys.exit(main())
"""


@dataclass(frozen=True)
class Side:
    name: str  # "old" or "new"
    build: Build


def build_of(revision: str) -> Build:
    """The command that runs `revision`'s sealgate: this venv's for ".", else an install of
    that commit's tree under var/ab/, made once."""
    if revision == WORK_TREE:
        return Build("work tree", [str(ROOT / ".venv" / "bin" / "sealgate")])
    try:
        commit = subprocess.run(["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
                                cwd=ROOT, capture_output=True, text=True, check=True,
                                timeout=30).stdout.strip()
    except subprocess.CalledProcessError:
        raise BenchError(f"{revision!r} is not a commit of this repository") from None
    home = ROOT / "var" / "ab" / commit
    site = home / "site"
    if not (home / "installed").exists():
        print(f"installing {revision} ({commit[:10]}) into {home} ...", file=sys.stderr)
        src = home / "src"
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True,
                                 check=True, timeout=120).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True, timeout=120)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
             "--target", str(site), str(src)], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise BenchError(f"pip could not install {revision}: {done.stderr[-1500:]}")
        (home / "installed").write_text(commit + "\n")
    # Its own sealgate first on the path, this venv's packages (mitmproxy, ...) after it. The
    # venv's editable install of this tree must not answer for any of its modules: -P keeps
    # the working directory (this checkout's sealgate/) off the path, and _ISOLATED drops the
    # editable finders, which would fill in a module the old tree lacks with this tree's.
    return Build(f"{revision} ({commit[:10]})", [sys.executable, "-P", "-c", _ISOLATED],
                 {"PYTHONPATH": str(site)})


def start_all(setup: Setup, paths: dict[str, str], sides: list[Side]) -> None:
    origin = start_origin(setup, paths, ORIGIN_NAME, TUNNEL_NAME)
    resolver = start_dns(setup, ORIGIN_NAME, TUNNEL_NAME)
    keys = {"bench": secrets.token_urlsafe(18), "broker": secrets.token_urlsafe(18)}
    policies = {"bench": origin_policy(origin, TUNNEL_NAME),
                "broker": origin_policy(origin, TUNNEL_NAME,
                                        f"{{secret: 'file:{SECRET_NAME}', as: bearer}}")}
    rules = setup.work / "rules.yaml"
    rules.write_text(rules_yaml(policies, {f"bench-{n}": (n, k) for n, k in keys.items()}))
    store = setup.work / "secrets.yaml"
    store.write_text(f"{SECRET_NAME}: brk-{secrets.token_urlsafe(24)}\n")
    store.chmod(0o600)
    named_plain, named_tls = origin.url("http", ORIGIN_NAME), origin.url("https", ORIGIN_NAME)
    for side in sides:
        service = start_sealgate(setup, paths, side.name, rules, resolver, origin,
                                 "--secret-store", f"file:{store}", build=side.build)
        creds = ("bench-bench", keys["bench"])
        n = side.name
        setup.lanes[n] = Lane(n, n, named_plain, named_tls, service, creds)
        setup.lanes[f"{n}-tunnel"] = Lane(f"{n}-tunnel", n, None,
                                          origin.url("https", TUNNEL_NAME), service, creds)
        auth = base64.b64encode(":".join(creds).encode()).decode()
        setup.lanes[f"{n}-base"] = Lane(
            f"{n}-base", n, None, f"http://127.0.0.1:{service.port}/_/"
            + named_tls.split("://", 1)[1], service,
            headers=(f"Proxy-Authorization: Basic {auth}",), proxied=False)
        # HTTPS only: a credential is never injected over plain HTTP (insecure_upstream).
        setup.lanes[f"{n}-broker"] = Lane(f"{n}-broker", n, None, named_tls, service,
                                          ("bench-broker", keys["broker"]))
    for lane in setup.lanes.values():
        if lane.http_url is not None or not lane.proxied:
            probe(lane)


def plan(paths: list[str]) -> list[list[Cell]]:
    return [[Cell(PATHS[p][0], CONCURRENCY, f"{side}{PATHS[p][1]}") for side in ("old", "new")]
            for p in paths]


@dataclass(frozen=True)
class Verdict:
    path: str
    rps: list[float]  # new/old req/s, one per round
    cpu: list[float]  # old/new proxy CPU per request, one per round

    @property
    def word(self) -> str:
        if not self.rps:
            return "not measured"
        if len(self.rps) < MIN_ROUNDS:
            return f"no verdict ({len(self.rps)} of {MIN_ROUNDS} rounds)"
        if max(self.rps) < 1 - TOLERANCE and (not self.cpu or max(self.cpu) < 1 - TOLERANCE):
            return "slower"
        if min(self.rps) > 1 + TOLERANCE and (not self.cpu or min(self.cpu) > 1 + TOLERANCE):
            return "faster"
        return "same"

    def as_json(self) -> dict[str, object]:
        return {"path": self.path, "what": PATHS[self.path][2], "verdict": self.word,
                "rps_new_over_old": self.rps, "cpu_old_over_new": self.cpu,
                "rps_median": statistics.median(self.rps) if self.rps else None,
                "cpu_median": statistics.median(self.cpu) if self.cpu else None}


def verdicts(results: list[Result], paths: list[str]) -> list[Verdict]:
    out = []
    for p in paths:
        kind, suffix, _ = PATHS[p]
        old, new = f"old{suffix}", f"new{suffix}"
        out.append(Verdict(p, ratios(results, kind, CONCURRENCY, new, old),
                           cpu_ratios(results, kind, CONCURRENCY, new, old)))
    return out


def table(found: list[Verdict], old: Build, new: Build) -> str:
    lines = [f"new: {new.label}   old: {old.label}   c={CONCURRENCY}, median [lowest, highest "
             "round]", "",
             f"{'path':<14}{'req/s new/old':<26}{'CPU/req old/new':<26}verdict"]
    for v in found:
        lines.append(f"{v.path:<14}{fmt_ratio(v.rps):<26}{fmt_ratio(v.cpu):<26}{v.word}")
    return "\n".join(lines)


def render(found: list[Verdict], old: Build, new: Build, meta: dict[str, str],
           chart: Path) -> str:
    lines = [
        "# A/B: two builds of sealgate in one run", "",
        "Generated by `bench/ab.py` (its docstring says how). Do not edit by hand above the "
        "hand-written part; run the command again.", "",
        f"* **Command:** `{meta['command']}`",
        f"* **Date:** {meta['date']} ({meta['rounds']} rounds, {meta['seconds']} s per "
        f"measurement, {meta['duration']} in all)", "",
        "| machine | |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in machine_facts().items()], "",
        "| path | what | req/s new/old | proxy CPU per request, old/new | verdict |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {v.path} | {PATHS[v.path][2]} | {fmt_ratio(v.rps)} | {fmt_ratio(v.cpu)} | "
              f"{v.word} |" for v in found]
    lines += ["", f"new: {new.label}; old: {old.label}; c={CONCURRENCY}. Ratios are medians "
              "over rounds, the lowest and highest round in brackets; `slower` when every round "
              f"of both is more than {TOLERANCE:.0%} below 1.", "",
              f"![new/old by path]({chart.name})"]
    return "\n".join(lines)


def draw(found: list[Verdict], path: Path) -> None:
    fig, (ax,) = figure([1], (8, 0.5 + 0.55 * len(found)))
    for y, v in enumerate(found):
        if v.rps:
            ratio_bar(ax, y, v.rps, {"slower": "tab:red", "faster": "tab:green"}.get(
                v.word, "tab:blue"))
    ax.axvline(1.0, color="black", linestyle="--")
    ax.set_yticks(range(len(found)), [v.path for v in found], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("req/s new/old (median; grey: range over rounds)")
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", help="the build compared against: a commit")
    parser.add_argument("new", nargs="?", default=WORK_TREE,
                        help='a commit, or "." for this work tree (the default)')
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--docs", type=Path,
                        help="also write DOCS/performance-ab.md and .png (e.g. docs)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 s")
    parser.add_argument("--rounds", help="rounds (default 5)")
    parser.add_argument("--seconds", help="seconds per measurement (default 3)")
    args = parser.parse_args(argv)
    wanted = [p for p in args.paths.split(",") if p]
    if unknown := [p for p in wanted if p not in PATHS]:
        parser.error(f"unknown paths {', '.join(unknown)}; known: {', '.join(PATHS)}")
    # session.parse_options checks and resolves the shared three.
    shared = (["--quick"] if args.quick else []) + [
        f"--{name}={value}" for name in ("rounds", "seconds")
        if (value := getattr(args, name)) is not None]
    options = parse_options(None, shared, full=(5, 3), quick=(3, 2), quick_takes="4 minutes",
                            outputs="nothing")
    with bench_session(SCRIPT, TOOLS) as session:
        sides = [Side("old", build_of(args.old)), Side("new", build_of(args.new))]
        setup = session.setup
        with setup.orchestrator_pinned():
            print(f"starting nginx, stub DNS and both proxies in {setup.work} ...",
                  file=sys.stderr)
            start_all(setup, session.paths, sides)
            results = run_rounds(
                setup, plan(wanted), options.rounds, options.seconds,
                lambda res, r: "; ".join(f"{v.path} {fmt_ratio(v.rps)}"
                                         for v in verdicts([x for x in res if x.round == r],
                                                           wanted) if v.rps))
    found = verdicts(results, wanted)
    old, new = sides[0].build, sides[1].build
    if args.docs is not None:
        meta = run_meta(__file__, argv, options, session.started)
        print(publish(args.docs, "performance-ab", lambda chart: draw(found, chart),
                      lambda chart: render(found, old, new, meta, chart)), file=sys.stderr)
    if args.json:
        print(json.dumps({"old": old.label, "new": new.label,
                          "concurrency": CONCURRENCY, "rounds": options.rounds,
                          "seconds": options.seconds,
                          "paths": [v.as_json() for v in found]}, indent=2))
    else:
        print(table(found, old, new))
    return 1 if any(v.word == "slower" for v in found) else 0


if __name__ == "__main__":
    sys.exit(main())
