"""The endpoint's OAuth 2.0 Protected Resource Metadata (RFC 9728), which the MCP specification's
authorization asks every server to publish: `GET /.well-known/oauth-protected-resource`, and the
path-suffixed form for the resource's path (`.../oauth-protected-resource/mcp`). In front of
both `sealgate mcp serve`'s app and the gateway's; everything else goes on to them.

The document names the resource (the tokens' audience), that a bearer goes in the
`Authorization` header only, and the authorization servers only when the operator named some
(`--authorization-server`): sealgate mints its tokens itself (`sealgate mcp token`), so by
default there is no OAuth authorization server to send a client to (docs/mcp.md says why).
"""

from __future__ import annotations

import json
from typing import Any, Final

from .bearer import metadata_paths
from .gate import App, Receive, Scope, Send
from .service import Settings

__all__ = ["Protected", "document"]

RESOURCE_NAME: Final = "sealgate MCP server"


def document(settings: Settings) -> dict[str, Any]:
    found: dict[str, Any] = {"resource": settings.resource,
                             "bearer_methods_supported": ["header"],
                             "resource_name": RESOURCE_NAME}
    if settings.authorization_servers:
        found["authorization_servers"] = list(settings.authorization_servers)
    return found


class Protected:
    def __init__(self, app: App, settings: Settings) -> None:
        self.app = app
        self.paths = frozenset(metadata_paths(settings.resource))
        self.body = json.dumps(document(settings), indent=1).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        # Public by design (RFC 9728 section 3): no credentials asked, none read.
        if scope["method"] == "GET":
            status, headers, body = 200, [(b"content-type", b"application/json")], self.body
        else:
            status, headers, body = 405, [(b"allow", b"GET")], b""
        await send({"type": "http.response.start", "status": status, "headers": [
            *headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})
