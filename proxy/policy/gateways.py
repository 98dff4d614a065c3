"""A policy's `mcp_servers:` list: the upstream MCP servers `sealgate mcp gateway` fronts for
it, as the loader makes them (gatewaygrammar.py reads them node by node):

    mcp_servers:
      - name: docs                        # served at /mcp/docs by the gateway
        url: https://mcp.example.com/mcp  # Streamable HTTP; the host and port are literal
        credential: upstream              # the `name` of one of the policy's inject entries
        tools:                            # the only tools the agent sees and may call
          - name: search
            arguments:                    # constraints on arguments (others: unconstrained)
              repo: {equals: octo/docs}
              kind: {one_of: [guide, api]}
              query: {pattern: "^[A-Za-z0-9 ]{1,80}$"}
              limit: {schema: {type: integer, minimum: 1, maximum: 50}}
        max_response_bytes: 1048576       # of one answer, JSON or a whole SSE stream
        timeout: 30

A constrained argument must be given: absent, the call is refused (the upstream's default could
be anything). `equals` and `one_of` compare JSON values exactly (1 is not true, nor "1");
`pattern` is a Python regular expression the whole string must match (a value that is not a
string does not); `schema` is a JSON Schema (draft 2020-12) the value must meet. The format
is documented in docs/mcp.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonschema import Draft202012Validator

from sealgate.hostname import Host

__all__ = ["Constraint", "GatewayTool", "McpServer", "canonical"]


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Constraint:
    kind: Literal["equals", "one_of", "pattern", "schema"]
    values: frozenset[str] = frozenset()  # canonical JSON texts: equals, one_of, the schema
    pattern: re.Pattern[str] | None = None
    validator: Draft202012Validator | None = field(default=None, compare=False)

    def admits(self, value: Any) -> bool:
        if self.pattern is not None:
            return isinstance(value, str) and self.pattern.fullmatch(value) is not None
        if self.validator is not None:
            return bool(self.validator.is_valid(value))
        try:
            return canonical(value) in self.values
        except (TypeError, ValueError):
            return False


@dataclass(frozen=True, slots=True)
class GatewayTool:
    name: str
    arguments: Mapping[str, Constraint]

    def refusal(self, arguments: Any) -> str | None:
        """Why `arguments` are refused (naming the argument, never its value), or None."""
        if not isinstance(arguments, dict):
            return "the arguments are not an object"
        for name, constraint in self.arguments.items():
            if name not in arguments:
                return f"{name!r} must be given"
            if not constraint.admits(arguments[name]):
                return f"{name!r} is not a value the rules allow ({constraint.kind})"
        return None


@dataclass(frozen=True, slots=True)
class McpServer:
    name: str
    scheme: Literal["http", "https"]
    host: Host
    port: int
    path: str
    credential: str | None
    tools: tuple[GatewayTool, ...]
    max_response_bytes: int
    timeout: float
    source: str

    def tool(self, name: str) -> GatewayTool | None:
        return next((tool for tool in self.tools if tool.name == name), None)
