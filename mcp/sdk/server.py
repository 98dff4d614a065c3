"""The MCP server itself, on the SDK's low-level `Server`: `tools/list` lists the caller's
policy's tools, `tools/call` makes one call (calls.py). Served by the SDK's Streamable HTTP app,
stateless and answering in JSON (one request, one response: the 2026-07-28 revision), behind
sealgate's gate (gate.py).

The low-level server rather than `MCPServer`: MCPServer's tools are Python functions registered
once, with schemas drawn from their signatures; sealgate's are the rules' templates, and which
of them a caller sees depends on who it is, each time it asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette

from sealgate import __version__
from sealgate.proxy.calls import Decision, HttpRequestTool, Identity, Policy, Tool

from ..calls import call_tool
from ..gate import IDENTITY, Gate
from ..gateway import Gateway, Routes
from ..service import Service

__all__ = ["app", "mcp_server"]


def mcp_server(service: Service, who: Callable[[Any], Identity]) -> Server[Any]:
    """The server, for either transport: `who` says who asks a request (`ctx`)."""

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        policy = _policy(service, who(ctx))
        return types.ListToolsResult(tools=[_listed(tool) for tool in policy.offered_tools])

    async def call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        identity = who(ctx)
        policy = _policy(service, identity)
        tool = next((t for t in policy.offered_tools if t.name == params.name), None)
        if tool is None:
            # A protocol error, as the spec has it for an unknown tool: nothing was called.
            raise MCPError(code=types.INVALID_PARAMS, message=f"no tool named {params.name!r}")
        result = await call_tool(service, identity, policy, tool, dict(params.arguments or {}))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=result.text)],
            structured_content=result.structured, is_error=result.error)

    return Server("sealgate", version=__version__, on_list_tools=list_tools, on_call_tool=call)


def app(service: Service) -> Routes:
    """The ASGI app `sealgate mcp serve` serves: the gate, then the SDK's app at /mcp; the
    gateway (gateway.py) at /mcp/<server>."""
    server = mcp_server(service, _identity)
    host, port = service.settings.listen
    shown = f"[{host}]" if ":" in host else host
    # The gate refuses any Origin (what a browser, the way in for DNS rebinding, sends); the
    # SDK's own Host check besides, for the address served and the resource URI's host (the
    # name clients use behind a front, --resource), unless the address is every address.
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=host not in ("", "0.0.0.0", "::"),  # noqa: S104
        allowed_hosts=[f"{shown}:{port}", f"localhost:{port}",
                       urlsplit(service.settings.resource).netloc], allowed_origins=[])
    sdk: Starlette = server.streamable_http_app(
        streamable_http_path="/mcp", json_response=True, stateless_http=True,
        transport_security=security, max_request_body_size=service.settings.max_body,
        host=host)
    return Routes(Gate(sdk, service), Gateway(service))


def _identity(ctx: Any) -> Identity:
    state = ctx.request.scope.get("state", {}) if ctx.request is not None else {}
    identity = state.get(IDENTITY)
    if not isinstance(identity, Identity):  # the gate sets it for every request it lets by
        raise MCPError(code=types.INTERNAL_ERROR, message="no identity for this request")
    return identity


def _policy(service: Service, identity: Identity) -> Policy:
    found = service.policy(identity)
    if isinstance(found, Decision):  # the rules were reloaded since the gate looked
        raise MCPError(code=types.INVALID_REQUEST,
                       message=f"{found.reason}: {found.detail}")
    return found


def _listed(tool: Tool | HttpRequestTool) -> types.Tool:
    return types.Tool(
        name=tool.name, description=tool.description, input_schema=tool.schema,
        annotations=types.ToolAnnotations(read_only_hint=tool.read_only, open_world_hint=True))
