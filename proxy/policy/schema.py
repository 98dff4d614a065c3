"""The JSON Schema of a rules file (rules/schema.json, `sealgate rules schema`), for editors
and CI linters: built from the loader's own definitions (grammar.py's keys, patterns and
bounds, the processor types and their fields), so the two cannot drift; tests/unit/
test_rules_schema.py checks the committed file is this output, and that a file the loader
accepts the schema accepts too.

The schema checks the shape of a file; the loader checks more than a schema can say (a host
pattern's meaning, a path glob's, a sandbox naming a policy of another file, a secret
reference's store). So a file the schema accepts may still be refused, with file, line and
field, by `sealgate rules check`; never the other way round.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from sealgate.credentials.processors import PROCESSOR_TYPES

from . import gatewaygrammar, grammar, injections, toolgrammar, tools

ID = "https://sealgate.dev/schemas/rules-v1.json"


def _anchored(pattern: str) -> str:
    return f"^(?:{pattern})$"


def _string_list(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}


def _processors() -> list[dict[str, Any]]:
    """`as:` a type's name (one needing no settings), or its JSON form as a mapping."""
    forms: list[dict[str, Any]] = [{"type": "string", "enum": sorted(
        kind for kind, cls in PROCESSOR_TYPES.items() if not cls.required_fields())}]
    for kind, cls in sorted(PROCESSOR_TYPES.items()):
        properties: dict[str, Any] = {"type": {"const": kind}}
        for spec in fields(cls):
            text = {"type": "string"}
            properties[spec.name] = ({"oneOf": [text, _string_list(text)]}
                                     if spec.name in cls.list_fields else text)
        forms.append({"type": "object", "properties": properties,
                      "required": ["type", *cls.required_fields()],
                      "additionalProperties": False})
    return forms


def _tool() -> dict[str, Any]:
    """A `tools:` entry (toolgrammar.py): its shape; the templates' parameters, the arguments'
    schema and the credential's name are checked by the loader."""
    text = {"type": "string"}
    properties: dict[str, Any] = {
        "name": {"type": "string", "pattern": _anchored(tools.TOOL_NAME.pattern)},
        "description": {"type": "string", "minLength": 1,
                        "maxLength": toolgrammar.MAX_DESCRIPTION},
        "method": {"type": "string", "pattern": _anchored(toolgrammar._METHOD.pattern)},
        "url": {"type": "string", "pattern": "^https?://"},
        "query": {"type": "object", "additionalProperties": text,
                  "propertyNames": {"pattern": _anchored(toolgrammar._QUERY_NAME.pattern)}},
        "body": {},
        "arguments": {"type": "object", "required": ["type"],
                      "properties": {"type": {"const": "object"}}},
        "credential": {"type": "string", "pattern": _anchored(injections._NAME.pattern)},
        "max_response_bytes": {"type": "integer", "minimum": 1,
                               "maximum": toolgrammar.MAX_RESPONSE_BYTES},
        "returns": _string_list(text),
        "timeout": {"type": "number", "exclusiveMinimum": 0,
                    "maximum": toolgrammar.MAX_TIMEOUT},
    }
    if set(properties) != set(toolgrammar.TOOL_KEYS):
        raise RuntimeError("the schema and the loader name different tool fields: update "
                           "schema.py")
    return {"type": "object", "additionalProperties": False,
            "required": list(toolgrammar._REQUIRED), "properties": properties}


def _mcp_server() -> dict[str, Any]:
    """An `mcp_servers:` entry (gatewaygrammar.py): its shape; the credential's name and the
    patterns are checked by the loader."""
    kinds: dict[str, Any] = {"equals": {}, "one_of": {"type": "array", "minItems": 1},
                             "pattern": {"type": "string"}, "schema": {"type": "object"}}
    constraint = {"type": "object", "minProperties": 1, "maxProperties": 1,
                  "additionalProperties": False, "properties": kinds}
    tool = {"type": "object", "additionalProperties": False, "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": _anchored(tools.TOOL_NAME.pattern)},
                "arguments": {"type": "object", "additionalProperties": constraint}}}
    properties: dict[str, Any] = {
        "name": {"type": "string", "pattern": _anchored(gatewaygrammar.SERVER_NAME.pattern)},
        "url": {"type": "string", "pattern": "^https?://"},
        "credential": {"type": "string", "pattern": _anchored(injections._NAME.pattern)},
        "tools": {"type": "array", "items": tool},
        "max_response_bytes": {"type": "integer", "minimum": 1,
                               "maximum": toolgrammar.MAX_RESPONSE_BYTES},
        "timeout": {"type": "number", "exclusiveMinimum": 0,
                    "maximum": toolgrammar.MAX_TIMEOUT},
    }
    if (set(properties) != set(gatewaygrammar.SERVER_KEYS)
            or set(kinds) != set(gatewaygrammar.CONSTRAINTS)):
        raise RuntimeError("the schema and the loader name different mcp_servers fields: "
                           "update schema.py")
    return {"type": "object", "additionalProperties": False,
            "required": ["name", "url", "tools"], "properties": properties}


def schema() -> dict[str, Any]:
    name = {"type": "string", "pattern": _anchored(grammar._NAME.pattern)}
    integer = {"type": "integer", "maximum": grammar._MAX_INT}
    vault = {"type": "object", "additionalProperties": False,
             "required": list(injections._VAULT_KEYS[:3]),
             "properties": {**{k: {"type": "string"} for k in injections._VAULT_KEYS[:3]},
                            "kv_version": {"type": "integer", "enum": [1, 2]}}}
    inject = {"type": "object", "additionalProperties": False,
              "required": list(injections._INJECT_KEYS),
              "properties": {"secret": {"oneOf": [{"type": "string"}, vault]},
                             "as": {"oneOf": _processors()},
                             "name": {"type": "string",
                                      "pattern": _anchored(injections._NAME.pattern)}}}
    rule_properties: dict[str, Any] = {
        "host": {"type": "string"},
        "ports": _string_list({"type": "integer", "minimum": 1, "maximum": 65535}),
        "methods": _string_list({"type": "string",
                                 "pattern": _anchored(grammar._METHOD.pattern)}),
        "paths": _string_list({"type": "string", "pattern": "^/"}),
        "inject": _string_list(inject),
        "strip": _string_list({"type": "string",
                               "pattern": _anchored(grammar._HEADER_NAME.pattern)}),
        "plain_http": {"type": "boolean"},
        "response_timeout": {"type": "number", "exclusiveMinimum": 0,
                             "maximum": grammar._MAX_RESPONSE_SECONDS},
        "tools_only": {"type": "boolean"},
    }
    budgets = {"type": "object", "additionalProperties": False, "properties": {
        "requests_per_second": {"type": "number", "exclusiveMinimum": 0,
                                "maximum": grammar._MAX_RATE},
        **{key: {**integer, "minimum": low} for key, low in grammar._BUDGET_INTS.items()}}}
    policy_properties: dict[str, Any] = {
        "mode": {"enum": list(grammar._MODES)},
        "tokens": {"type": "boolean"},
        "allow": _string_list({"type": "object", "additionalProperties": False,
                               "required": ["host"], "properties": rule_properties}),
        "allow_networks": _string_list({"type": "string"}),
        "budgets": budgets,
        "tools": _string_list(_tool()),
        "http_request": {"oneOf": [{"type": "boolean"}, {
            "type": "object", "additionalProperties": False, "properties": {
                "methods": {"type": "array", "minItems": 1, "items": {
                    "type": "string", "pattern": _anchored(toolgrammar._METHOD.pattern)}},
                "max_response_bytes": {**integer, "minimum": 1,
                                       "maximum": toolgrammar.MAX_RESPONSE_BYTES},
                "timeout": {"type": "number", "exclusiveMinimum": 0,
                            "maximum": toolgrammar.MAX_TIMEOUT}}}]},
        "mcp_servers": _string_list(_mcp_server()),
    }
    sandbox = {"type": "object", "additionalProperties": False,
               "required": list(grammar._SANDBOX_KEYS),
               "properties": {"policy": name, "key_sha256": {
                   "type": "string", "pattern": _anchored(grammar._HEX64.pattern)}}}
    if set(rule_properties) != set(grammar._RULE_KEYS) or set(policy_properties) != set(
            grammar._POLICY_KEYS):
        raise RuntimeError("the schema and the loader name different fields: update schema.py")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": ID,
        "title": "sealgate rules file",
        "description": "Egress policies for sandboxes: docs/rules.md. Generated by "
                       "`sealgate rules schema`; do not edit.",
        "type": "object",
        "additionalProperties": False,
        "required": ["version"],
        "properties": {
            "version": {"const": grammar._VERSION},
            "policies": {"type": ["object", "null"], "propertyNames": name,
                         "additionalProperties": {"type": "object",
                                                  "additionalProperties": False,
                                                  "properties": policy_properties}},
            "sandboxes": {"type": ["object", "null"], "propertyNames": name,
                          "additionalProperties": sandbox},
            "default_policy": {"oneOf": [{"type": "null"}, name]},
        },
    }
