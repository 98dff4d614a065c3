"""The generic `http_request` tool a policy may offer (`http_request:` in rules): an agent gives
the method, the URL, headers and a body, and sealgate makes the call as a proxied request of
that policy would be made: the one `decide` with the host, port and path of the URL (so only
what the policy's rules allow, and nothing any rule could allow of what the guard refuses: the
metadata address, internal ranges), the credentials the allowing rule injects, the answer
scrubbed and capped. The agent never names a credential: the rules pair it with the host.

What an agent's arguments may not carry: a URL other than absolute http(s) without user
information (`user:pass@` is a credential in the URL, and a second way to spell a host); control
characters; headers that carry credentials or frame the request (`Authorization`, `Cookie`,
`Proxy-*`, `Host`, `Content-Length`, `Transfer-Encoding`, `Connection` and the other hop-by-hop
ones): framing is sealgate's, and a credential is the rules' to add, never the agent's to send.
Headers that reshape what was decided are taken as the proxy takes them
(policy/reshaping.py), under any spelling a server reads as theirs (`_` as `-`): a method
override is decided with the rest, a URL override refused, `Range`, `If-Range` and
`Request-Range` not sent with an injected credential, and a slice answered anyway refused
(`response_sliced`, mcp/upstream.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final
from urllib.parse import urlsplit

from sealgate.hostname import HostError, split_authority

from . import reshaping
from .tools import ToolArgumentError, ToolRequest

__all__ = ["HTTP_REQUEST", "HttpRequestTool"]

HTTP_REQUEST: Final = "http_request"  # the tool's name, as agents see it
MAX_URL: Final = 4096
MAX_HEADERS: Final = 32
MAX_HEADER_VALUE: Final = 4096
MAX_BODY: Final = 1 << 20
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
_REFUSED: Final = frozenset({
    "authorization", "cookie", "host", "content-length", "transfer-encoding", "connection",
    "keep-alive", "te", "trailer", "upgrade", "expect", "forwarded", "x-forwarded-for",
})
@dataclass(frozen=True)
class HttpRequestTool:
    methods: tuple[str, ...]
    max_response_bytes: int
    timeout: float
    source: str

    # As a declared tool has them (mcp/calls.py reads either): no one credential named (the
    # allowing rule's are injected), the whole answer returned.
    name: ClassVar[str] = HTTP_REQUEST
    credential: ClassVar[None] = None
    returns: ClassVar[None] = None
    # Its method and URL are the agent's: the sandbox's own request in another form, decided
    # as the proxy decides one, so `tools_only` rules (a gateway's credential, a declared
    # tool's API) do not serve it; they did, and it reached an MCP server's unlisted tools
    # with the gateway's bearer (found by review).
    rules_made: ClassVar[bool] = False

    @property
    def description(self) -> str:
        return (f"An HTTP request ({', '.join(self.methods)}) to a host this sandbox's rules "
                "allow. A credential the rules give that host is added on the way and never "
                "shown; headers that carry credentials are refused. Returns the answer's body "
                f"(at most {self.max_response_bytes} bytes).")

    @property
    def read_only(self) -> bool:
        return set(self.methods) <= {"GET", "HEAD"}

    @property
    def schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "method": {"type": "string", "enum": list(self.methods)},
                "url": {"type": "string", "maxLength": MAX_URL,
                        "description": "absolute http:// or https:// URL"},
                "headers": {"type": "object", "maxProperties": MAX_HEADERS,
                            "additionalProperties": {"type": "string",
                                                     "maxLength": MAX_HEADER_VALUE}},
                "body": {"type": "string", "maxLength": MAX_BODY},
            },
            "required": ["url"],
            "additionalProperties": False,
        }

    def request(self, arguments: Mapping[str, Any]) -> ToolRequest:
        """The call these (already schema-checked) arguments make; ToolArgumentError naming
        what is refused, never quoting a value."""
        method = str(arguments.get("method") or self.methods[0])
        url = str(arguments["url"])
        if _CONTROL.search(url) or " " in url:
            raise ToolArgumentError("argument 'url' has a space or a control character")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ToolArgumentError("argument 'url' must be an absolute http:// or https:// URL")
        if "@" in parts.netloc:
            raise ToolArgumentError("argument 'url' must not carry user information (user@)")
        try:
            host, port = split_authority(parts.netloc, 443 if parts.scheme == "https" else 80)
        except HostError as exc:
            raise ToolArgumentError(f"argument 'url': invalid host: {exc}") from None
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = []
        for name, value in dict(arguments.get("headers") or {}).items():
            lower = reshaping.canonical(name)  # as CGI-style servers read it
            if not _TOKEN.fullmatch(name) or lower in _REFUSED or lower.startswith("proxy-"):
                raise ToolArgumentError(f"header {name[:64]!r} is refused (a credential or the "
                                        "request's framing is sealgate's to write)")
            if _CONTROL.search(value.replace("\t", "")):
                raise ToolArgumentError(f"header {name!r} has a control character")
            headers.append((name, value))
        body = arguments.get("body")
        return ToolRequest(method, "https" if parts.scheme == "https" else "http", host, port,
                           target, None if body is None else str(body).encode(),
                           tuple(headers), self._overrides(headers))

    def _overrides(self, headers: list[tuple[str, str]]) -> tuple[str, ...]:
        # Decided as the proxy decides them, and within the tool's own methods too: a read-only
        # tool's GET must not carry a DELETE to an API that honours the override.
        named = reshaping.overrides_in(headers)
        if outside := [m for m in named if m not in self.methods]:
            raise ToolArgumentError(f"a method override names {outside[0][:16]!r}, which this "
                                    "tool does not offer")
        return named
