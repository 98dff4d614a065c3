"""The official MCP client (the `mcp` SDK's `streamable_http_client` and `ClientSession`) run as a
script by the MCP virtualenv's python (the tests' own virtualenv cannot hold the SDK beside
mitmproxy): tests/mcpkit.py writes a plan on its stdin and reads one JSON document back.

    {"url": "http://127.0.0.1:PORT/mcp", "authorization": "Basic ..." | null,
     "steps": [{"list": true}, {"call": "name", "arguments": {...}}, {"sleep": seconds}]}

or, in a sandbox (tests/mcpsandbox.py), `"route": "/docs"` instead of `url`: the URL is
$SEALGATE_MCP_URL (what the sandbox was told) with the route after it; or, for the stdio
transport, `"command": [argv...]`, `"cwd"` and `"stderr"` (a file for the server's stderr)
instead of `url`: the client starts the server and speaks over its pipes.

prints {"url": the URL used, "discovered": {...} | {"error": ...}, "steps": [one of
{"tools": [...]}, {"result": {"text", "structured", "is_error"}}, {"error": {"code",
"message"}}], "logged": [the data of each log notification the server sent, over HTTP]}. Every step
is bounded (20 s); run with -P, so nothing beside this file shadows the SDK.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import anyio
import httpx2
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

STEP_SECONDS = 20


async def run(plan: dict[str, Any]) -> dict[str, Any]:
    if plan.get("command"):
        argv = plan["command"]
        server = StdioServerParameters(command=argv[0], args=argv[1:], cwd=plan.get("cwd"))
        with open(plan["stderr"], "w") as errlog:
            async with stdio_client(server, errlog=errlog) as streams, \
                    ClientSession(streams[0], streams[1]) as session:
                return await _session(session, plan)
    headers = {"Authorization": plan["authorization"]} if plan.get("authorization") else {}
    logged: list[Any] = []

    async def log(params: Any) -> None:  # a server's log notifications, as the agent got them
        logged.append(params.data)

    url = plan.get("url") or os.environ["SEALGATE_MCP_URL"] + plan.get("route", "")
    async with httpx2.AsyncClient(headers=headers, timeout=STEP_SECONDS) as http, \
            streamable_http_client(url, http_client=http) as streams, \
            ClientSession(streams[0], streams[1], logging_callback=log) as session:
        out = await _session(session, plan)
    out["logged"], out["url"] = logged, url
    return out


async def _session(session: ClientSession, plan: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"steps": []}
    try:
        with anyio.fail_after(STEP_SECONDS):
            found = await session.discover()
        out["discovered"] = {"versions": found.supported_versions}
    except MCPError as exc:
        out["discovered"] = {"error": {"code": exc.code, "message": exc.message}}
        return out
    for step in plan["steps"]:
        started = time.monotonic()
        try:
            with anyio.fail_after(STEP_SECONDS):
                out["steps"].append(await _step(session, step))
        except MCPError as exc:
            out["steps"].append({"error": {"code": exc.code, "message": exc.message}})
        out["steps"][-1]["seconds"] = time.monotonic() - started
    return out


async def _step(session: ClientSession, step: dict[str, Any]) -> dict[str, Any]:
    if "sleep" in step:  # a pause between calls (a DNS answer's TTL running out)
        await anyio.sleep(min(float(step["sleep"]), STEP_SECONDS / 2))
        return {"slept": step["sleep"]}
    if step.get("list"):
        listed = await session.list_tools()
        return {"tools": [tool.model_dump(mode="json", by_alias=True, exclude_none=True)
                          for tool in listed.tools]}
    result = await session.call_tool(step["call"], step.get("arguments") or {})
    return {"result": {
        "text": "".join(getattr(c, "text", "") for c in result.content),
        "structured": result.structured_content, "is_error": result.is_error}}


if __name__ == "__main__":
    print(json.dumps(anyio.run(run, json.load(sys.stdin))))
