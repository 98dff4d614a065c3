"""`sealgate mcp gateway`: the upstream MCP servers a policy declares (`mcp_servers:`), fronted
at `POST /mcp/<name>` for the sandboxes of that policy. An ASGI app of its own (no SDK):

1. the message is admitted as `sealgate mcp serve`'s gate admits one (gate.py): who asks (the
   sandbox's proxy credentials or its source address, as the proxy finds it), the body's size,
   one JSON-RPC 2.0 request of the 2026-07-28 revision, `Mcp-Method` and `Mcp-Name` agreeing
   with the body, only `server/discover`, `tools/list` and `tools/call`; a notification is
   acknowledged (202) and goes no further;
2. the server is one of the caller's policy's (404 otherwise); a `tools/call` names one of its
   listed tools (a JSON-RPC error -32602 otherwise, audited, nothing sent), and its arguments
   meet the constraints the rules put on them (an error result the model can read otherwise,
   audited, nothing sent);
3. the message goes upstream as gatewayflow.py sends it: decided, budgeted, dialed through the
   guard, the server's credential injected, the answer filtered, scrubbed and capped.

Nothing of the agent's request but the JSON-RPC body and the routing headers (`Mcp-Method`,
`Mcp-Name`, the protocol version) goes upstream: not its `Authorization`, not its cookies.
"""

from __future__ import annotations

import time
from typing import Final

from .gate import (
    INVALID_REQUEST,
    App,
    Receive,
    Refused,
    Scope,
    Send,
    answer_refused,
    check_headers,
    identify,
    parse_message,
    posted,
    read_body,
)
from .gatewayflow import Exchange, relay
from .service import Service

__all__ = ["Gateway", "Routes"]

PREFIX: Final = "/mcp/"


class Gateway:
    def __init__(self, service: Service) -> None:
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = time.monotonic()
        try:
            exchange = await self._admit(scope, receive)
        except Refused as refused:
            await answer_refused(send, refused)
            return
        if exchange is None:  # a notification: acknowledged, not forwarded
            await send({"type": "http.response.start", "status": 202,
                        "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        exchange.started = started
        await relay(self.service, exchange, send)

    async def _admit(self, scope: Scope, receive: Receive) -> Exchange | None:
        path: str = scope["path"]
        name = path[len(PREFIX):] if path.startswith(PREFIX) else ""
        if not name or "/" in name:
            raise Refused(404, INVALID_REQUEST,
                          f"the gateway's endpoints are POST {PREFIX}<server>")
        headers = posted(scope, path)
        identity, policy = identify(self.service, scope, headers)
        server = next((s for s in policy.mcp_servers if s.name == name), None)
        if server is None:
            raise Refused(404, INVALID_REQUEST, f"no MCP server named {name[:64]!r} for this "
                                               "sandbox's policy")
        body = await read_body(scope, receive, headers, self.service.settings.max_body)
        message = parse_message(body)
        check_headers(message, headers)
        if "id" not in message:
            return None
        exchange = Exchange(identity, policy, server, message, headers.get("mcp-name"))
        if message["method"] == "tools/call":
            params = message.get("params")
            assert isinstance(params, dict)  # check_headers saw a tool name in it
            exchange.tool = params["name"]
            exchange.arguments = params.get("arguments", {})
            tool = server.tool(params["name"])
            if tool is None:
                exchange.unlisted = True  # refused by relay: a protocol error, audited
            else:
                # Refused with an error result the model can read (and audited), nothing sent.
                exchange.refused = tool.refusal(exchange.arguments)
        return exchange


async def _lifespan(receive: Receive, send: Send) -> None:
    for _ in range(2):  # startup, then shutdown
        event = await receive()
        kind = event["type"].rpartition(".")[2]
        await send({"type": f"lifespan.{kind}.complete"})
        if kind == "shutdown":
            return


class Routes:
    """`sealgate mcp serve`'s app: `/mcp/<server>` to the gateway, everything else (`/mcp`,
    the lifespan) to the declared tools' gate; so a sandbox reaches its policy's upstream MCP
    servers on the one port its firewall lets through (`--mcp-port`)."""

    def __init__(self, tools: App, gateway: Gateway) -> None:
        self.tools, self.gateway = tools, gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith(PREFIX):
            await self.gateway(scope, receive, send)
        else:
            await self.tools(scope, receive, send)
