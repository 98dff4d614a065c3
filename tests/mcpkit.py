"""`sealgate mcp serve` as a real process, and the official MCP client against it.

The server is started through the tests' own `sealgate` command, which execs the MCP
virtualenv's python (var/mcp-venv, `make deps`), as a user starts it. The client is
tests/mcpclient.py, run by that same python. Without that virtualenv the tests that need it
skip, saying so.
"""

from __future__ import annotations

import base64
import json
import os
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


