"""Bad input at `sealgate mcp serve`'s endpoint, sent raw (issue 29): malformed JSON-RPC, a batch,
an unknown method, an oversized message, an `Mcp-Name` or `Mcp-Method` that disagrees with the
body, a tool name with control characters, no or another protocol revision, an Origin. Each is
a clear JSON-RPC error, the server stays up, and nothing reaches the API: no tool is called.
"""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import KEYS
from tests.dnsstub import StubDNS
from tests.harness import Origin, OriginCA, key_digest
from tests.mcpkit import McpServer, basic, needs_mcp_venv, rpc, rpc_headers

pytestmark = needs_mcp_venv()

CANARY = "mcp-protocol-canary-77aa"
AUTH = {"Authorization": basic("bot-1", KEYS["bot-1"])}
LIMIT = 4096


@pytest.fixture(scope="module")
def api(test_ca: OriginCA) -> Iterator[Origin]:
    origin = Origin(tls=test_ca.issue("api.test"), echo=True)
    yield origin
    origin.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, api: Origin, dns: StubDNS,
           test_ca: OriginCA) -> Iterator[McpServer]:
    rules = f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{api.port}]
        inject: [{{secret: "file:k", as: bearer, name: k}}]
    allow_networks: [127.0.0.1/32]
    tools:
      - name: echo
        description: The API's echo.
        method: GET
        url: https://api.test:{api.port}/echo
        credential: k
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
"""
    started = McpServer(tmp_path_factory.mktemp("mcp-protocol"), rules, resolver=dns.address,
                        upstream_ca=test_ca.path, secrets={"k": CANARY},
                        extra=["--max-body", str(LIMIT)])
    yield started
    started.stop()
    assert CANARY not in started.audit_text() + started.stderr()
    assert "Traceback" not in started.stderr(), started.stderr()


def _call(name: str = "echo") -> dict[str, Any]:
    return rpc("tools/call", {"name": name, "arguments": {}})


def _post(server: McpServer, body: Any, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, answer, _ = server.post(raw, {**AUTH, **headers})
    assert answer is not None and answer.get("jsonrpc") == "2.0", (status, answer)
    return status, answer


def test_a_well_formed_call_goes_through(server: McpServer, api: Origin) -> None:
    api.reset()
    status, answer = _post(server, _call(), rpc_headers("tools/call", "echo"))
    assert status == 200 and answer["result"]["isError"] is False
    assert CANARY not in json.dumps(answer) and len(api.requests) == 1


@pytest.mark.parametrize(("body", "headers", "status", "code", "said"), [
    (b"{not json", rpc_headers("tools/call", "echo"), 400, -32700, "Parse error"),
    # Found by review: Python's json takes NaN, which passes any JSON Schema bound, and a
    # message nested past what the audit's masking could walk went upstream unaudited.
    ({**_call(), "params": {"name": "echo", "arguments": {"n": float("nan")}}},
     rpc_headers("tools/call", "echo"), 400, -32700, "NaN and Infinity are not JSON"),
    ({**_call(), "params": {"name": "echo", "arguments": {"deep": json.loads("[" * 70 + "]" * 70)
                                                          }}},
     rpc_headers("tools/call", "echo"), 400, -32700, "nested deeper than 64"),
    # Found by review: a lone surrogate (a \\ud800 escape alone) is no Unicode text; it went
    # as far as the answer's encoding and came back as internal_error.
    (json.dumps(rpc("tools/call", {"name": "echo", "arguments": {"t": "SURROGATE"}})).replace(
        '"SURROGATE"', '"\\ud800"').encode(), rpc_headers("tools/call", "echo"), 400, -32700,
     "lone surrogate"),
    ([_call(), _call()], rpc_headers("tools/call", "echo"), 400, -32600, "batch"),
    ({"jsonrpc": "1.0", "id": 1, "method": "tools/call"}, rpc_headers("tools/call", "echo"), 400,
     -32600, "JSON-RPC 2.0"),
    ({"jsonrpc": "2.0", "id": {"x": 1}, "method": "tools/call"},
     rpc_headers("tools/call", "echo"), 400, -32600, "request id"),
    (rpc("resources/list"), rpc_headers("resources/list"), 404, -32601, "Method not found"),
    (rpc("initialize"), rpc_headers("initialize"), 404, -32601, "Method not found"),
    (rpc("ping"), rpc_headers("ping"), 404, -32601, "Method not found"),
    (_call(), rpc_headers("tools/call", "other"), 400, -32020, "Mcp-Name"),
    (_call(), rpc_headers("tools/call"), 400, -32020, "Mcp-Name"),  # none at all
    (_call(), rpc_headers("tools/call", "=?base64?" + base64.b64encode(b"ech0").decode() + "?="),
     400, -32020, "Mcp-Name"),
    (_call(), rpc_headers("tools/list", "echo"), 400, -32020, "Mcp-Method"),
    (_call("ec\x07ho"), rpc_headers("tools/call", "echo"), 400, -32602, "name of a tool"),
    (_call("echo\n"), rpc_headers("tools/call", "echo"), 400, -32602, "name of a tool"),
    (_call(), {"Mcp-Method": "tools/call", "Mcp-Name": "echo"}, 400, -32022,
     "Unsupported protocol version"),
    (_call(), rpc_headers("tools/call", "echo", **{"MCP-Protocol-Version": "2025-06-18"}), 400,
     -32022, "Unsupported protocol version"),
    (_call(), rpc_headers("tools/call", "echo", Origin="https://evil.example"), 403, -32600,
     "Origin"),
    ({**_call(), "params": {"name": "echo", "arguments": {"pad": "x" * LIMIT}}},
     rpc_headers("tools/call", "echo"), 413, -32600, f"at most {LIMIT} bytes"),
])
def test_bad_input_is_a_clear_json_rpc_error_and_calls_nothing(
        server: McpServer, api: Origin, body: Any, headers: dict[str, str], status: int,
        code: int, said: str) -> None:
    api.reset()
    calls = len(server.calls())
    got_status, answer = _post(server, body, headers)
    assert (got_status, answer["error"]["code"]) == (status, code), answer
    assert said in answer["error"]["message"]
    assert api.untouched() and len(server.calls()) == calls
    # And the server is still there for the next one.
    assert _post(server, rpc("tools/list"), rpc_headers("tools/list"))[0] == 200


def test_a_base64_mcp_name_that_agrees_is_taken(server: McpServer, api: Origin) -> None:
    api.reset()
    encoded = "=?base64?" + base64.b64encode(b"echo").decode() + "?="
    status, answer = _post(server, _call(), rpc_headers("tools/call", encoded))
    assert status == 200 and answer["result"]["isError"] is False


def test_a_streamed_body_past_the_cap_is_refused(server: McpServer, api: Origin) -> None:
    import requests

    api.reset()

    def chunks() -> Iterator[bytes]:
        yield b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"x": "'
        for _ in range(8):
            yield b"y" * 1024

    answer = requests.post(server.url, data=chunks(), timeout=10, headers={
        **AUTH, **rpc_headers("tools/call", "echo"), "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream"})
    assert answer.status_code == 413 and answer.json()["error"]["code"] == -32600
    assert api.untouched()


def test_a_body_that_never_comes_is_answered_408(server: McpServer, api: Origin) -> None:
    """Found by review: with no deadline on the body, a sandbox holding open requests whose
    bodies never come could take every one of the server's connections."""
    api.reset()
    head = "".join(f"{k}: {v}\r\n" for k, v in {
        **AUTH, **rpc_headers("tools/call", "echo"), "Content-Type": "application/json",
        "Content-Length": "100", "Host": "127.0.0.1"}.items())
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall(f"POST /mcp HTTP/1.1\r\n{head}\r\n".encode() + b'{"jsonrpc"')
        answer = conn.recv(65536)
    waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert 9 <= waited < 25, waited
    assert api.untouched()


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT"])
def test_only_post_is_served(server: McpServer, method: str) -> None:
    import requests

    answer = requests.request(method, server.url, headers=AUTH, timeout=10)
    assert answer.status_code == 405 and answer.headers["Allow"] == "POST"
    assert answer.json()["error"]["code"] == -32600


def test_an_unidentified_caller_gets_401_with_a_challenge(server: McpServer) -> None:
    status, answer, headers = server.post(json.dumps(rpc("tools/list")).encode(),
                                          rpc_headers("tools/list"))
    assert status == 401 and headers["www-authenticate"].startswith("Basic ")
    assert answer is not None and answer["error"]["code"] == -32600
    status, _, _ = server.post(json.dumps(rpc("tools/list")).encode(), {
        **rpc_headers("tools/list"), "Authorization": "Bearer some-upstream-token"})
    assert status == 401
