"""A declared MCP tool's call against the same HTTP request through the proxy (issue #29).

The same GET of nginx's 1 KiB body with the same brokered bearer injected, two ways, each with
one kept-alive client connection and one call at a time: through `sealgate proxy` (intercepted
HTTPS, the credential injected), and as `tools/call` of a tool declared in the same rules file
to `sealgate mcp serve` (its JSON-RPC, the same decide, guard, injection, scrubbing and audit,
and the answer as MCP content). Rounds alternate the two; the ratio of the per-call medians
(MCP/proxy) is taken within each round. Target: within 20 % (a ratio of at most 1.2).

The gateway's added latency (`sealgate mcp serve`'s /mcp/<server>, the same code as `sealgate
mcp gateway`): a `tools/call` to an upstream MCP server made with the SDK (MCPServer, stateless,
JSON, over HTTPS, answering 1 KiB of text) made directly with its bearer, and through the
gateway, which decides, dials through the guard, injects the bearer, scrubs, filters and audits.

Writes docs/performance-mcp.md and .png (`--docs DIR` elsewhere).
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
from report import figure, finish, machine_facts, run_meta, save
from services import (
    BODY_PATH,
    ORIGIN_NAME,
    Setup,
    origin_policy,
    rules_yaml,
    start_dns,
    start_origin,
    start_sealgate,
)
from session import bench_session, parse_options

from sealgate.mcp.cli import DEFAULT_PYTHON
from sealgate.proxy import ca_bundle_path

SCRIPT = "mcp_overhead.py"
UPSTREAM_NAME = "mcp.bench"
# The upstream MCP server, run by the MCP virtualenv's python: one tool, 1 KiB of text, for a
# caller with the bearer only.
UPSTREAM = r"""
import sys
import uvicorn
from mcp.server import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

port, cert, key, token = sys.argv[1:5]
server = MCPServer("bench-upstream")


@server.tool()
def body() -> str:
    return "x" * 1024


app = server.streamable_http_app(json_response=True, stateless_http=True,
    transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))


async def checked(scope, receive, send):
    if scope["type"] == "http" and (b"authorization", f"Bearer {token}".encode()) not in scope[
            "headers"]:
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    await app(scope, receive, send)


uvicorn.run(checked, host="127.0.0.1", port=int(port), ssl_certfile=cert, ssl_keyfile=key,
            log_level="warning", lifespan="on")
"""
SANDBOX = "bench-mcp"
PROTOCOL = "2026-07-28"
TARGET = 1.2
CALLS = {True: 100, False: 400}  # per lane per round, quick or not


def rules(setup: Setup, https_port: int, origin: Any, key: str, upstream_port: int) -> Path:
    """The proxy's and the MCP server's one rules file: the origin's body, GET, a brokered
    bearer injected, and a tool that makes the same request with the same credential; and the
    upstream MCP server, fronted by the gateway with the same bearer."""
    inject = '{secret: "file:bench_key", as: bearer, name: api}'
    head_lines = origin_policy(origin, "tunnel.bench", inject) + f"""
      - host: {UPSTREAM_NAME}
        ports: [{upstream_port}]
        methods: [POST]
        paths: ["/mcp"]
        inject: [{inject}]
    mcp_servers:
      - name: up
        url: https://{UPSTREAM_NAME}:{upstream_port}/mcp
        credential: api
        tools: [{{name: body}}]
    tools:
      - name: body
        description: The origin's 1 KiB body.
        method: GET
        url: https://{ORIGIN_NAME}:{https_port}{BODY_PATH}
        credential: api"""
    path = setup.work / "rules.yaml"
    path.write_text(rules_yaml({"bench": head_lines}, {SANDBOX: ("bench", key)}))
    return path


def timed_calls(call: Callable[[], None], n: int) -> list[float]:
    took = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        took.append((time.perf_counter() - started) * 1000)
    return took


def main(argv: list[str] | None = None) -> int:
    options = parse_options(__doc__.split("\n\n")[0], argv, full=(5, 1), quick=(3, 1),
                            quick_takes="1 min", outputs="performance-mcp.md and .png")
    started = time.monotonic()
    calls = CALLS[options.quick]
    with bench_session(SCRIPT, ("nginx", "sealgate")) as session:
        setup, paths = session.setup, dict(session.paths)
        origin = start_origin(setup, paths, ORIGIN_NAME, "tunnel.bench")
        resolver = start_dns(setup, ORIGIN_NAME, "tunnel.bench", UPSTREAM_NAME)
        key = secrets.token_urlsafe(18)
        store = setup.work / "secrets.yaml"
        bearer = secrets.token_urlsafe(24)
        store.write_text(f"bench_key: {bearer}\n")
        os.chmod(store, 0o600)
        upstream_port = _free_port()
        script = setup.work / "upstream.py"
        script.write_text(UPSTREAM)
        cert, cert_key = origin.ca.issue(UPSTREAM_NAME, "127.0.0.1")
        setup.services.start(
            "upstream", [str(DEFAULT_PYTHON), "-P", str(script), str(upstream_port), str(cert),
                         str(cert_key), bearer], upstream_port, setup.work / "upstream.log")
        rules_file = rules(setup, origin.https_port, origin, key, upstream_port)
        proxy = start_sealgate(setup, paths, "sealgate", rules_file, resolver, origin,
                               "--secret-store", f"file:{store}")
        mcp_port = _free_port()
        mcp = setup.services.start(
            "mcp", [paths["sealgate"], "mcp", "serve", "--listen", f"127.0.0.1:{mcp_port}",
                    "--rules", str(rules_file), "--state", str(setup.work / "mcp"),
                    "--resolver", resolver, "--upstream-ca", str(origin.ca.path),
                    "--secret-store", f"file:{store}"],
            mcp_port, setup.work / "mcp.log")
        ca = ca_bundle_path(setup.work / "sealgate")
        through = requests.Session()
        through.trust_env = False  # the machine's REQUESTS_CA_BUNDLE would win over verify
        through.proxies = {"https": f"http://{SANDBOX}:{key}@127.0.0.1:{proxy.port}"}
        through.verify = str(ca)
        url = f"https://{ORIGIN_NAME}:{origin.https_port}{BODY_PATH}"
        tool = requests.Session()
        tool.trust_env = False
        tool.auth = (SANDBOX, key)
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "body", "arguments": {}, "_meta": {
                "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                "io.modelcontextprotocol/clientCapabilities": {}}}}).encode()
        headers = {"Content-Type": "application/json", "MCP-Protocol-Version": PROTOCOL,
                   "Accept": "application/json, text/event-stream",
                   "Mcp-Method": "tools/call", "Mcp-Name": "body"}

        def via_proxy() -> None:
            answer = through.get(url, timeout=30)
            if answer.status_code != 200 or len(answer.content) != 1024:
                raise RuntimeError(f"through the proxy: {answer.status_code}")

        def via_tool() -> None:
            answer = tool.post(f"http://127.0.0.1:{mcp_port}/mcp", data=body,
                               headers=headers, timeout=30)
            if answer.status_code != 200 or answer.json().get("result", {}).get("isError"):
                raise RuntimeError(f"the tool: {answer.status_code} {answer.text[:300]}")

        direct = requests.Session()
        direct.trust_env = False
        direct.verify = str(origin.ca.path)
        direct.headers["Authorization"] = f"Bearer {bearer}"
        up = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "body", "arguments": {}, "_meta": json.loads(body)["params"]["_meta"]}})

        def answered(answer: requests.Response, way: str) -> None:
            result = answer.json().get("result", {}) if answer.status_code == 200 else {}
            if result.get("isError") is not False or len(result["content"][0]["text"]) != 1024:
                raise RuntimeError(f"{way}: {answer.status_code} {answer.text[:300]}")

        def upstream_direct() -> None:
            answered(direct.post(f"https://127.0.0.1:{upstream_port}/mcp", data=up,
                                 headers=headers, timeout=30), "the upstream directly")

        def via_gateway() -> None:
            answered(tool.post(f"http://127.0.0.1:{mcp_port}/mcp/up", data=up,
                               headers=headers, timeout=30), "the gateway")

        lanes = {"proxy": via_proxy, "mcp tool": via_tool, "upstream mcp": upstream_direct,
                 "via gateway": via_gateway}
        for call in lanes.values():
            timed_calls(call, 20)  # warm: connections, TLS, the credential's first fetch
        medians: dict[str, list[float]] = {name: [] for name in lanes}
        for round_ in range(options.rounds):
            order = list(lanes) if round_ % 2 == 0 else list(lanes)[::-1]
            for name in order:
                medians[name].append(statistics.median(timed_calls(lanes[name], calls)))
            print(f"{SCRIPT}: round {round_ + 1}/{options.rounds}", file=sys.stderr)
        del mcp, proxy
    ratios = [m / p for m, p in zip(medians["mcp tool"], medians["proxy"], strict=True)]
    meta = run_meta(SCRIPT, sys.argv[1:] if argv is None else argv, started, options.quick)
    added = [g - d for g, d in zip(medians["via gateway"], medians["upstream mcp"],
                                   strict=True)]
    found = {"proxy_ms": statistics.median(medians["proxy"]),
             "mcp_ms": statistics.median(medians["mcp tool"]),
             "ratio": statistics.median(ratios), "low": min(ratios), "high": max(ratios),
             "direct_ms": statistics.median(medians["upstream mcp"]),
             "gateway_ms": statistics.median(medians["via gateway"]),
             "added_ms": statistics.median(added), "added_low": min(added),
             "added_high": max(added)}
    console = (f"per call (median of rounds' medians): through the proxy "
               f"{found['proxy_ms']:.2f} ms, the MCP tool {found['mcp_ms']:.2f} ms; "
               f"MCP/proxy {found['ratio']:.2f}x ({found['low']:.2f}-{found['high']:.2f}), "
               f"target <= {TARGET}x: {'met' if found['ratio'] <= TARGET else 'missed'}; "
               f"the gateway adds {found['added_ms']:.2f} ms a call "
               f"({found['added_low']:.2f}-{found['added_high']:.2f}) to the upstream's "
               f"{found['direct_ms']:.2f} ms")
    return finish(options.docs, "performance-mcp", lambda p: _draw(medians, p),
                  lambda chart: _render(found, medians, calls, meta, chart),
                  machine=None, console=console, notes=[])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _render(found: dict[str, float], medians: dict[str, list[float]], calls: int,
            meta: dict[str, str], chart: Path) -> str:
    verdict = "met" if found["ratio"] <= TARGET else "**missed**"
    lines = [
        "# MCP: a declared tool's call against the same request through the proxy", "",
        f"Generated by `{SCRIPT}` (issue #29). Do not edit by hand; run the command again.", "",
        f"* **Command:** `{meta['command']}`",
        f"* **Date:** {meta['date']} ({meta['mode']}, {meta['duration']})",
        f"* **What:** the same GET of nginx's 1 KiB body over HTTPS with the same brokered "
        f"bearer, one call at a time on one kept-alive client connection, {calls} calls per "
        "way per round, rounds alternating the order; the client is Python's `requests` "
        "both ways, so its own cost is in both.",
        "* **Through the proxy:** `sealgate proxy`, intercepted (the rule has a method and a "
        "path), the bearer injected.",
        "* **The tool:** `tools/call` of a tool declared in the same rules file, to `sealgate "
        "mcp serve` (stateless Streamable HTTP, 2026-07-28), which decides, dials through the "
        "guard, injects, scrubs, caps and audits, and answers the body as MCP content.",
        "* **The gateway:** `tools/call` of an upstream MCP server's tool (the SDK's "
        "`MCPServer`, stateless, JSON, over HTTPS, 1 KiB of text) made directly with its "
        "bearer (`upstream mcp`), and through `sealgate mcp serve`'s `/mcp/<server>` (the "
        "gateway's code), which decides, dials through the guard, injects the bearer, "
        "filters, scrubs and audits (`via gateway`); the same client.",
        "", "| machine | |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in machine_facts().items()],
        "", "## Target", "", "| target | needs | found | |", "|---|---|---|---|",
    ]
    lines += [
        f"| MCP tool call / proxied request, per call | <= {TARGET}x | {found['ratio']:.2f}x "
        f"({found['low']:.2f}-{found['high']:.2f}) | {verdict} |",
        "",
        "| the gateway | per call |",
        "|---|---|",
        f"| added to the upstream's own {found['direct_ms']:.2f} ms, median of rounds "
        f"(range) | {found['added_ms']:.2f} ms ({found['added_low']:.2f}-"
        f"{found['added_high']:.2f}) |",
        "",
        "| way | per call, median of rounds (ms) | each round's median (ms) |",
        "|---|---|---|",
        *[f"| {name} | {statistics.median(v):.2f} | {', '.join(f'{x:.2f}' for x in v)} |"
          for name, v in medians.items()],
        "",
        f"![per call]({chart.name})",
    ]
    return "\n".join(lines) + "\n"


def _draw(medians: dict[str, list[float]], path: Path) -> None:
    fig, (ax,) = figure([1.0], (6.0, 3.5))
    names = list(medians)
    ax.bar(names, [statistics.median(medians[n]) for n in names],
           color=["#4878a8", "#d08040", "#6a9a58", "#a05070"][:len(names)])
    for i, name in enumerate(names):
        ax.scatter([i] * len(medians[name]), medians[name], color="black", s=8, zorder=3)
    ax.set_ylabel("ms per call (median; dots: rounds)")
    ax.set_title("MCP tool vs proxy; upstream MCP server direct vs via the gateway")
    save(fig, path)


if __name__ == "__main__":
    sys.exit(main())
