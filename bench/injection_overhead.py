"""Credential injection through sealgate: guard-only, a sealed token, a brokered secret.

    .venv/bin/python bench/injection_overhead.py            # full run, about 3.5 minutes
    .venv/bin/python bench/injection_overhead.py --quick    # about 1 minute

One sealgate process, three sandboxes with three policies that allow the same `GET` to the same
origin over intercepted HTTPS keep-alive (hey, c=1 and c=16): (a) guard-only, no credential;
(b) a sealed token in a `Proxy-Tokenizer` header (the same token every request: the tokenizer's
cache), policy `tokens: true`; (c) a secret brokered from the file store (a cache hit),
`inject: [{secret: file:…, as: bearer}]`. Rounds interleave the three, ratios are taken within
a round and the median over rounds is reported, as in `proxy_overhead.py`, whose pieces this
reuses. A pair of stock mitmdump processes, one streaming each response through sealgate's
scrubber, shows what that step (taken by every injected request) costs mitmproxy itself.
`injection_micro.py` adds µs per token open (cold and cached), cache hits and store misses.
Results go to docs/performance-injection.md and .png; see bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # issuer, tests when run as a script

from proxy_overhead import (  # noqa: E402
    BODY_PATH,
    LOAD_CPU,
    ORIGIN_NAME,
    PROXY_CPU,
    BenchError,
    Cell,
    Goal,
    Lane,
    Progress,
    Result,
    Setup,
    _fmt_ratio,
    _interrupt,
    _ms,
    _nginx_conf,
    _noise_section,
    _num,
    _pinned_self,
    cpu_ratios,
    machine_facts,
    measure,
    ratios,
    rows,
    tools,
)

from issuer.keys import generate  # noqa: E402
from issuer.processors import BearerProcessor  # noqa: E402
from issuer.token import Claims, HostPattern, SandboxBinding, seal  # noqa: E402
from tests.dnsstub import StubDNS  # noqa: E402
from tests.harness import OriginCA, free_port  # noqa: E402

KIND = "https"
LEVELS = (1, 16)
SECRET_NAME = "bench_key"
# lane -> (sandbox, label); the lane name is also the policy's name
LANES = {
    "guard": ("bench-guard", "(a) guard-only: GET rule, no injection"),
    "token": ("bench-token", "(b) sealed token, cached (`tokens: true`)"),
    "broker": ("bench-broker", "(c) brokered secret, file store, cache hit"),
}
# Evidence for where injection's cost lies: stock mitmdump, the response buffered (as
# sealgate passes it on when nothing was injected) or streamed through sealgate's scrubber (as it
# does whenever something was), at c=16 only.
MITM_LANES = {
    "mitmdump": "stock mitmdump -q, response buffered",
    "mitmdump-scrub": "stock mitmdump -q, response streamed through `proxy.scrub.Scrubber`",
}
SCRUB_ADDON = """import sys
sys.path.insert(0, {root!r})
from proxy.scrub import Scrubber


def responseheaders(flow):
    # A needle of a bearer secret's length that is not in the body: the scrubber's full cost.
    flow.response.stream = Scrubber(["tok-" + "q" * 32]).stream()
"""
TARGETS = [
    Goal("(b) cached sealed token vs guard-only, c=16", "token", KIND, 16, "token", "guard",
         0.95),
    Goal("(c) brokered secret, cache hit, vs guard-only, c=16", "broker", KIND, 16, "broker",
         "guard", 0.95),
]
MICRO_TIMEOUT = 240
AUDIT_SETTLE_SECONDS = 0.5  # the audit log is written once per event-loop turn


@dataclass
class InjectionSetup(Setup):
    """`Setup` whose load generator sends a lane's extra header inside the tunnel.

    `loadgen.run_hey` takes no headers, so the header goes in through the command prefix: a
    shell that execs hey with `-H` in front of the arguments. Go's HTTP client sends `-H`
    headers on the requests inside the CONNECT tunnel, never on the CONNECT itself, which gets
    only the proxy URL's credentials; the audit check in `warm_up` proves it for this run.
    """

    headers: dict[str, str] = field(default_factory=dict)
    lane: str | None = None  # the lane being measured

    def prefix(self, cpu: str) -> list[str]:
        base = super().prefix(cpu)
        header = self.headers.get(self.lane or "")
        if cpu != LOAD_CPU or header is None:
            return base
        return [*base, "sh", "-c", f'exec "$0" -H {shlex.quote(header)} "$@"']


def measure_lane(setup: InjectionSetup, cell: Cell, seconds: int, round_: int) -> Result:
    setup.lane = cell.lane
    try:
        return measure(setup, cell, seconds, round_)
    finally:
        setup.lane = None


# -- the set-up: origin, DNS, token keys, secrets file, one sealgate ---------------------------


def start(setup: InjectionSetup, paths: dict[str, str]) -> Path:
    """Start nginx, the stub DNS server and sealgate; return sealgate's audit log."""
    work = setup.work
    ca = OriginCA(work)
    cert, key = ca.issue(ORIGIN_NAME, "127.0.0.1")
    http_port, https_port = free_port(), free_port()
    (work / "nginx").mkdir()
    conf = work / "nginx" / "nginx.conf"
    conf.write_text(_nginx_conf(work / "nginx", http_port, https_port, cert, key))
    setup.services.start(
        "nginx",
        [*setup.prefix(LOAD_CPU), paths["nginx"], "-e", str(work / "nginx" / "error.log"),
         "-p", str(work / "nginx"), "-c", str(conf)],
        https_port, work / "nginx" / "stdout.log",
    )
    setup.dns = StubDNS().start()
    setup.dns.set(ORIGIN_NAME, "A 127.0.0.1")
    dns_host, dns_port = setup.dns.address

    keys_dir = work / "token-keys"
    public = generate(keys_dir)
    now = int(time.time())
    token = seal(Claims(
        kid=public.kid, secret=f"tok-{secrets.token_urlsafe(24)}", processor=BearerProcessor(),
        hosts=(HostPattern(ORIGIN_NAME, https_port),), methods=("GET",), exp=now + 3600,
        iat=now, jti="bench", binding=SandboxBinding(LANES["token"][0]),
    ), public)
    setup.headers["token"] = f"Proxy-Tokenizer: {token}"
    secrets_file = work / "secrets.yaml"
    secrets_file.write_text(f"{SECRET_NAME}: brk-{secrets.token_urlsafe(24)}\n")
    secrets_file.chmod(0o600)

    sandbox_keys = {lane: secrets.token_urlsafe(18) for lane in LANES}
    rules = work / "rules.yaml"
    rules.write_text(_rules(https_port, sandbox_keys))
    port = free_port()
    state = work / "sealgate"
    service = setup.services.start(
        "sealgate",
        [*setup.prefix(PROXY_CPU), paths["sealgate"], "proxy", "--listen", f"127.0.0.1:{port}",
         "--rules", str(rules), "--state", str(state), "--resolver", f"{dns_host}:{dns_port}",
         "--upstream-ca", str(ca.path), "--token-keys", str(keys_dir),
         "--secret-store", f"file:{secrets_file}"],
        port, work / "sealgate.log",
    )
    url = f"https://{ORIGIN_NAME}:{https_port}{BODY_PATH}"
    for lane, (sandbox, label) in LANES.items():
        setup.lanes[lane] = Lane(lane, label, None, url, service, (sandbox, sandbox_keys[lane]))

    addon = work / "scrub_addon.py"
    addon.write_text(SCRUB_ADDON.format(root=str(ROOT)))
    for lane, label in MITM_LANES.items():
        port = free_port()
        mitm = setup.services.start(
            lane,
            [*setup.prefix(PROXY_CPU), paths["mitmdump"], "-q", "--listen-host", "127.0.0.1",
             "-p", str(port), "--set", f"confdir={work / lane}",
             "--set", f"ssl_verify_upstream_trusted_ca={ca.path}",
             *(["-s", str(addon)] if lane == "mitmdump-scrub" else [])],
            port, work / f"{lane}.log",
        )
        setup.lanes[lane] = Lane(lane, label, None, f"https://127.0.0.1:{https_port}{BODY_PATH}",
                                 mitm)
    return state / "audit.log"


def _rules(https_port: int, keys: dict[str, str]) -> str:
    """Three policies with the same rule; only the credential differs."""
    header = {"guard": "", "token": "\n    tokens: true", "broker": ""}
    inject = {"guard": "", "token": "",
              "broker": f"\n        inject: [{{secret: 'file:{SECRET_NAME}', as: bearer}}]"}
    policies = "".join(f"""
  {lane}:{header[lane]}
    allow:
      - host: {ORIGIN_NAME}
        ports: [{https_port}]
        methods: [GET]{inject[lane]}
    allow_networks: [127.0.0.1/32]
    budgets:
      requests_per_second: 1000000
      burst: 1000000
      max_connections: 100000
      max_total_bytes: 1000000000000000""" for lane in LANES)
    sandboxes = "".join(
        f"\n  {sandbox}: {{policy: {lane}, "
        f"key_sha256: \"{hashlib.sha256(keys[lane].encode()).hexdigest()}\"}}"
        for lane, (sandbox, _) in LANES.items()
    )
    return f"version: 1\npolicies:{policies}\nsandboxes:{sandboxes}\ndefault_policy: null\n"


# -- proof that each lane did what it is named for --------------------------------------------


@dataclass
class AuditCount:
    requests: int = 0
    denied: int = 0
    injected: dict[str, int] = field(default_factory=dict)  # label kind -> requests


def audit_counts(audit: Path) -> dict[str, AuditCount]:
    """Request lines of the audit log by lane: how many, how many denied, what was injected."""
    lane_of = {sandbox: lane for lane, (sandbox, _) in LANES.items()}
    counts = {lane: AuditCount() for lane in LANES}
    with audit.open() as fh:
        for line in fh:
            record = json.loads(line)
            lane = lane_of.get(record.get("sandbox"))
            if record.get("event") != "request" or record.get("method") == "CONNECT" or \
                    lane is None:
                continue
            count = counts[lane]
            count.requests += 1
            count.denied += record.get("decision") != "allow"
            for label in record.get("injected") or []:
                kind = label.split(":", 1)[0]
                count.injected[kind] = count.injected.get(kind, 0) + 1
    return counts


def check_audit(counts: dict[str, AuditCount]) -> None:
    expected = {"guard": None, "token": "token", "broker": "broker"}
    for lane, count in counts.items():
        want = expected[lane]
        injected = count.injected.get(want, 0) if want else 0
        if not count.requests or count.denied or set(count.injected) - {want} or (
            want and injected != count.requests
        ):
            raise BenchError(f"{lane}: the audit log shows {count.requests} requests, "
                             f"{count.denied} denied, injected {count.injected or 'nothing'}; "
                             f"expected every request allowed with "
                             f"{want or 'no'} injection")


def warm_up(setup: InjectionSetup, audit: Path) -> None:
    """Each lane once (leaf certificate, DNS, token and secret caches); a lane answered with
    errors, or whose requests did not get their credential, stops the run."""
    for lane in setup.lanes:
        result = measure_lane(setup, Cell(KIND, 8, lane), 1, 0)
        sample = result.sample
        if sample is None or sample.requests == 0 or sample.errors > sample.requests * 0.01:
            service = setup.lanes[lane].service
            raise BenchError(f"warm-up via {lane} failed: {result.failure or sample}\n"
                             f"{service.tail() if service else ''}")
    time.sleep(AUDIT_SETTLE_SECONDS)
    check_audit(audit_counts(audit))


# -- measuring --------------------------------------------------------------------------------


def plan() -> list[list[Cell]]:
    groups = [[Cell(KIND, c, lane) for lane in LANES] for c in LEVELS]
    return [*groups, [Cell(KIND, 16, lane) for lane in MITM_LANES]]


def run_rounds(setup: InjectionSetup, audit: Path, rounds: int, seconds: int) -> list[Result]:
    groups = plan()
    progress = Progress(rounds * sum(len(g) for g in groups), seconds)
    progress.note(f"warming up {len(setup.lanes)} configurations ...")
    warm_up(setup, audit)
    progress.start = time.monotonic()
    results: list[Result] = []
    for r in range(1, rounds + 1):
        for group in groups:
            shift = (r - 1) % len(group)  # no configuration always follows the same one
            for cell in group[shift:] + group[:shift]:
                progress.show(f"round {r}/{rounds}  c={cell.concurrency:<3} {cell.lane}")
                result = measure_lane(setup, cell, seconds, r)
                if result.failure:
                    progress.note(f"  c={cell.concurrency} {cell.lane}: FAILED "
                                  f"{result.failure.splitlines()[0]}")
                results.append(result)
                progress.done += 1
        progress.note(f"round {r}/{rounds} done: " + "; ".join(
            f"{g.short}/guard c={c} "
            f"{_fmt_ratio(ratios(results, KIND, c, g.num, g.den, [r]))}"
            for g in TARGETS for c in LEVELS
        ) + f"; mitmdump streamed/buffered c=16 "
            f"{_fmt_ratio(ratios(results, KIND, 16, 'mitmdump-scrub', 'mitmdump', [r]))}")
    return results


def run_micro(pin: bool) -> dict[str, float] | str:
    """bench/injection_micro.py's figures, alone on the proxy CPU (the fake Vault on the
    other one); or why not."""
    argv = [sys.executable, str(ROOT / "bench" / "injection_micro.py"), "--json"]
    if pin:
        argv += ["--cpu", PROXY_CPU, "--server-cpu", LOAD_CPU]
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                              timeout=MICRO_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return f"bench/injection_micro.py did not finish within {MICRO_TIMEOUT} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return f"bench/injection_micro.py failed (exit {done.returncode}): {done.stderr[-500:]}"
    figures: dict[str, float] = json.loads(lines[-1])
    return figures


# -- numbers ----------------------------------------------------------------------------------


def extra_cpu_us(results: list[Result], c: int, lane: str, base: str = "guard") -> list[float]:
    """Proxy CPU µs per request of `lane` minus `base`'s, within each round."""
    by = {(r.round, r.cell.concurrency, r.cell.lane): r for r in results}
    out = []
    for rnd in sorted({r.round for r in results}):
        costs = [_cost(by.get((rnd, c, name))) for name in (lane, base)]
        if costs[0] is not None and costs[1] is not None:
            out.append((costs[0] - costs[1]) * 1e6)
    return out


def _cost(result: Result | None) -> float | None:
    if result is None or result.sample is None or result.proxy_cpu_s is None or \
            not result.sample.requests:
        return None
    return result.proxy_cpu_s / result.sample.requests


def _verdict(values: list[float], need: float) -> str:
    if not values:
        return "-"
    return "**met**" if statistics.median(values) >= need else "**not met**"


def _us(values: list[float]) -> str:
    if not values:
        return "n/a"
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:+.0f}"
    return f"{median:+.0f} ({min(values):+.0f} to {max(values):+.0f})"


# -- the report -------------------------------------------------------------------------------

MICRO_LABELS = {
    "open_token_cold_us": "`issuer.token.open_token`, a fresh token (X25519 unseal + claims "
                          "parse + time check)",
    "tokenizer_open_cold_us": "`Tokenizer.open`, a token not yet in its cache",
    "tokenizer_open_cached_us": "`Tokenizer.open`, the same token again (cache hit)",
    "tokenizer_authorise_cached_us": "`Tokenizer.authorise`, cached token: open + sandbox "
                                     "binding + host/method/path scope",
    "put_bearer_us": "`proxy.inject.put`, bearer into a mitmproxy request",
    "scrub_1k_response_us": "response scrubber over a 1 KiB body (stream + flush)",
    "secret_get_hit_us": "`SecretBroker.get`, file store, cache hit",
    "vault_get_hit_us": "`SecretBroker.get`, Vault store, cache hit",
    "broker_inject_hit_us": "`Broker.inject`, one bearer secret, cache hit (asyncio.gather + "
                            "put)",
    "file_miss_p50_us": "`SecretBroker.get`, file store, miss (stat + lookup), p50",
    "file_miss_p99_us": "`SecretBroker.get`, file store, miss, p99",
    "vault_miss_p50_ms": "`SecretBroker.get`, Vault miss over HTTP to VaultFake, p50",
    "vault_miss_p99_ms": "`SecretBroker.get`, Vault miss over HTTP to VaultFake, p99",
}


def report(results: list[Result], micro: dict[str, float] | str, counts: dict[str, AuditCount],
           meta: dict[str, str], facts: dict[str, str], chart: Path | None) -> str:
    out = [
        "# Credential injection overhead: sealed tokens and the broker",
        "",
        "Generated by `bench/injection_overhead.py` (method: `bench/README.md`). Do not edit by "
        "hand; run the command again.",
        "",
        f"* **Command:** `{meta['command']}`",
        f"* **Date:** {meta['date']} ({meta['mode']}: {meta['rounds']} rounds, {meta['seconds']} "
        f"s per measurement, {meta['duration']} in all)",
        f"* **Workload:** HTTPS keep-alive through CONNECT with hey (`-c 1` and `-c 16`), "
        f"intercepted by one sealgate process on CPU 1; GET of a 1 KiB body from nginx on CPU 0, "
        f"reached as `{ORIGIN_NAME}` through sealgate's resolver, upstream TLS verified, audit "
        "log on. Three sandboxes, three policies with the same `GET` rule: (a) no credential; "
        "(b) `tokens: true`, each request carries the same sealed bearer token (bound to the "
        "sandbox, scoped to host and method) in `Proxy-Tokenizer`; (c) the rule injects "
        f"`file:{SECRET_NAME}` as a bearer. (b) and (c) also ask for an identity encoding and "
        "stream the response through the scrubber, as every injected request does. Two "
        "stock mitmdump processes (c=16, reached as `127.0.0.1`) show that last step alone.",
        "* **Ratios** are taken within each round (the three measured seconds apart, order "
        "rotating), then the median over rounds is shown with the lowest and highest round in "
        "brackets. Absolute req/s on this machine drift over minutes; trust the ratios more.",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in facts.items()],
        "",
        "## Targets",
        "",
        "Within 5 % of guard-only: the req/s ratio must be at least 0.95. The last column is the "
        "same comparison from sealgate's CPU time per request (guard-only's over the lane's), "
        "which time slices taken by other work on the machine do not bend.",
        "",
        "| target | needs | req/s ratio (median, range over rounds) | | from CPU per request |",
        "|---|---|---|---|---|",
    ]
    for g in TARGETS:
        values = ratios(results, g.kind, g.concurrency, g.num, g.den)
        cpu = cpu_ratios(results, g.kind, g.concurrency, g.num, g.den)
        out.append(f"| {g.label} | ≥ {g.need:g}x | {_fmt_ratio(values)} | "
                   f"{_verdict(values, g.need)} | {_fmt_ratio(cpu)} |")
    if chart is not None:
        out += ["", f"![req/s, ratios to guard-only and micro-benchmarks]({chart.name})"]
    out += ["", "## Intercepted HTTPS keep-alive (hey)", "", *_lane_table(results)]
    out += _attribution(results, micro)
    out += _audit_section(counts)
    out += _micro_section(micro)
    out += _noise_section(results)
    return "\n".join(out) + "\n"


def _lane_table(results: list[Result]) -> list[str]:
    lines = ["| c | configuration | req/s | x guard-only | p50 ms | p99 ms | proxy CPU µs/req "
             "| CPU µs/req over guard-only | proxy CPU use |",
             "|---|---|---|---|---|---|---|---|---|"]
    order = list(LANES)
    ours = [r for r in rows(results) if r.lane in LANES]
    for row in sorted(ours, key=lambda r: (r.concurrency, order.index(r.lane))):
        c = row.concurrency
        is_guard = row.lane == "guard"
        vs = "-" if is_guard else _fmt_ratio(ratios(results, KIND, c, row.lane, "guard"))
        extra = "-" if is_guard else _us(extra_cpu_us(results, c, row.lane))
        cpu = f"{row.cpu_us_per_req:,.0f}" if row.cpu_us_per_req is not None else "-"
        util = f"{row.proxy_util:.0%}" if row.proxy_util is not None else "-"
        name = LANES[row.lane][1]
        if row.errors or row.failures:
            name += f" ⚠ {row.errors} errors, {row.failures} failed runs"
        lines.append(f"| {c} | {name} | {_num(row.rps)} | {vs} | {_ms(row.p50_ms)} | "
                     f"{_ms(row.p99_ms)} | {cpu} | {extra} | {util} |")
    lines += ["", "At c=1 the client waits for each answer, so the ratio there is mostly "
              "latency; at c=16 sealgate's CPU is the limit (see its CPU use), so the ratio is "
              "capacity. hey reports latency in 0.1 ms steps."]
    return lines


def _attribution(results: list[Result], micro: dict[str, float] | str) -> list[str]:
    """The extra CPU each injecting lane costs, next to its parts measured alone and to what
    streaming a response through the scrubber costs stock mitmdump."""
    lines = ["", "## Where the extra time goes", "",
             "Extra proxy CPU per request at c=16, within rounds, against the parts of the "
             "injection path measured alone by `bench/injection_micro.py`, and against the "
             "same switch in stock mitmdump: an addon that streams each response through "
             "`proxy.scrub.Scrubber` (what sealgate does to every response of a request it "
             "injected into) against mitmdump passing the buffered response on.", "",
             "| configuration | req/s ratio | extra CPU µs/request | parts measured alone, µs |",
             "|---|---|---|---|"]
    parts = {
        "token": ["tokenizer_authorise_cached_us", "put_bearer_us", "scrub_1k_response_us"],
        "broker": ["broker_inject_hit_us", "scrub_1k_response_us"],
    }
    for lane, names in parts.items():
        summed = "not measured"
        if isinstance(micro, dict):
            found = [n for n in names if n in micro]
            summed = " + ".join(f"{n.removesuffix('_us')} {micro[n]:.1f}" for n in found)
            summed += f" = {sum(micro[n] for n in found):.1f}"
        lines.append(f"| {LANES[lane][1]} vs (a) | "
                     f"{_fmt_ratio(ratios(results, KIND, 16, lane, 'guard'))} | "
                     f"{_us(extra_cpu_us(results, 16, lane))} | {summed} |")
    lines.append(f"| {MITM_LANES['mitmdump-scrub']} vs buffered | "
                 f"{_fmt_ratio(ratios(results, KIND, 16, 'mitmdump-scrub', 'mitmdump'))} | "
                 f"{_us(extra_cpu_us(results, 16, 'mitmdump-scrub', 'mitmdump'))} | "
                 "the scrubber's own work is in the rows above |")
    lines += ["", "The token and broker steps themselves (open, check, look up, put) are the "
              "smaller share when the extra CPU is well above the sum of the parts; the rest is "
              "mitmproxy's streamed-response path, which the mitmdump pair shows on its own. "
              "Stock mitmdump's absolute numbers are in docs/performance.md."]
    return lines


def _audit_section(counts: dict[str, AuditCount]) -> list[str]:
    lines = ["", "## What each configuration did (from sealgate's audit log)", "",
             "hey's `-H` headers travel inside the CONNECT tunnel, on each request; the CONNECT "
             "itself carries only `Proxy-Authorization`. Every request line of the run, "
             "warm-up included:", "",
             "| configuration | requests | denied | with a token injected | with a brokered "
             "secret injected |", "|---|---|---|---|---|"]
    for lane, count in counts.items():
        lines.append(f"| {LANES[lane][1]} | {count.requests:,} | {count.denied:,} | "
                     f"{count.injected.get('token', 0):,} | {count.injected.get('broker', 0):,} |")
    return lines


def _micro_section(micro: dict[str, float] | str) -> list[str]:
    lines = ["", "## Micro-benchmarks (bench/injection_micro.py, alone on CPU 1)", ""]
    if isinstance(micro, str):
        return [*lines, f"Not measured: {micro}."]
    lines += ["Per-operation figures are the best of several passes; misses are timed one by "
              "one over 200 distinct secrets (file: 3 passes), the fake Vault's server thread "
              "on CPU 0. A file-store secret is cached for 1 s (its store's suggested TTL), a "
              "Vault KV v2 secret for `sealgate_secret_ttl` (300 s).", "",
              "| operation | value |", "|---|---|"]
    for name, value in micro.items():
        unit = "ms" if name.endswith("_ms") else "µs"
        lines.append(f"| {MICRO_LABELS.get(name, name)} | {value:,.2f} {unit} |")
    cold, cached = micro.get("tokenizer_open_cold_us"), micro.get("tokenizer_open_cached_us")
    if cold and cached:
        lines += ["", f"The tokenizer's cache makes a repeated token {cold / cached:,.0f}x "
                  "cheaper to open than a fresh one."]
    inject, get, put = (micro.get(n) for n in ("broker_inject_hit_us", "secret_get_hit_us",
                                                "put_bearer_us"))
    if inject and get and put:
        lines += ["", f"`Broker.inject` on a cache hit takes {inject:.1f} µs where the lookup "
                  f"({get:.1f}) and the `put` ({put:.1f}) take {get + put:.1f}: the rest is "
                  "`asyncio.gather`, which wraps each lookup in a task and waits a loop turn for "
                  "it even when the value is cached."]
    return lines


def draw(results: list[Result], micro: dict[str, float] | str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = rows(results)
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.5), width_ratios=[1, 1.1, 1.2])
    ax = axes[0]
    width = 0.8 / len(LANES)
    for i, lane in enumerate(LANES):
        values = [next((r.rps for r in table if r.lane == lane and r.concurrency == c), 0.0)
                  for c in LEVELS]
        ax.bar([x + i * width for x in range(len(LEVELS))], values, width,
               label=LANES[lane][1].replace("`", ""))
    ax.set_xticks([x + width for x in range(len(LEVELS))], [f"c={c}" for c in LEVELS])
    ax.set_ylabel("requests/s (median over rounds)")
    ax.set_title("intercepted HTTPS keep-alive", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08))

    ax = axes[1]
    labels, low = [], 0.9
    pairs = [(lane, c, "guard") for c in LEVELS for lane in ("token", "broker")]
    pairs.append(("mitmdump-scrub", 16, "mitmdump"))
    for y, (lane, c, base) in enumerate(pairs):
        values = ratios(results, KIND, c, lane, base)
        labels.append(f"{lane} c={c}" if base == "guard"
                      else "mitmdump streamed\nvs buffered, c=16")
        if not values:
            continue
        median = statistics.median(values)
        low = min(low, min(values) - 0.03)
        color = "tab:gray" if base != "guard" else "tab:green" if median >= 0.95 else "tab:red"
        ax.barh(y, median, color=color, alpha=0.75)
        ax.plot([min(values), max(values)], [y, y], color="dimgray", linewidth=2)
        ax.annotate(f"{median:.3f}x", (median, y), xytext=(6, 8), textcoords="offset points",
                    fontsize=8)
    ax.axvline(0.95, color="black", linestyle="--", linewidth=1)
    ax.axvline(1.0, color="gray", linewidth=0.8)
    ax.set_xlim(low, 1.06)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("req/s over guard-only; grey: range over rounds; dashed: target 0.95")
    ax.set_title("ratio to guard-only (green: within 5 %; grey: mitmdump alone)", fontsize=10)

    ax = axes[2]
    if isinstance(micro, dict):
        names = [n for n in MICRO_LABELS if n in micro and not n.endswith("_p99_us")
                 and not n.endswith("_p99_ms")]
        values = [micro[n] * (1000 if n.endswith("_ms") else 1) for n in names]
        ax.barh(range(len(names)), values, color="tab:blue", alpha=0.75)
        for y, v in enumerate(values):
            ax.annotate(f"{v:,.1f}", (v, y), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=7)
        ax.set_yticks(range(len(names)),
                      [n.removesuffix("_us").removesuffix("_ms") for n in names], fontsize=7)
        ax.set_xscale("log")
        ax.invert_yaxis()
        ax.set_xlabel("µs per operation (log scale); misses: p50")
    ax.set_title("micro-benchmarks, alone on CPU 1", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


BASES = {"token": "guard", "broker": "guard", "mitmdump-scrub": "mitmdump"}


def console_summary(results: list[Result], micro: dict[str, float] | str) -> str:
    lines = [f"{'c':>4}  {'configuration':<16}{'req/s':>8}{'x base':>22}{'p50 ms':>9}"
             f"{'p99 ms':>9}{'CPU us/req':>12}{'+us/req':>10}"]
    order = [*LANES, *MITM_LANES]
    for row in sorted(rows(results), key=lambda r: (r.concurrency, order.index(r.lane))):
        c, base = row.concurrency, BASES.get(row.lane)
        vs = "-" if base is None else _fmt_ratio(ratios(results, KIND, c, row.lane, base))
        extra = [] if base is None else extra_cpu_us(results, c, row.lane, base)
        cpu = f"{row.cpu_us_per_req:,.0f}" if row.cpu_us_per_req is not None else "-"
        lines.append(f"{c:>4}  {row.lane:<16}{_num(row.rps):>8}{vs:>22}{_ms(row.p50_ms):>9}"
                     f"{_ms(row.p99_ms):>9}{cpu:>12}"
                     f"{f'{statistics.median(extra):+.0f}' if extra else '-':>10}")
    lines.append("")
    for g in TARGETS:
        values = ratios(results, g.kind, g.concurrency, g.num, g.den)
        met = "met" if values and statistics.median(values) >= g.need else "NOT met"
        cpu = _fmt_ratio(cpu_ratios(results, g.kind, g.concurrency, g.num, g.den))
        lines.append(f"target {g.label}: {_fmt_ratio(values)} (needs >= {g.need:g}x) {met}; "
                     f"from CPU per request {cpu}")
    if isinstance(micro, dict):
        lines.append("micro: " + ", ".join(f"{k} {v:.2f}" for k, v in micro.items()))
    else:
        lines.append(f"micro: not measured: {micro}")
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 s (about 1 min)")
    parser.add_argument("--rounds", type=int, help="rounds (default 7, quick 3)")
    parser.add_argument("--seconds", type=int, help="seconds per measurement (default 3, "
                                                    "quick 2)")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs",
                        help="where performance-injection.md and .png go (default docs/)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 7)
    seconds = args.seconds or (2 if args.quick else 3)
    if rounds < 1 or seconds < 1:
        parser.error("--rounds and --seconds must be at least 1")

    try:
        paths = tools()
    except BenchError as exc:
        print(f"injection_overhead: {exc}", file=sys.stderr)
        return 2
    pin = (os.cpu_count() or 1) >= 2
    # Also SIGINT: a shell starts background jobs with it ignored, and Ctrl-C must still stop us.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="sealgate-injection-bench-"))
    setup = InjectionSetup(work, pin)
    keep_logs = True
    try:
        print("micro-benchmarks (bench/injection_micro.py) ...", file=sys.stderr)
        micro = run_micro(pin)
        with _pinned_self(pin):
            print(f"starting nginx, stub DNS, sealgate and two mitmdumps in {work} ...",
                  file=sys.stderr)
            audit = start(setup, paths)
            results = run_rounds(setup, audit, rounds, seconds)
        time.sleep(AUDIT_SETTLE_SECONDS)
        counts = audit_counts(audit)
        check_audit(counts)
        keep_logs = False
    except KeyboardInterrupt:
        keep_logs = False
        print("\ninjection_overhead: interrupted; stopping everything", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"\ninjection_overhead: {exc}", file=sys.stderr)
        return 1
    finally:
        # A second Ctrl-C must not cut the clean-up short and leave processes running.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        setup.services.stop_all()
        if setup.dns is not None:
            setup.dns.stop()
        if keep_logs:
            print(f"injection_overhead: logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)

    executable = Path(sys.executable)
    with contextlib.suppress(ValueError):
        executable = executable.relative_to(ROOT)
    script = Path(__file__).resolve().relative_to(ROOT)
    meta = {
        "command": shlex.join([str(executable), str(script), *(argv or sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": "custom" if args.rounds or args.seconds else "quick" if args.quick else "full",
        "rounds": str(rounds),
        "seconds": str(seconds),
        "duration": f"{(time.monotonic() - started) / 60:.1f} min",
    }
    args.docs.mkdir(parents=True, exist_ok=True)
    chart = args.docs / "performance-injection.png"
    draw(results, micro, chart)
    document = args.docs / "performance-injection.md"
    document.write_text(report(results, micro, counts, meta, machine_facts(), chart))
    print(console_summary(results, micro))
    print(f"wrote {document} and {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
