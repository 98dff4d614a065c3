"""A policy's `mcp_servers:` list read node by node like the rest of a rules file (grammar.py),
into gateways.py's types; the format is there and in docs/mcp.md."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from yaml.nodes import Node

from sealgate.yamlfile import YamlFile, show

from .gateways import Constraint, GatewayTool, McpServer, canonical
from .model import Injection
from .toolgrammar import (
    DEFAULT_RESPONSE_BYTES,
    DEFAULT_TIMEOUT,
    MAX_RESPONSE_BYTES,
    named_list,
    not_json,
    timeout_of,
    url_of,
)
from .tools import TOOL_NAME

__all__ = ["CONSTRAINTS", "SERVER_KEYS", "SERVER_NAME", "TOOL_KEYS", "mcp_servers"]

SERVER_KEYS: Final = ("name", "url", "credential", "tools", "max_response_bytes", "timeout")
TOOL_KEYS: Final = ("name", "arguments")
CONSTRAINTS: Final = ("equals", "one_of", "pattern", "schema")
SERVER_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_ARGUMENT: Final = re.compile(r"[^\x00-\x20\x7f]{1,128}")


def mcp_servers(doc: YamlFile, node: Node, field: str,
                credentials: Mapping[str, Injection]) -> tuple[McpServer, ...]:
    """The `mcp_servers` list at `node`; `credentials` are the policy's named injections."""
    return named_list(doc, node, field, "server",
                      lambda item, at: _server(doc, item, at, credentials))


def _server(doc: YamlFile, node: Node, field: str,
            credentials: Mapping[str, Injection]) -> McpServer:
    entries = doc.mapping(node, field)
    doc.expect_keys(entries, node, field, SERVER_KEYS, required=("name", "url", "tools"))

    def at(key: str) -> tuple[Node, str]:
        return entries[key][1], f"{field}.{key}"

    name = doc.string(*at("name"))
    if not SERVER_NAME.fullmatch(name):
        raise doc.error(*at("name"), f"server name {show(name)} must be 1-64 of A-Z a-z 0-9 _ - "
                                     "(not starting with _ -)")
    scheme, host, port, path = url_of(doc, *at("url"))
    if "{" in path:
        raise doc.error(*at("url"), "an MCP server's url has no {param}")
    credential = None
    if "credential" in entries:
        credential = doc.string(*at("credential"))
        if credential not in credentials:
            known = ", ".join(sorted(credentials)) or "none: give an inject entry a name"
            raise doc.error(*at("credential"), f"no inject entry of this policy is named "
                                               f"{show(credential)} (named: {known})")
    tools: list[GatewayTool] = []
    tools_node, tools_field = at("tools")
    for i, item in enumerate(doc.sequence(tools_node, tools_field)):
        tool = _tool(doc, item, f"{tools_field}[{i}]")
        if any(t.name == tool.name for t in tools):
            raise doc.error(item, f"{tools_field}[{i}].name", f"tool {tool.name!r} is listed "
                                                              "twice")
        tools.append(tool)
    max_bytes = DEFAULT_RESPONSE_BYTES
    if "max_response_bytes" in entries:
        max_bytes = doc.integer(*at("max_response_bytes"), 1, MAX_RESPONSE_BYTES)
    timeout = timeout_of(doc, *at("timeout")) if "timeout" in entries else DEFAULT_TIMEOUT
    return McpServer(name, scheme, host, port, path, credential, tuple(tools), max_bytes,
                     timeout, str(doc.where(node)))


def _tool(doc: YamlFile, node: Node, field: str) -> GatewayTool:
    entries = doc.mapping(node, field)
    doc.expect_keys(entries, node, field, TOOL_KEYS, required=("name",))
    name_node = entries["name"][1]
    name = doc.string(name_node, f"{field}.name")
    if not TOOL_NAME.fullmatch(name):
        raise doc.error(name_node, f"{field}.name", f"tool name {show(name)} must be 1-64 of "
                                                    "A-Z a-z 0-9 _ . - (not starting with . -)")
    constraints: dict[str, Constraint] = {}
    if "arguments" in entries:
        args_node = entries["arguments"][1]
        for argument, (key_node, value) in doc.mapping(args_node, f"{field}.arguments").items():
            where = f"{field}.arguments.{argument}"
            if not _ARGUMENT.fullmatch(argument):
                raise doc.error(key_node, where, "an argument name is 1-128 characters, no "
                                                 "spaces or control characters")
            constraints[argument] = _constraint(doc, value, where)
    return GatewayTool(name, constraints)


def _constraint(doc: YamlFile, node: Node, field: str) -> Constraint:
    entries = doc.mapping(node, field)
    doc.expect_keys(entries, node, field, CONSTRAINTS, required=())
    if len(entries) != 1:
        raise doc.error(node, field, "one of equals, one_of, pattern or schema")
    [(kind, (_, value_node))] = entries.items()
    where = f"{field}.{kind}"
    if kind == "pattern":
        text = doc.string(value_node, where)
        try:
            return Constraint("pattern", pattern=re.compile(text))
        except re.error as exc:
            raise doc.error(value_node, where, f"not a regular expression: {exc}") from None
    value = doc.value(value_node, where)
    if problem := not_json(value):
        raise doc.error(value_node, where, problem)
    if kind == "schema":
        if not isinstance(value, dict):
            raise doc.error(value_node, where, "a JSON Schema (draft 2020-12) object")
        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            at = "/".join(map(str, exc.path)) or "its root"
            raise doc.error(value_node, where, f"not a JSON Schema (draft 2020-12) at {at}: "
                                               f"{exc.message[:200]}") from None
        return Constraint("schema", frozenset({canonical(value)}),
                          validator=Draft202012Validator(value))
    if kind == "one_of":
        if not isinstance(value, list) or not value:
            raise doc.error(value_node, where, "a list of one or more JSON values")
        return Constraint("one_of", frozenset(map(canonical, value)))
    return Constraint("equals", frozenset({canonical(value)}))
