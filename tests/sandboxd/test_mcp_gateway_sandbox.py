"""The gateway to upstream MCP servers (#29) from inside a real sandbox: `sealgate mcp serve` on
the sandboxes' gateway (the one port `sandboxd --mcp-port` lets through, whose `/mcp/<server>`
is the gateway's route), fronting an upstream MCP server made with the official SDK
(tests/mcpkit.py) over HTTPS on loopback. A stdlib client in the sandbox lists and calls tools
at `$SEALGATE_MCP_URL/docs`, known by its address, holding no credential: the upstream gets the
bearer the rules inject (a canary from a file secret store) and the call's arguments; the
agent's answers carry no canary (the upstream's echo of it is scrubbed); a tool the rules do not
list is refused with nothing sent; and the canary is nowhere in the sandbox's environment, in
what its commands printed, or in the gateway's, the proxy's or the daemon's logs. The sandbox
cannot reach the upstream itself: the proxy's policy does not allow it and a direct connection
gets nowhere, while the same probes reach what is allowed (the control that they can succeed).
The gateway's allowing rule is `tools_only` (docs/rules.md), as every rule injecting an MCP
server's credential should be: without it, a proxy given the same rules would let the sandbox
POST to the upstream itself, the credential injected, any tool of the upstream's
(tests/integration/test_tools_only.py checks that at the origin).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sealgate.sandbox.clients.client import Sandbox
from tests.dnsstub import StubDNS
from tests.harness import ROOT, SEALGATE, Origin, OriginCA, Proxy, end, free_port, key_digest
from tests.mcpkit import Upstream, needs_mcp_venv
from tests.mcpsandbox import Step, raw_calls, sdk_client

from .conftest import GATEWAY, Daemon, start_daemon

pytestmark = needs_mcp_venv()

CANARY = "CANARY-gwsbx-upstream-bearer-7d41c9e2"
LISTED = {"echo", "whoami", "search"}  # of the upstream's echo, whoami, search, delete_repo, ...


def _rules(port: int) -> str:
    return f"""
version: 1
policies:
  ci:
    allow:
      - host: mcp.test
        ports: [{port}]
        methods: [POST]
        paths: ["/mcp"]
        tools_only: true
        inject:
          - {{secret: "file:upstream", as: bearer, name: upstream}}
    allow_networks: [127.0.0.1/32]
    mcp_servers:
      - name: docs
        url: https://mcp.test:{port}/mcp
        credential: upstream
        tools:
          - name: echo
          - name: whoami
          - name: search
            arguments:
              repo: {{equals: octo/docs}}
        timeout: 20
  other:
    allow: []
sandboxes:
  ci-bot: {{policy: ci, key_sha256: "{key_digest('never-used-ci-key')}"}}
  other-bot: {{policy: other, key_sha256: "{key_digest('never-used-other-key')}"}}
"""


@dataclass
class Gateway:
    port: int
    upstream: Upstream
    workdir: Path
    stderr: Path
    audit: Path

    def lines(self) -> list[dict[str, Any]]:
        text = self.audit.read_text() if self.audit.exists() else ""
        return [line for line in map(json.loads, text.splitlines())
                if line.get("event") == "mcp_gateway"]

    def wait_lines(self, count: int) -> list[dict[str, Any]]:
        """The audit's gateway lines once there are `count` (bounded: a line is written in the
        event loop's turn after its answer went out)."""
        deadline = time.monotonic() + 10
        while len(found := self.lines()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return found


class Exposed:
    """The upstream reachable on the sandboxes' gateway address too (the host, as a sandbox
    sees it), but for the firewall: every connection taken is recorded and its bytes carried
    to the upstream on loopback."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.peers: list[str] = []
        self.listener = socket.create_server((GATEWAY, 0))
        self.listener.settimeout(0.2)
        self.port = int(self.listener.getsockname()[1])
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, peer = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.peers.append(str(peer[0]))
            threading.Thread(target=self._carry, args=(conn,), daemon=True).start()

    def _carry(self, conn: socket.socket) -> None:
        deadline = time.monotonic() + 30
        with conn, socket.create_connection(("127.0.0.1", self.target), timeout=10) as up:
            other = {conn: up, up: conn}
            while time.monotonic() < deadline and not self.stopping.is_set():
                ready, _, _ = select.select(list(other), [], [], 0.2)
                for side in ready:
                    data = side.recv(65536)
                    if not data:
                        return
                    other[side].sendall(data)

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
             ) -> Iterator[Upstream]:
    dns.set("mcp.test", "A 127.0.0.1")
    started = Upstream(tmp_path_factory.mktemp("gwsbx-upstream"), test_ca.issue("mcp.test"),
                       "json")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def exposed(dproxy: Proxy, upstream: Upstream) -> Iterator[Exposed]:
    started = Exposed(upstream.port)  # on the gateway's address, there once dproxy is
    yield started
    started.stop()


@pytest.fixture(scope="module")
def mcp_gateway(dproxy: Proxy, upstream: Upstream, dns: StubDNS, test_ca: OriginCA,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    where = tmp_path_factory.mktemp("gwsbx-serve")
    rules = where / "rules.yaml"
    rules.write_text(_rules(upstream.port))
    store = where / "secrets.yaml"
    store.write_text(f"upstream: {CANARY}\n")
    os.chmod(store, 0o600)
    port = free_port()
    started = Gateway(port, upstream, where, where / "mcp.stderr", where / "audit.log")
    with started.stderr.open("wb") as err:
        # `serve` on the gateway: the port a sandbox's firewall lets through (--mcp-port), its
        # /mcp/<server> the gateway's route, callers known by the proxy's source registry.
        server = subprocess.Popen(
            [*SEALGATE, "mcp", "serve", "--listen", f"{GATEWAY}:{port}", "--rules", str(rules),
             "--state", str(dproxy.state), "--resolver", f"{dns.address[0]}:{dns.address[1]}",
             "--upstream-ca", str(test_ca.path), "--secret-store", f"file:{store}",
             "--audit-log", str(started.audit)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 30
        while "sealgate mcp ready" not in started.stderr.read_text(errors="replace"):
            assert server.poll() is None and time.monotonic() < deadline, \
                started.stderr.read_text()
            time.sleep(0.05)
        yield started
    finally:
        end(server)
    said = started.stderr.read_text(errors="replace")
    assert CANARY not in said and CANARY not in started.audit.read_text()
    assert "Traceback" not in said, said


@pytest.fixture(scope="module")
def daemon(dproxy: Proxy, mcp_gateway: Gateway, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Daemon]:
    started = start_daemon(dproxy, tmp_path_factory.mktemp("gwsbx-sandboxd"), "--pool", "0",
                           "--mcp-port", str(mcp_gateway.port), "--no-selftest")
    yield started
    started.stop()
    assert CANARY not in started.log.read_text(errors="replace")


def _calls(sb: Sandbox, server: str, steps: list[Step]) -> tuple[str, list[dict[str, Any]]]:
    url, answers, ran = raw_calls(sb, steps, f"/{server}")
    printed = ran.stdout + ran.stderr
    assert CANARY.encode() not in printed, printed  # nothing the sandbox's command printed
    return url, answers


def _text(answer: dict[str, Any]) -> str:
    assert answer["status"] == 200, answer
    result = answer["body"]["result"]
    assert result["isError"] is False, answer
    return "".join(part["text"] for part in result["content"] if part["type"] == "text")


def test_a_sandbox_calls_an_upstream_through_the_gateway_without_its_credential(
        daemon: Daemon, mcp_gateway: Gateway, dproxy: Proxy) -> None:
    upstream = mcp_gateway.upstream
    before = len(upstream.requests())
    asked = "from-the-sandbox-5e0a"
    with Sandbox.create("ci-bot", daemon=str(daemon.socket)) as sb:
        url, answers = _calls(sb, "docs", [
            ("tools/list", None, {}),
            ("tools/call", "echo", {"name": "echo", "arguments": {"text": asked}}),
            ("tools/call", "whoami", {"name": "whoami", "arguments": {}}),
            ("tools/call", "search", {"name": "search",
                                      "arguments": {"repo": "octo/docs", "query": "how"}}),
            ("tools/call", "delete_repo", {"name": "delete_repo",
                                           "arguments": {"repo": "octo/docs"}}),
            ("tools/call", "search", {"name": "search",
                                      "arguments": {"repo": "octo/secret", "query": "how"}})])
        env = sb.run(["env"])
    assert url == f"http://{GATEWAY}:{mcp_gateway.port}/mcp/docs"
    listed, echo, whoami, search, unlisted, constrained = answers
    # Only the listed tools are seen: delete_repo and the rest of the upstream's filtered out.
    assert {tool["name"] for tool in listed["body"]["result"]["tools"]} == LISTED, listed
    assert _text(echo) == asked
    assert _text(search) == "searched octo/docs for how"
    # The upstream said the bearer it got; the agent reads it masked, and nowhere else.
    assert _text(whoami).startswith("you called with Bearer [REDACTED]"), whoami
    assert CANARY not in json.dumps(answers)
    # A tool the rules do not list: a JSON-RPC error; an argument against its constraint: an
    # error result naming the argument, not its value. Neither reached the upstream.
    assert unlisted["body"]["error"]["code"] == -32602, unlisted
    assert "delete_repo" in unlisted["body"]["error"]["message"]
    refused = constrained["body"]["result"]
    assert refused["isError"] and "tool_arguments_invalid" in json.dumps(refused), constrained
    assert "octo/secret" not in json.dumps(refused)

    # What the upstream received: the injected bearer on every request, the call's arguments,
    # only the allowed calls, and nothing of the sandbox but the message.
    seen = upstream.requests()[before:]
    assert seen and all(r["headers"].get("authorization") == f"Bearer {CANARY}"
                        for r in seen), seen
    calls = [json.loads(r["body"])["params"] for r in seen
             if json.loads(r["body"]).get("method") == "tools/call"]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("echo", {"text": asked}), ("whoami", {}),
        ("search", {"repo": "octo/docs", "query": "how"})]
    assert "delete_repo" not in json.dumps(seen) and "octo/secret" not in json.dumps(seen)
    assert all(r["headers"].get("host") == f"mcp.test:{upstream.port}" for r in seen)

    # The sandbox holds no credential: not in its environment, which names the endpoint.
    assert env.ok and f"SEALGATE_MCP_URL=http://{GATEWAY}:{mcp_gateway.port}/mcp" in env.text
    assert CANARY not in env.text and CANARY.encode() not in env.stderr

    lines = mcp_gateway.wait_lines(6)
    assert {(line["sandbox"], line["identified_by"], line["server"]) for line in lines} == {
        ("ci-bot", "source", "docs")}, lines
    by_tool = {line["tool"]: line for line in lines if line["method"] == "tools/call"}
    assert by_tool["whoami"]["injected"] == ["broker:file:upstream"], by_tool
    assert by_tool["whoami"]["scrubbed"] >= 1
    assert (by_tool["delete_repo"]["decision"], by_tool["delete_repo"]["reason"]) == (
        "deny", "not_allowed")
    logged = [mcp_gateway.audit.read_text(), mcp_gateway.stderr.read_text(errors="replace"),
              daemon.log.read_text(errors="replace"), dproxy.audit_text()]
    assert all(logged) and not any(CANARY in text for text in logged)


def test_an_agent_with_the_official_sdk_calls_through_the_gateway(
        daemon: Daemon, mcp_gateway: Gateway) -> None:
    """#29's end to end through the gateway: the `mcp` SDK's own client in a sandbox, told
    only $SEALGATE_MCP_URL, lists and calls the upstream's tools; the upstream gets its bearer,
    the agent never does."""
    upstream = mcp_gateway.upstream
    before = len(upstream.requests())
    with Sandbox.create("ci-bot", daemon=str(daemon.socket)) as sb:
        got = sdk_client(sb, [
            {"list": True},
            {"call": "whoami", "arguments": {}},
            {"call": "echo", "arguments": {"text": "from-the-sdk-93c1"}},
            {"call": "delete_repo", "arguments": {"repo": "octo/docs"}}], route="/docs")
    assert got["url"] == f"http://{GATEWAY}:{mcp_gateway.port}/mcp/docs", got
    listed, whoami, echo, unlisted = got["steps"]
    assert {tool["name"] for tool in listed["tools"]} == LISTED, listed
    assert whoami["result"]["text"].startswith("you called with Bearer [REDACTED]"), whoami
    assert (echo["result"]["text"], echo["result"]["is_error"]) == ("from-the-sdk-93c1", False)
    assert "delete_repo" in unlisted["error"]["message"], unlisted
    assert CANARY not in json.dumps(got)
    seen = upstream.requests()[before:]
    assert seen and all(r["headers"].get("authorization") == f"Bearer {CANARY}"
                        for r in seen), seen
    assert upstream.called()[-2:] == ["whoami", "echo"]
    assert "delete_repo" not in json.dumps(seen)


def test_another_policys_sandbox_has_no_such_server(daemon: Daemon, mcp_gateway: Gateway) -> None:
    before = len(mcp_gateway.upstream.requests())
    with Sandbox.create("other-bot", daemon=str(daemon.socket)) as sb:
        _, [listed] = _calls(sb, "docs", [("tools/list", None, {})])
    assert listed["status"] == 404 and "no MCP server named" in json.dumps(listed), listed
    assert len(mcp_gateway.upstream.requests()) == before


# curl in the sandbox (it trusts the proxy's CA; -k for the direct tries, which would meet the
# upstream's test certificate): one line of what became of each try.
_PROBE = """
set -f  # the flags word-split, never globbed
for target in "$@"; do
  case "$target" in
    direct:*) url=${target#direct:}; flags="--noproxy * -k" ;;
    *) url=$target; flags="" ;;
  esac
  code=$(curl -sS -m 10 --connect-timeout 5 -o /dev/null -w '%{http_code}' $flags "$url" \
         2>/dev/null)
  echo "$target $? $code"
done
"""


def test_the_sandbox_cannot_reach_the_upstream_itself(
        daemon: Daemon, mcp_gateway: Gateway, dproxy: Proxy, origin_https: Origin,
        exposed: Exposed) -> None:
    upstream = mcp_gateway.upstream
    before = len(upstream.requests())
    port = upstream.port
    tries = {
        "proxied": f"https://mcp.test:{port}/mcp",                 # through the proxy's policy
        "loopback": f"direct:https://127.0.0.1:{port}/mcp",        # the sandbox's own loopback
        "gateway": f"direct:https://{GATEWAY}:{exposed.port}/mcp",  # the host, past its firewall
        # The controls: the same tries reach what is allowed.
        "allowed": f"https://api.test:{origin_https.port}/from-gwsbx",
        "endpoint": f"direct:http://{GATEWAY}:{mcp_gateway.port}/mcp/docs",
    }
    with Sandbox.create("ci-bot", daemon=str(daemon.socket)) as sb:
        ran = sb.run(["sh", "-c", _PROBE, "probe", *tries.values()], timeout=90)
    assert ran.ok, ran
    assert CANARY.encode() not in ran.stdout + ran.stderr
    got = {name: line.split(" ", 2)[1:] for name, line in zip(tries, ran.text.splitlines(),
                                                               strict=True)}
    # The controls: a proxied request to an allowed origin, and a direct one to the gateway's
    # port (its refusal of a GET: the port is open, the MCP server there).
    assert got["allowed"][0] == "0" and got["allowed"][1].startswith("2"), got
    assert got["endpoint"][0] == "0" and got["endpoint"][1].startswith("4"), got
    # The upstream: refused by the proxy (its 403), else no answer at all (000: curl got no
    # HTTP status; the upstream would answer any request of curl's, 200 or 4xx).
    assert got["proxied"][1] == "403", got
    for name in ("loopback", "gateway"):
        assert got[name][0] != "0" and got[name][1] == "000", (name, got)
    denied = dproxy.wait_audit(lambda e: e.get("host") == "mcp.test"
                               and e.get("sandbox") == "ci-bot", timeout=10)
    assert denied["decision"] == "deny", denied
    assert exposed.peers == []  # not a connection from the sandbox
    assert len(upstream.requests()) == before  # nothing of the sandbox's reached it
