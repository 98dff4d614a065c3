"""MCP clients inside a real sandbox (#29): the official SDK's, as an agent would bring it, and
a stdlib one for what the SDK will not send (a refused call's raw status and body).

The official client is tests/mcpclient.py with the `mcp` SDK's client and what it imports,
taken from the MCP virtualenv (var/mcp-venv) and unpacked into the sandbox's workspace as an
agent's vendored dependencies are: the sandbox's Python is the host's 3.11 (the same ABI as the
virtualenv's), and nothing of the SDK is on the host's own path. Which files the client needs is
asked of the virtualenv's Python itself (the modules a session and its HTTP transport load), so
a new SDK release that imports more is followed, not listed by hand.
"""

from __future__ import annotations

import functools
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from sealgate.sandbox.clients.client import Result, Sandbox
from tests.mcpkit import CLIENT, MCP_PYTHON, PROTOCOL

SDK_DIR = "mcp-sdk"  # in the workspace: the SDK's packages and the client script

# Run by the virtualenv's Python: the site-packages entries (packages, modules, extension
# files) the client's imports loaded, with their dist-info (importlib.metadata reads versions).
_CLOSURE = """
import json, os, sys
import anyio, httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
import mcp.client.stdio
import jsonschema  # imported by a session only when a tool declares an output schema

async def transport():  # a client and its pool load h11, httpcore2, certifi, ssl's helpers
    async with httpx2.AsyncClient() as http:
        http.build_request("POST", "http://127.0.0.1/")

anyio.run(transport)
site = next(p for p in sys.path if p.endswith("site-packages"))
tops = set()
for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None) or ""
    if path.startswith(site + os.sep):
        tops.add(os.path.relpath(path, site).split(os.sep)[0])
tops -= {"_distutils_hack"} | {t for t in tops if t.startswith("__editable__")}
names = {t.split(".")[0].replace("_", "-").lower() for t in tops}
tops |= {entry for entry in os.listdir(site) if entry.endswith(".dist-info")
         and entry.split("-")[0].replace("_", "-").lower() in names}
print(json.dumps({"site": site, "entries": sorted(tops)}))
"""


@functools.cache
def sdk_files() -> tuple[tuple[Path, str], ...]:
    """The client script and the SDK files it loads: (where, its name under SDK_DIR)."""
    done = subprocess.run([str(MCP_PYTHON), "-P", "-c", _CLOSURE], capture_output=True,
                          text=True, timeout=60, check=True)
    found = json.loads(done.stdout)
    site = Path(found["site"])
    return (*((site / entry, entry) for entry in found["entries"]), (CLIENT, "mcpclient.py"))


def sdk_tree(root: Path) -> None:
    """The files of `sdk_files` copied into the directory `root` (a workspace's SDK_DIR)."""
    for source, name in sdk_files():
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, root / name)


@functools.cache
def sdk_archive() -> bytes:
    """A tar of `sdk_files` under SDK_DIR/."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for source, name in sdk_files():
            tar.add(source, f"{SDK_DIR}/{name}",
                    filter=lambda info: None if "__pycache__" in info.name else info)
    return buffer.getvalue()


def install_sdk(sb: Sandbox) -> str:
    """The SDK unpacked into the sandbox's workspace: the directory it is in."""
    sb.files.upload_tar(sdk_archive())
    where = sb.run(["sh", "-c", f"cd {SDK_DIR} && pwd"], check=True).text.strip()
    return where


def sdk_client(sb: Sandbox, steps: list[dict[str, Any]], route: str = "") -> dict[str, Any]:
    """The official client's run of `steps` in the sandbox, at $SEALGATE_MCP_URL + `route`
    (the URL the sandbox was told, with nothing else configured): its JSON answer."""
    where = install_sdk(sb)
    plan = {"route": route, "steps": steps}
    ran = sb.run(["python3", "-P", f"{where}/mcpclient.py"], env={"PYTHONPATH": where},
                 stdin=json.dumps(plan).encode(), timeout=120)
    assert ran.ok, (ran.stdout + ran.stderr).decode(errors="replace")[-2000:]
    return dict(json.loads(ran.stdout))


# The stdlib client: the 2026-07-28 revision's stateless requests to $SEALGATE_MCP_URL + route,
# each with its headers; every answer or refusal kept as its status and body.
_RAW = """
import json, os, sys, urllib.error, urllib.request
url = os.environ["SEALGATE_MCP_URL"] + sys.argv[1]
PROTOCOL = sys.argv[3]
out = []
for number, (method, name, params) in enumerate(json.loads(sys.argv[2]), 1):
    meta = {"io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": number, "method": method,
            "params": {**params, "_meta": meta}}
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": PROTOCOL, "Mcp-Method": method}
    if name:
        headers["Mcp-Name"] = name
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            out.append({"status": answer.status, "body": json.loads(answer.read())})
    except urllib.error.HTTPError as refused:
        text = refused.read().decode(errors="replace")
        try:
            out.append({"status": refused.code, "body": json.loads(text)})
        except ValueError:
            out.append({"status": refused.code, "body": text})
print(json.dumps({"url": url, "answers": out}))
"""

Step = tuple[str, "str | None", dict[str, Any]]


def raw_calls(sb: Sandbox, steps: list[Step], route: str = "") -> tuple[str, list[dict[str, Any]],
                                                                        Result]:
    """The stdlib client's requests (method, Mcp-Name, params) at $SEALGATE_MCP_URL + `route`:
    the URL, each answer as {"status", "body"}, and the command's result (what it printed)."""
    ran = sb.run(["python3", "-c", _RAW, route, json.dumps(steps), PROTOCOL], timeout=90)
    assert ran.ok, ran.stderr.decode(errors="replace")[-600:]
    got = json.loads(ran.stdout)
    return str(got["url"]), list(got["answers"]), ran
