"""The MCP endpoint inside every sandbox (#29): `sealgate mcp serve` on the gateway, given the
proxy's state (its source registry), and `sandboxd --mcp-port` letting that port through and
telling each command SEALGATE_MCP_URL. A sandbox calls its tools with nothing configured, is
known by its address (another sandbox's policy shows other tools), and the tool's request is
checked at the origin.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.sandbox.clients.client import Sandbox
from tests.dnsstub import StubDNS
from tests.harness import ROOT, SEALGATE, Origin, OriginCA, Proxy, end, free_port, key_digest
from tests.mcpkit import needs_mcp_venv
from tests.mcpsandbox import raw_calls, sdk_client

from .conftest import GATEWAY, Daemon, start_daemon

pytestmark = needs_mcp_venv()

CANARY = "CANARY-mcp-endpoint-api-key-51b8e0f3"


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
        paths: ["/whoami/**"]
        inject:
          - {{secret: "file:api", as: bearer, name: api}}
      - host: api.test
        ports: [{origin_https.port}]
    allow_networks: [127.0.0.1/32]
    tools:
      - name: ping
        description: The API's ping.
        method: GET
        url: https://api.test:{origin_https.port}/from-mcp-tool
      - name: whoami
        description: Who the API takes the caller for (it echoes what it got).
        method: GET
        url: https://api.test:{origin_https.port}/whoami/{{user}}
        arguments:
          type: object
          properties:
            user: {{type: string, pattern: "^[a-z]+$"}}
          required: [user]
          additionalProperties: false
        credential: api
  other:
    allow: []
sandboxes:
  ci-bot: {{policy: ci, key_sha256: "{key_digest('never-used-ci-key')}"}}
  other-bot: {{policy: other, key_sha256: "{key_digest('never-used-other-key')}"}}
""")
    store = where / "secrets.yaml"
    store.write_text(f"api: {CANARY}\n")
    os.chmod(store, 0o600)
    port = free_port()
    stderr = where / "mcp.stderr"
    with stderr.open("wb") as err:
        server = subprocess.Popen(
            [*SEALGATE, "mcp", "serve", "--listen", f"{GATEWAY}:{port}", "--rules", str(rules),
             "--state", str(dproxy.state), "--resolver", f"{dns.address[0]}:{dns.address[1]}",
             "--upstream-ca", str(test_ca.path), "--secret-store", f"file:{store}",
             "--audit-log", str(where / "audit.log")],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_ready(server, stderr)
        yield port
    finally:
        end(server)
    said = stderr.read_text(errors="replace") + (where / "audit.log").read_text()
    assert CANARY not in said and "Traceback" not in said, said


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


def test_a_sandbox_calls_its_tools_with_nothing_configured(
        mcp_daemon: Daemon, mcp_port: int, origin_https: Origin) -> None:
    origin_https.reset()
    with Sandbox.create("ci-bot", daemon=str(mcp_daemon.socket)) as sb:
        url, (listed, called), _ = raw_calls(sb, [
            ("tools/list", None, {}), ("tools/call", "ping", {"name": "ping", "arguments": {}})])
        assert url == f"http://{GATEWAY}:{mcp_port}/mcp"
        assert [t["name"] for t in listed["body"]["result"]["tools"]] == ["ping", "whoami"]
        assert called["body"]["result"]["isError"] is False, called
        assert "hello from origin" in json.dumps(called["body"]["result"]["content"])
        # The endpoint is reached directly: the proxy's variables leave it out.
        assert GATEWAY in sb.run(["sh", "-c", "echo $NO_PROXY"]).text
    assert [r.path for r in origin_https.requests] == ["/from-mcp-tool"]
    with Sandbox.create("other-bot", daemon=str(mcp_daemon.socket)) as other:
        # Known by its address: its policy declares no tool and no http_request (a policy
        # offers the generic tool only when it declares it), and ping is no tool of its.
        _, (listed, called), _ = raw_calls(other, [
            ("tools/list", None, {}),
            ("tools/call", "ping", {"name": "ping", "arguments": {}})])
        assert listed["body"]["result"]["tools"] == [], listed
        assert called["status"] == 400, called
        assert called["body"]["error"]["message"] == "no tool named 'ping'", called
    assert [r.path for r in origin_https.requests] == ["/from-mcp-tool"]


def test_an_agent_with_the_official_sdk_calls_an_authenticated_api(
        mcp_daemon: Daemon, mcp_port: int, origin_https: Origin, dproxy: Proxy) -> None:
    """#29's end to end: an agent in a sandbox, with the `mcp` SDK's own client and nothing
    configured but the URL the sandbox was told, calls a declared tool whose API needs a key;
    the key arrives at the API and never in the sandbox (its answers, its environment, what it
    printed), while the API's echo of it comes back masked."""
    origin_https.reset()
    origin_https.echo = True  # the API answers with the headers it got, as a debug endpoint
    try:
        with Sandbox.create("ci-bot", daemon=str(mcp_daemon.socket)) as sb:
            got = sdk_client(sb, [
                {"list": True},
                {"call": "whoami", "arguments": {"user": "octo"}},
                {"call": "whoami", "arguments": {"user": "../../admin"}},
                {"call": "nonesuch", "arguments": {}}])
            env = sb.run(["env"])
    finally:
        origin_https.echo = False
    assert got["url"] == f"http://{GATEWAY}:{mcp_port}/mcp", got
    assert "2026-07-28" in got["discovered"]["versions"], got
    listed, whoami, traversal, unknown = got["steps"]
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert set(tools) == {"ping", "whoami"}
    assert tools["whoami"]["inputSchema"]["required"] == ["user"]
    # The API got the key; the agent reads the echo of it masked.
    assert whoami["result"]["is_error"] is False, whoami
    echoed = json.loads(whoami["result"]["text"])
    assert echoed["path"] == "/whoami/octo"
    # (masked to the secret's length: a scrubbed stream keeps its framing)
    assert echoed["headers"]["Authorization"].startswith("Bearer [REDACTED]"), echoed
    # An argument against the tool's schema: an error result, nothing sent.
    assert traversal["result"]["is_error"] is True, traversal
    assert "user" in traversal["result"]["text"], traversal
    assert "error" in unknown and "nonesuch" in unknown["error"]["message"], unknown
    seen = [(r.path, r.headers.get("authorization")) for r in origin_https.requests]
    assert seen == [("/whoami/octo", f"Bearer {CANARY}")], seen
    assert CANARY not in json.dumps(got)
    assert env.ok and CANARY not in env.text and f"{GATEWAY}:{mcp_port}" in env.text
    said = [mcp_daemon.log.read_text(errors="replace"), dproxy.audit_text()]
    assert not any(CANARY in text for text in said)


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
