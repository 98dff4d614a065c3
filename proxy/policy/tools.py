"""Tools a policy declares (`tools:`): a described, typed HTTP call an agent makes over MCP
(`sealgate mcp serve`, docs/mcp.md) without ever holding the credential it carries.

A tool is a request template, fixed by whoever writes the rules: the method, the scheme, host
and port (never an argument), a path whose `{param}`s are filled from the arguments, query
parameters and a JSON body built from them, the JSON Schema the arguments must satisfy, which of
the policy's injections the call carries (`credential`, by its `name`), the most bytes of the
answer read, and which of its fields are returned.

Filling a template is pure (`Tool.request`): each value percent-encoded whole (a `/` in a value
is `%2F`, which `normalize_path` then refuses, as it refuses a value that makes a dot segment),
so an argument can never move a call to another path than its template's, let alone another
host. What comes out is a `ToolRequest`, decided like any proxied request (`decide`), which is
the MCP server's business (mcp/calls.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal
from urllib.parse import quote

from sealgate.hostname import Host
from sealgate.reasons import Reason

from ..errors import ProxyError

__all__ = [
    "PARAM",
    "TOOL_NAME",
    "Tool",
    "ToolArgumentError",
    "ToolRequest",
    "params_in",
    "select",
]

# A tool's name as MCP clients show it (the spec's tool names: A-Z a-z 0-9 _ - .).
TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
# A `{param}` in a URL or query template, and a body string that is one parameter whole.
PARAM: Final = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
_WHOLE: Final = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}\Z")


class ToolArgumentError(ProxyError, ValueError):
    """An argument a template cannot be filled with; the message names the parameter, never
    the value."""

    reason = Reason.TOOL_ARGUMENTS_INVALID


def params_in(template: str) -> list[str]:
    """The `{param}` names in a URL or query template, in order."""
    return PARAM.findall(template)


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """The call a tool's template and arguments make, before anything is decided or injected.
    `target` is the raw request target (path, then `?` and the query), as it goes on the
    request line."""

    method: str
    scheme: Literal["http", "https"]
    host: Host
    port: int
    target: str
    body: bytes | None
    headers: tuple[tuple[str, str], ...] = ()  # the caller's own (`http_request`'s), checked
    overrides: tuple[str, ...] = ()  # the methods those name (policy/reshaping.py), decided

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]


@dataclass(frozen=True)
class Tool:
    """One `tools:` entry. `arguments` and `body` are kept as canonical JSON text, so a tool is
    a plain value (compared, hashed) like a rule."""

    name: str
    description: str
    method: str
    scheme: Literal["http", "https"]
    host: Host
    port: int
    path: str  # a template: literal text and `{param}`s
    query: tuple[tuple[str, str], ...]  # (name, template)
    body: str | None  # a JSON template; None: no body
    arguments: str  # the arguments' JSON Schema
    credential: str | None  # the name of the policy's injection the call carries
    max_response_bytes: int
    returns: tuple[str, ...] | None  # dotted field paths; None: the whole answer
    timeout: float
    source: str

    # A call whose every part the rules wrote: `tools_only` rules serve it (http_request's
    # says False: its method and URL are the agent's).
    rules_made: ClassVar[bool] = True

    @property
    def schema(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.arguments)
        return value

    @property
    def read_only(self) -> bool:
        return self.method in ("GET", "HEAD")

    def request(self, arguments: Mapping[str, Any]) -> ToolRequest:
        """The call these (already schema-checked) arguments make. ToolArgumentError for a
        value a template cannot take: not a string, number or boolean where text goes."""
        path = PARAM.sub(lambda m: _text(arguments, m.group(1), required=True) or "", self.path)
        query = []
        for name, template in self.query:
            if any(p not in arguments or arguments[p] is None for p in params_in(template)):
                continue  # an optional argument not given: the parameter is left out
            value = PARAM.sub(lambda m: _text(arguments, m.group(1), required=True) or "",
                              template)
            query.append(f"{quote(name, safe='')}={value}")
        target = path + (f"?{'&'.join(query)}" if query else "")
        body = None
        if self.body is not None:
            filled = _fill(json.loads(self.body), arguments)
            body = json.dumps(None if filled is _ABSENT else filled,
                              separators=(",", ":"), ensure_ascii=False).encode()
        return ToolRequest(self.method, self.scheme, self.host, self.port, target, body)


def _text(arguments: Mapping[str, Any], name: str, *, required: bool) -> str | None:
    """An argument as it goes into a URL: percent-encoded whole (`safe=''`)."""
    value = arguments.get(name)
    if value is None:
        if required:
            raise ToolArgumentError(f"argument {name!r} is required here")
        return None
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int | float | str):
        text = str(value)
    else:
        raise ToolArgumentError(f"argument {name!r} must be a string, number or boolean here")
    return quote(text, safe="")


class _Absent:
    pass


_ABSENT: Final = _Absent()


def _fill(template: Any, arguments: Mapping[str, Any]) -> Any:
    """A body template with every string that is one `{param}` whole replaced by that
    argument's JSON value; a member (or item) whose argument was not given is left out."""
    if isinstance(template, str):
        whole = _WHOLE.match(template)
        if whole is None:
            return template
        return arguments.get(whole.group(1), _ABSENT)
    if isinstance(template, dict):
        filled = {k: _fill(v, arguments) for k, v in template.items()}
        return {k: v for k, v in filled.items() if v is not _ABSENT}
    if isinstance(template, list):
        return [v for v in (_fill(item, arguments) for item in template) if v is not _ABSENT]
    return template


def select(answer: Any, fields: tuple[str, ...]) -> Any:
    """The `returns` fields of a decoded JSON answer: of an object, each dotted path that is
    there, nested as it was; of an array, that of each item. Anything else is returned whole
    (a scalar has no fields to leave out)."""
    if isinstance(answer, list):
        return [select(item, fields) for item in answer]
    if not isinstance(answer, dict):
        return answer
    wanted: dict[str, list[str] | None] = {}  # a field -> the paths under it (None: all of it)
    for path in fields:
        head, dot, rest = path.partition(".")
        if not dot:
            wanted[head] = None
        elif (under := wanted.setdefault(head, [])) is not None:
            under.append(rest)
    picked: dict[str, Any] = {}
    for head, under in wanted.items():
        if head not in answer:
            continue
        value = answer[head]
        if under is None:
            picked[head] = value
        elif isinstance(value, dict | list):
            picked[head] = select(value, tuple(under))
    return picked
