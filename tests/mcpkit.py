"""`sealgate mcp serve` (or `gateway`) as a real process, the official MCP client against it,
and an upstream MCP server made with the SDK for the gateway to front (`Upstream`).

The server is started through the tests' own `sealgate` command, which execs the MCP
virtualenv's python (var/mcp-venv, `make deps`), as a user starts it. The client is
tests/mcpclient.py, run by that same python. Without that virtualenv the tests that need it
skip, saying so.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ROOT, SEALGATE, end, free_port

MCP_PYTHON = ROOT / "var" / "mcp-venv" / "bin" / "python"
CLIENT = ROOT / "tests" / "mcpclient.py"
PROTOCOL = "2026-07-28"


def needs_mcp_venv() -> pytest.MarkDecorator:
    return pytest.mark.skipif(not MCP_PYTHON.exists(),
                              reason=f"no {MCP_PYTHON.relative_to(ROOT)}: run `make deps`")


def basic(sandbox: str, key: str) -> str:
    return "Basic " + base64.b64encode(f"{sandbox}:{key}".encode()).decode()


class McpServer:
    def __init__(self, workdir: Path, rules: str, *, resolver: tuple[str, int],
                 upstream_ca: Path, secrets: dict[str, str] | None = None,
                 extra: list[str] | None = None, command: str = "serve") -> None:
        self.workdir = workdir
        self.state = workdir / "state"
        self.state.mkdir(parents=True, exist_ok=True)
        self.rules = workdir / "rules.yaml"
        self.rules.write_text(rules)
        store = workdir / "secrets.yaml"
        store.write_text("".join(f"{k}: {v}\n" for k, v in (secrets or {}).items()))
        os.chmod(store, 0o600)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.stderr_path = workdir / "mcp.stderr"
        self._stderr = self.stderr_path.open("wb")
        # What a stdio server of the same rules, state and stores is started with (`stdio`).
        self.options = ["--rules", str(self.rules), "--state", str(self.state),
                        "--resolver", f"{resolver[0]}:{resolver[1]}", "--upstream-ca",
                        str(upstream_ca), "--secret-store", f"file:{store}", *(extra or [])]
        self.process = subprocess.Popen(
            [*SEALGATE, "mcp", command, "--listen", f"127.0.0.1:{self.port}", *self.options],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self._stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 30
        ready = "sealgate mcp gateway ready" if command == "gateway" else "sealgate mcp ready"
        while ready not in self.stderr():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sealgate mcp {command} did not start: {self.stderr()}")
            time.sleep(0.05)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def audit_text(self) -> str:
        path = self.state / "audit.log"
        return path.read_text() if path.exists() else ""

    def calls(self) -> list[dict[str, Any]]:
        return [line for line in map(json.loads, self.audit_text().splitlines())
                if line.get("event") == "tool_call"]

    def client(self, steps: list[dict[str, Any]], authorization: str | None = None,
               url: str | None = None) -> tuple[dict[str, Any], str]:
        """The official client's run of `steps` (against `url`, by default the server's
        endpoint): its JSON answer, and all it printed."""
        plan = {"url": url or self.url, "authorization": authorization, "steps": steps}
        done = subprocess.run([str(MCP_PYTHON), "-P", str(CLIENT)], input=json.dumps(plan),
                              capture_output=True, text=True, timeout=90, check=False)
        printed = done.stdout + done.stderr
        assert done.returncode == 0, printed
        return json.loads(done.stdout), printed

    def stdio(self, steps: list[dict[str, Any]], *flags: str) -> tuple[dict[str, Any], str]:
        """The official client starting `sealgate mcp serve --stdio FLAGS` itself and running
        `steps` over its pipes: its JSON answer, and all the client and the server printed."""
        errlog = self.workdir / "stdio.stderr"
        plan = {"command": [*SEALGATE, "mcp", "serve", "--stdio", *flags, *self.options],
                "cwd": str(ROOT), "stderr": str(errlog), "steps": steps}
        done = subprocess.run([str(MCP_PYTHON), "-P", str(CLIENT)], input=json.dumps(plan),
                              capture_output=True, text=True, timeout=90, check=False)
        printed = done.stdout + done.stderr + errlog.read_text(errors="replace")
        assert done.returncode == 0, printed
        return json.loads(done.stdout), printed

    def post(self, body: bytes, headers: dict[str, str] | None = None,
             timeout: float = 10, url: str | None = None
             ) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
        """One raw POST: the status, the JSON body (None if not JSON) and the headers."""
        import requests

        answer = requests.post(url or self.url, data=body, headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            **(headers or {})}, timeout=timeout)
        try:
            parsed = answer.json()
        except ValueError:
            parsed = None
        return answer.status_code, parsed, {k.lower(): v for k, v in answer.headers.items()}

    def stop(self) -> None:
        end(self.process)
        self._stderr.close()


def rpc(method: str, params: dict[str, Any] | None = None, id: Any = 1) -> dict[str, Any]:
    """A 2026-07-28 request: its envelope in params._meta, as the SDK's client sends it."""
    meta = {"io.modelcontextprotocol/protocolVersion": PROTOCOL,
            "io.modelcontextprotocol/clientCapabilities": {}}
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": {**(params or {}),
                                                                       "_meta": meta}}


def rpc_headers(method: str, name: str | None = None, **more: str) -> dict[str, str]:
    headers = {"MCP-Protocol-Version": PROTOCOL, "Mcp-Method": method, **more}
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


# An upstream MCP server made with the SDK (for the gateway's tests), logging every request it
# gets (headers, body); mode `json` answers JSON, `sse` every answer as an SSE stream.
UPSTREAM = r'''
import json, sys
import uvicorn
from mcp.server import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

port, cert, key, mode, log_path = sys.argv[1:6]
seen = {"authorization": None}
server = MCPServer("upstream")


@server.tool()
def echo(text: str) -> str:
    """Says the text back."""
    return text


@server.tool()
def whoami() -> str:
    """The Authorization this server was called with (a debug tool that leaks it)."""
    return f"you called with {seen['authorization']}"


@server.tool()
def search(repo: str, query: str) -> str:
    """Searches a repository."""
    return f"searched {repo} for {query}"


@server.tool()
def delete_repo(repo: str) -> str:
    """Not listed by the rules: never seen, never called."""
    return f"deleted {repo}"


@server.tool()
async def slow() -> str:
    """Answers after 5 s."""
    import anyio
    await anyio.sleep(5)
    return "late"


@server.tool()
def ask() -> str:
    """Needs the user's answer first (answered by `recorded`, below)."""
    return "never"


@server.tool()
def big() -> str:
    """An answer over the gateway's cap."""
    return "x" * 200000


app = server.streamable_http_app(
    json_response=(mode == "json"), stateless_http=True,
    transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))


ASKING = {"resultType": "input_required", "requestState": "upstream-state-5d1c",
          "inputRequests": {"q": {"method": "elicitation/create", "params": {
              "message": "Which repository?", "requestedSchema": {
                  "type": "object", "properties": {"repo": {"type": "string"}}}}}}}


async def recorded(scope, receive, send):
    if scope["type"] != "http":
        await app(scope, receive, send)
        return
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    seen["authorization"] = headers.get("authorization")
    chunks, more = [], True
    while more:  # the whole body first: a call of `ask` is answered here
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replayed = [{"type": "http.request", "body": body, "more_body": False}]

    async def again():
        return replayed.pop() if replayed else await receive()

    try:
        call = json.loads(body or b"null")
        params = call.get("params") if isinstance(call, dict) else None
        if isinstance(call, dict) and call.get("id") == 77:
            # Hostile answers for the id 77: a tool named by an object in a list, a lone
            # surrogate (JSON's escape can spell one; no UTF-8 can carry it) in a result.
            result = ('{"tools": [{"name": {"not": "a string"}}, {"name": "echo", '
                      '"inputSchema": {"type": "object"}}]}' if call.get("method") == "tools/list"
                      else '{"content": [{"type": "text", "text": "odd \\ud800"}]}')
            answer = f'{{"jsonrpc": "2.0", "id": 77, "result": {result}}}'.encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": answer})
            return
        if isinstance(params, dict) and params.get("name") == "ask":
            # What a 2026-07-28 server answers when its tool needs the user (elicitation):
            # an InputRequiredResult, the wire shape of mcp_types.InputRequiredResult.
            answer = json.dumps({"jsonrpc": "2.0", "id": call.get("id"),
                                 "result": ASKING}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": answer})
            return
        await app(scope, again, send if mode == "json" else streamed(send))
    finally:
        with open(log_path, "a") as log:
            log.write(json.dumps({"headers": headers,
                                  "body": body.decode("utf-8", "replace")}) + "\n")


def streamed(send):
    """The SDK's JSON answer sent as the SSE stream a server whose handler logs would send (the
    SDK streams only once a handler emits, or after 15 s): a ping, a log notification that
    leaks the Authorization this server got, then the answer."""
    answer = {"json": False, "body": b""}

    async def framed(message):
        if message["type"] == "http.response.start":
            kind = dict(message.get("headers", [])).get(b"content-type", b"")
            if message["status"] == 200 and kind.startswith(b"application/json"):
                answer["json"] = True
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"text/event-stream")]})
                return
        elif message["type"] == "http.response.body" and answer["json"]:
            answer["body"] += message.get("body", b"")
            if not message.get("more_body"):
                note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {
                    "level": "info", "data": f"called with {seen['authorization']}"}}
                await send({"type": "http.response.body", "more_body": False, "body": (
                    b": ping\r\n\r\nevent: message\r\ndata: " + json.dumps(note).encode()
                    + b"\r\n\r\nevent: message\r\ndata: " + answer["body"] + b"\r\n\r\n")})
            return
        await send(message)

    return framed


uvicorn.run(recorded, host="127.0.0.1", port=int(port), ssl_certfile=cert, ssl_keyfile=key,
            log_level="warning", lifespan="on")
'''


class Upstream:
    def __init__(self, workdir: Path, cert: tuple[Path, Path], mode: str) -> None:
        self.port = free_port()
        self.log = workdir / f"upstream-{mode}.jsonl"
        script = workdir / "upstream.py"
        script.write_text(UPSTREAM)
        self.stderr = (workdir / f"upstream-{mode}.stderr").open("wb")
        self.process = subprocess.Popen(
            [str(MCP_PYTHON), "-P", str(script), str(self.port), str(cert[0]), str(cert[1]),
             mode, str(self.log)], cwd=workdir, stdout=subprocess.DEVNULL, stderr=self.stderr)
        deadline = time.monotonic() + 30
        while not self._listening():
            assert self.process.poll() is None and time.monotonic() < deadline, \
                "the upstream MCP server did not start"
            time.sleep(0.1)

    def _listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def requests(self) -> list[dict[str, Any]]:
        text = self.log.read_text() if self.log.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def called(self) -> list[str]:
        """The tools the upstream was asked to call, in order."""
        names = []
        for seen in self.requests():
            body = json.loads(seen["body"] or "null")
            if isinstance(body, dict) and body.get("method") == "tools/call":
                names.append(body["params"]["name"])
        return names

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.stderr.close()
