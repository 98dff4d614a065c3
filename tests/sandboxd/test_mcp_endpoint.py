"""The MCP endpoint inside every sandbox (#29): `sealgate mcp serve` on the gateway, given the
proxy's state (its source registry), and `sandboxd --mcp-port` letting that port through and
telling each command SEALGATE_MCP_URL. A sandbox calls its tools with nothing configured, is
known by its address (another sandbox's policy shows other tools), and the tool's request is
checked at the origin.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sealgate.sandbox.clients.client import Sandbox
from tests.dnsstub import StubDNS
from tests.harness import ROOT, SEALGATE, Origin, OriginCA, Proxy, end, free_port, key_digest
from tests.mcpkit import PROTOCOL, needs_mcp_venv

from .conftest import GATEWAY, Daemon, start_daemon

pytestmark = needs_mcp_venv()

# A stdlib client (the sandbox's Python is the host's, without the SDK): the 2026-07-28
# revision's stateless requests, each with its headers, to the URL it was told.
_CALL = """
import json, os, sys, urllib.error, urllib.request
url = os.environ["SEALGATE_MCP_URL"]
PROTOCOL = sys.argv[2]
out = []
for method, name, params in json.loads(sys.argv[1]):
    meta = {"io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": PROTOCOL, "Mcp-Method": method}
    if name:
        headers["Mcp-Name"] = name
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            out.append(json.loads(answer.read()))
    except urllib.error.HTTPError as refused:
        out.append({"status": refused.code, "body": refused.read().decode(errors="replace")})
print(json.dumps({"url": url, "answers": out}))
"""


@pytest.fixture(scope="module")
def mcp_port(dproxy: Proxy, origin_https: Origin, dns: StubDNS, test_ca: OriginCA,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    where = tmp_path_factory.mktemp("mcp-endpoint")
    rules = where / "rules.yaml"
    rules.write_text(f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{origin_https.port}]
    allow_networks: [127.0.0.1/32]
    tools:
      - name: ping
        description: The API's ping.
        method: GET
        url: https://api.test:{origin_https.port}/from-mcp-tool
  other:
    allow: []
sandboxes:
  ci-bot: {{policy: ci, key_sha256: "{key_digest('never-used-ci-key')}"}}
  other-bot: {{policy: other, key_sha256: "{key_digest('never-used-other-key')}"}}
""")
    port = free_port()
    stderr = where / "mcp.stderr"
    with stderr.open("wb") as err:
        server = subprocess.Popen(
            [*SEALGATE, "mcp", "serve", "--listen", f"{GATEWAY}:{port}", "--rules", str(rules),
             "--state", str(dproxy.state), "--resolver", f"{dns.address[0]}:{dns.address[1]}",
             "--upstream-ca", str(test_ca.path), "--audit-log", str(where / "audit.log")],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_ready(server, stderr)
        yield port
    finally:
        end(server)


def _wait_ready(server: subprocess.Popen[bytes], stderr: Path) -> None:
    import time

    deadline = time.monotonic() + 30
    while "sealgate mcp ready" not in stderr.read_text(errors="replace"):
        assert server.poll() is None and time.monotonic() < deadline, stderr.read_text()
        time.sleep(0.05)


@pytest.fixture(scope="module")
def mcp_daemon(dproxy: Proxy, mcp_port: int, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Daemon]:
    daemon = start_daemon(dproxy, tmp_path_factory.mktemp("sandboxd-mcp"), "--pool", "0",
                          "--mcp-port", str(mcp_port), "--no-selftest")
    yield daemon
    daemon.stop()


def _calls(sb: Sandbox, steps: list[tuple[str, str | None, dict[str, Any]]]) -> dict[str, Any]:
    ran = sb.run(["python3", "-c", _CALL, json.dumps(steps), PROTOCOL], timeout=60)
    assert ran.ok, ran.stderr.decode(errors="replace")[-600:]
    return dict(json.loads(ran.stdout))


def test_a_sandbox_calls_its_tools_with_nothing_configured(
        mcp_daemon: Daemon, mcp_port: int, origin_https: Origin) -> None:
    origin_https.reset()
    with Sandbox.create("ci-bot", daemon=str(mcp_daemon.socket)) as sb:
        got = _calls(sb, [("tools/list", None, {}),
                          ("tools/call", "ping", {"name": "ping", "arguments": {}})])
        assert got["url"] == f"http://{GATEWAY}:{mcp_port}/mcp"
        listed, called = got["answers"]
        assert [t["name"] for t in listed["result"]["tools"]] == ["ping"], listed
        assert called["result"]["isError"] is False, called
        assert "hello from origin" in json.dumps(called["result"]["content"])
        # The endpoint is reached directly: the proxy's variables leave it out.
        assert GATEWAY in sb.run(["sh", "-c", "echo $NO_PROXY"]).text
    assert [r.path for r in origin_https.requests] == ["/from-mcp-tool"]
    with Sandbox.create("other-bot", daemon=str(mcp_daemon.socket)) as other:
        # Known by its address: its policy declares no tool and no http_request (a policy
        # offers the generic tool only when it declares it), and ping is no tool of its.
        listed, called = _calls(other, [
            ("tools/list", None, {}),
            ("tools/call", "ping", {"name": "ping", "arguments": {}})])["answers"]
        assert listed["result"]["tools"] == [], listed
        assert called["status"] == 400 and "no tool named 'ping'" in called["body"], called
    assert [r.path for r in origin_https.requests] == ["/from-mcp-tool"]


def test_without_the_flag_the_port_is_closed(dproxy: Proxy, mcp_port: int, tmp_path: Path
                                             ) -> None:
    """A daemon not told of the endpoint neither names it nor lets its port through."""
    daemon = start_daemon(dproxy, tmp_path, "--pool", "0", "--no-selftest")
    try:
        _closed(daemon, mcp_port)
    finally:
        daemon.stop()


def _closed(daemon: Daemon, mcp_port: int) -> None:
    with Sandbox.create("ci-bot", daemon=str(daemon.socket)) as sb:
        assert "SEALGATE_MCP_URL" not in sb.run(["sh", "-c", "env"]).text
        probe = sb.run(["python3", "-c", "import socket, sys\ntry:\n"
                        f"    socket.create_connection(('{GATEWAY}', {mcp_port}), timeout=5)\n"
                        "    print('open')\nexcept OSError as e:\n    print('closed', e.errno)"])
        assert probe.stdout.startswith(b"closed"), probe
