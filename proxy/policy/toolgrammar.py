"""A policy's `tools:` list, read node by node like the rest of a rules file (grammar.py):

    tools:
      - name: list_issues
        description: The open issues of a repository.
        method: GET
        url: https://api.github.com/repos/{owner}/{repo}/issues
        query: {state: "{state}", per_page: "20"}
        arguments:                       # the arguments' JSON Schema (draft 2020-12)
          type: object
          properties:
            owner: {type: string}
            repo: {type: string}
            state: {type: string, enum: [open, closed]}
          required: [owner, repo]
        credential: github               # the `name` of one of the policy's inject entries
        max_response_bytes: 262144
        returns: [number, title, user.login]

Everything a call can reach is fixed here: the host and port are literal, and an argument only
fills a `{param}` of the path or a query value (percent-encoded whole), or stands for one value
of the JSON body. The format is documented in docs/rules.md and docs/mcp.md.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

from yaml.nodes import Node, ScalarNode

from sealgate.hostname import Host, HostError, split_authority
from sealgate.yamlfile import FLOAT, INT, YamlFile, show

from .httptool import HttpRequestTool
from .model import Injection, PathError, normalize_path
from .tools import PARAM, TOOL_NAME, Tool, params_in

__all__ = ["HTTP_REQUEST_KEYS", "TOOL_KEYS", "http_request", "named_list", "not_json", "timeout_of",
           "tools", "url_of"]

HTTP_REQUEST_KEYS: Final = ("methods", "max_response_bytes", "timeout")

TOOL_KEYS: Final = ("name", "description", "method", "url", "query", "body", "arguments",
                    "credential", "max_response_bytes", "returns", "timeout")
_REQUIRED: Final = ("name", "description", "method", "url")
_METHOD: Final = re.compile(r"[A-Z][A-Z0-9_-]{0,31}")
_QUERY_NAME: Final = re.compile(r"[A-Za-z0-9_.~\[\]-]{1,128}")
_FIELD_PATH: Final = re.compile(r"[^.\x00-\x20\x7f]{1,128}(?:\.[^.\x00-\x20\x7f]{1,128}){0,15}")
_BODILESS: Final = frozenset({"GET", "HEAD"})
MAX_DESCRIPTION: Final = 4096
DEFAULT_RESPONSE_BYTES: Final = 1 << 20
MAX_RESPONSE_BYTES: Final = 16 << 20
DEFAULT_TIMEOUT: Final = 30.0
MAX_TIMEOUT: Final = 300.0
_EMPTY_ARGUMENTS: Final = {"type": "object", "properties": {}, "additionalProperties": False}


def tools(doc: YamlFile, node: Node, field: str,
          credentials: Mapping[str, Injection]) -> tuple[Tool, ...]:
    """The `tools` list at `node`; `credentials` are the policy's named injections."""
    return named_list(doc, node, field, "tool",
                      lambda item, at: _tool(doc, item, at, credentials))


class _Named(Protocol):
    @property
    def name(self) -> str: ...


_N = TypeVar("_N", bound=_Named)


def named_list(doc: YamlFile, node: Node, field: str, kind: str,
               make: Callable[[Node, str], _N]) -> tuple[_N, ...]:
    """The list at `node`, each item made by `make(item, its field path)`; a name declared
    twice is an error at the second (the tools' and the gateway servers' lists)."""
    found: list[_N] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(doc.sequence(node, field)):
        made = make(item, f"{field}[{i}]")
        if made.name in seen:
            raise doc.error(item, f"{field}[{i}].name",
                            f"{kind} {made.name!r} is also declared at [{seen[made.name]}]")
        seen[made.name] = i
        found.append(made)
    return tuple(found)


def _tool(doc: YamlFile, node: Node, field: str, credentials: Mapping[str, Injection]) -> Tool:
    entries = doc.mapping(node, field)
    doc.expect_keys(entries, node, field, TOOL_KEYS, required=_REQUIRED)

    def at(key: str) -> tuple[Node, str]:
        return entries[key][1], f"{field}.{key}"

    name_node, name_field = at("name")
    name = doc.string(name_node, name_field)
    if not TOOL_NAME.fullmatch(name):
        raise doc.error(name_node, name_field, f"tool name {show(name)} must be 1-64 of A-Z a-z "
                                               "0-9 _ . - (not starting with . -)")
    description_node, description_field = at("description")
    description = doc.string(description_node, description_field)
    if not description.strip() or len(description) > MAX_DESCRIPTION or any(
            (ord(c) < 32 and c not in "\n\t") or ord(c) == 127 for c in description):
        raise doc.error(description_node, description_field,
                        f"must be 1-{MAX_DESCRIPTION} characters, no control characters")
    method_node, method_field = at("method")
    method = doc.string(method_node, method_field)
    if not _METHOD.fullmatch(method):
        raise doc.error(method_node, method_field, f"{show(method)} is not an HTTP method token "
                                                   "(methods are case-sensitive: uppercase)")
    url_node, url_field = at("url")
    scheme, host, port, path = url_of(doc, url_node, url_field)
    query: list[tuple[str, str]] = []
    if "query" in entries:
        query_node, query_field = at("query")
        for key, (key_node, value) in doc.mapping(query_node, query_field).items():
            if not _QUERY_NAME.fullmatch(key):
                raise doc.error(key_node, f"{query_field}.{key}",
                                "a query parameter name is 1-128 of A-Z a-z 0-9 _ . ~ [ ] -")
            query.append((key, _template(doc, value, f"{query_field}.{key}")))
    body: str | None = None
    body_params: list[str] = []
    if "body" in entries:
        body_node, body_field = at("body")
        if method in _BODILESS:
            raise doc.error(body_node, body_field, f"a {method} request carries no body")
        value = _json(doc, body_node, body_field)
        body_params = _body_params(doc, body_node, body_field, value)
        body = json.dumps(value, sort_keys=True, ensure_ascii=False)
    schema = _EMPTY_ARGUMENTS
    schema_node = node
    if "arguments" in entries:
        schema_node, schema_field = at("arguments")
        schema = _schema(doc, schema_node, schema_field)
    path_params = params_in(path)
    _check_params(doc, schema_node, f"{field}.arguments", schema, path_params=path_params,
                  other=[p for _, t in query for p in params_in(t)] + body_params)
    credential = None
    if "credential" in entries:
        credential_node, credential_field = at("credential")
        credential = doc.string(credential_node, credential_field)
        if credential not in credentials:
            known = ", ".join(sorted(credentials)) or "none: give an inject entry a name"
            raise doc.error(credential_node, credential_field,
                            f"no inject entry of this policy is named {show(credential)} "
                            f"(named: {known})")
    max_bytes = DEFAULT_RESPONSE_BYTES
    if "max_response_bytes" in entries:
        max_bytes = doc.integer(*at("max_response_bytes"), 1, MAX_RESPONSE_BYTES)
    returns = None
    if "returns" in entries:
        returns_node, returns_field = at("returns")
        returns = tuple(_field_path(doc, item, f"{returns_field}[{i}]")
                        for i, item in enumerate(doc.sequence(returns_node, returns_field)))
    timeout = timeout_of(doc, *at("timeout")) if "timeout" in entries else DEFAULT_TIMEOUT
    return Tool(
        name, description, method, scheme, host, port, path, tuple(query), body,
        json.dumps(schema, sort_keys=True, ensure_ascii=False), credential, max_bytes, returns,
        timeout, source=str(doc.where(node)),
    )


def http_request(doc: YamlFile, node: Node, field: str) -> HttpRequestTool | None:
    """A policy's `http_request`: `true` (GET only, the default cap and timeout), `false`, or
    `{methods: [...], max_response_bytes: N, timeout: S}`."""
    if isinstance(node, ScalarNode):
        if not doc.boolean(node, field):
            return None
        return HttpRequestTool(("GET",), DEFAULT_RESPONSE_BYTES, DEFAULT_TIMEOUT,
                               str(doc.where(node)))
    entries = doc.mapping(node, field)
    doc.expect_keys(entries, node, field, HTTP_REQUEST_KEYS, required=())
    methods: tuple[str, ...] = ("GET",)
    if "methods" in entries:
        methods_node = entries["methods"][1]
        items = doc.sequence(methods_node, f"{field}.methods")
        methods = tuple(dict.fromkeys(doc.string(item, f"{field}.methods[{i}]")
                                      for i, item in enumerate(items)))
        bad = [m for m in methods if not _METHOD.fullmatch(m)]
        if not methods or bad:
            raise doc.error(methods_node, f"{field}.methods", "one or more uppercase HTTP "
                                                              "method tokens")
    max_bytes = DEFAULT_RESPONSE_BYTES
    if "max_response_bytes" in entries:
        max_bytes = doc.integer(entries["max_response_bytes"][1], f"{field}.max_response_bytes",
                                1, MAX_RESPONSE_BYTES)
    timeout = DEFAULT_TIMEOUT
    if "timeout" in entries:
        timeout = timeout_of(doc, entries["timeout"][1], f"{field}.timeout")
    return HttpRequestTool(methods, max_bytes, timeout, str(doc.where(node)))


def timeout_of(doc: YamlFile, node: Node, field: str) -> float:
    text = doc.scalar(node, field, (INT, FLOAT), "a number of seconds")
    try:
        timeout = float(text)
    except ValueError:
        timeout = math.nan
    if not 0 < timeout <= MAX_TIMEOUT:
        raise doc.error(node, field, f"{show(text)} must be seconds, > 0 and at most "
                                     f"{MAX_TIMEOUT:g}")
    return timeout


def url_of(doc: YamlFile, node: Node, field: str
         ) -> tuple[Literal["http", "https"], Host, int, str]:
    """Scheme, canonical host, port and path template of a tool's `url`."""
    url = doc.string(node, field)
    if "?" in url or "#" in url:
        raise doc.error(node, field, "the url has no query or fragment: put query parameters "
                                     "under query:")
    parts = urlsplit(url)
    if not url.startswith(("https://", "http://")):
        raise doc.error(node, field, "the url must start with https:// (or http://)")
    if "{" in parts.netloc or "}" in parts.netloc:
        raise doc.error(node, field, "the host and port are fixed: no {param} before the path")
    try:
        host, port = split_authority(parts.netloc, 443 if parts.scheme == "https" else 80)
    except HostError as exc:
        raise doc.error(node, field, f"invalid host: {exc}") from None
    path = parts.path or "/"
    stray = PARAM.sub("", path)
    if "{" in stray or "}" in stray:
        raise doc.error(node, field, "braces in the path are only for {param} (a name of "
                                     "A-Z a-z 0-9 _)")
    try:
        normalize_path(PARAM.sub("x", path))
    except PathError as exc:
        raise doc.error(node, field, f"the path can never be called: {exc}") from None
    return ("https" if parts.scheme == "https" else "http"), host, port, path


def _template(doc: YamlFile, node: Node, field: str) -> str:
    text = doc.string(node, field)
    if "{" in PARAM.sub("", text) or "}" in PARAM.sub("", text):
        raise doc.error(node, field, "braces are only for {param} (a name of A-Z a-z 0-9 _)")
    return text


def _json(doc: YamlFile, node: Node, field: str) -> Any:
    value = doc.value(node, field)
    problem = not_json(value)
    if problem:
        raise doc.error(node, field, problem)
    return value


def not_json(value: Any) -> str | None:
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "numbers must be finite"
    if isinstance(value, list):
        return next((p for p in map(not_json, value) if p), None)
    if isinstance(value, dict):
        return next((p for p in map(not_json, value.values()) if p), None)
    return f"{type(value).__name__} is not a JSON value (quote it)"


def _body_params(doc: YamlFile, node: Node, field: str, value: Any) -> list[str]:
    """The parameters a body template names: strings that are one `{param}` whole."""
    if isinstance(value, str):
        names = params_in(value)
        whole = names == params_in(value) and value == f"{{{names[0]}}}" if names else False
        if (names and not whole) or (not names and ("{" in value or "}" in value)):
            raise doc.error(node, field, f"{show(value)}: a body string is one {{param}} whole "
                                         "(replaced by the argument's JSON value) or plain text "
                                         "without braces")
        return names
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return [p for item in items for p in _body_params(doc, node, field, item)]


def _schema(doc: YamlFile, node: Node, field: str) -> dict[str, Any]:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    value = _json(doc, node, field)
    if not isinstance(value, dict) or value.get("type") != "object":
        raise doc.error(node, field, "the arguments' schema is an object schema (type: object)")
    try:
        Draft202012Validator.check_schema(value)
    except SchemaError as exc:
        where = "/".join(map(str, exc.path)) or "its root"
        raise doc.error(node, field, f"not a JSON Schema (draft 2020-12) at {where}: "
                                     f"{exc.message[:200]}") from None
    return value


def _check_params(doc: YamlFile, node: Node, field: str, schema: Mapping[str, Any], *,
                  path_params: list[str], other: list[str]) -> None:
    properties = schema.get("properties")
    declared = set(properties) if isinstance(properties, dict) else set()
    for name in (*path_params, *other):
        if name not in declared:
            raise doc.error(node, field, f"{{{name}}} is used but not declared under properties")
    required = schema.get("required")
    needed = set(required) if isinstance(required, list) else set()
    for name in path_params:
        if name not in needed:
            raise doc.error(node, field,
                            f"{{{name}}} is in the url's path, so it must be required")


def _field_path(doc: YamlFile, node: Node, field: str) -> str:
    if not isinstance(node, ScalarNode):
        raise doc.error(node, field, "a field path is a string (`user.login`)")
    text = doc.string(node, field)
    if not _FIELD_PATH.fullmatch(text):
        raise doc.error(node, field, f"{show(text)} is not a field path (names joined by '.')")
    return text
