"""One rules file, walked node by node: every key checked against the fields we know, every
scalar against the type we expect, so a typo can neither widen nor narrow a policy silently.

Checks that span files (a name defined twice, a sandbox naming a policy of another file) are
`rulesfile.py`'s. The format is documented in docs/rules.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from typing import Final, TypeVar

from yaml.nodes import Node, ScalarNode

from sealgate.yamlfile import FLOAT, INT, Entries, Where, YamlFile, describe, join, show

from . import gatewaygrammar, toolgrammar
from .injections import injections
from .model import (
    ANY_HOST,
    Budgets,
    Injection,
    Mode,
    PathPatternError,
    Policy,
    Rule,
    RulesError,
    RuleWarning,
    SandboxEntry,
    path_glob_regex,
)
from .targets import Lint, TargetError, host_pattern, network
from .tools import Tool

__all__ = ["RulesDocument"]

_T = TypeVar("_T")

_VERSION: Final = 1
_MAX_INT: Final = 2**63 - 1
_MAX_RATE: Final = 1e9

_DEFAULT_PORTS: Final = frozenset({80, 443})
_MODES: Final[tuple[Mode, ...]] = ("enforce", "report")
# Policy names and sandbox ids appear in logs and in `Proxy-Authorization: Basic id:key`, so no
# ':' and nothing that needs quoting.
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_METHOD: Final = re.compile(r"[A-Z][A-Z0-9_-]{0,31}")
_DECIMAL: Final = re.compile(r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
_HEX64: Final = re.compile(r"[0-9A-Fa-f]{64}")

_TOP_KEYS: Final = ("version", "policies", "sandboxes", "default_policy")
_POLICY_KEYS: Final = ("mode", "tokens", "allow", "allow_networks", "budgets", "tools",
                       "http_request", "mcp_servers")
_RULE_KEYS: Final = ("host", "ports", "methods", "paths", "inject", "strip", "plain_http",
                     "response_timeout", "tools_only")
_MAX_RESPONSE_SECONDS: Final = 24 * 3600.0
_SANDBOX_KEYS: Final = ("policy", "key_sha256")
_BUDGET_INTS: Final = {  # field -> minimum
    "burst": 1,
    "max_connections": 1,
    "max_request_bytes": 0,
    "max_total_bytes": 1,
}


class RulesDocument(YamlFile):
    """One parsed and validated rules file: its policies, sandboxes and default policy, each
    with where it is written, and the warnings it earned."""

    error_type = RulesError

    def __init__(self, path: Path, text: str | None = None) -> None:
        super().__init__(path, text)
        self.warnings: list[RuleWarning] = []
        self.policies: dict[str, tuple[Policy, Where]] = {}
        # sandbox id -> (entry, where the id is, where its policy is named)
        self.sandboxes: dict[str, tuple[SandboxEntry, Where, Where]] = {}
        self.default_policy: tuple[str, Where] | None = None
        if self.root is None:
            raise RulesError(path, None, "", "file is empty; expected a mapping with 'version: 1'")
        self._top(self.root)

    def _warn(self, code: str, node: Node, field: str, message: str) -> None:
        self.warnings.append(RuleWarning(code, self.path, self.where(node).line, field, message))

    def _lint(self, lints: list[Lint], node: Node, field: str) -> None:
        for code, message in lints:
            self._warn(code, node, field, message)

    # -- the document ---------------------------------------------------------------------

    def _top(self, root: Node) -> None:
        entries = self.mapping(root, "")
        if "version" not in entries:
            raise self.error(root, "version", "required key is missing (write 'version: 1')")
        version_node = entries["version"][1]
        if not (
            isinstance(version_node, ScalarNode)
            and version_node.tag == INT
            and version_node.value == str(_VERSION)
        ):
            shown = (
                show(version_node.value)
                if isinstance(version_node, ScalarNode)
                else describe(version_node)
            )
            raise self.error(
                version_node,
                "version",
                f"unsupported rules version {shown} (this sealgate reads version {_VERSION})",
            )
        self.expect_keys(entries, root, "", _TOP_KEYS)
        if "policies" in entries:
            for name, key_node, value in self._named(entries["policies"][1], "policies", "policy"):
                field = f"policies.{name}"
                self.policies[name] = (self._policy(name, value, field), self.where(key_node))
        if "sandboxes" in entries:
            for sid, key_node, value in self._named(entries["sandboxes"][1], "sandboxes", "id"):
                entry, policy_node = self._sandbox(sid, key_node, value, f"sandboxes.{sid}")
                self.sandboxes[sid] = (entry, self.where(key_node), self.where(policy_node))
        if "default_policy" in entries:
            node = entries["default_policy"][1]
            if not self.is_null(node):
                name = self._name(node, "default_policy", "policy name")
                self.default_policy = (name, self.where(node))

    def _name(self, node: Node, field: str, what: str) -> str:
        name = self.string(node, field)
        if not _NAME.fullmatch(name):
            raise self.error(
                node,
                field,
                f"{what} {show(name)} must be 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -)",
            )
        return name

    def _named(self, node: Node, field: str, what: str) -> Iterator[tuple[str, ScalarNode, Node]]:
        for key, (key_node, value) in self.mapping(node, field).items():
            yield self._name(key_node, join(field, key), what), key_node, value

    # -- policies -------------------------------------------------------------------------

    def _policy(self, name: str, node: Node, field: str) -> Policy:
        entries = self.mapping(node, field)
        self.expect_keys(entries, node, field, _POLICY_KEYS)
        mode: Mode = "enforce"
        if "mode" in entries:
            mode_node = entries["mode"][1]
            text = self.string(mode_node, f"{field}.mode")
            if text not in _MODES:
                raise self.error(mode_node, f"{field}.mode", "must be enforce or report")
            mode = "enforce" if text == "enforce" else "report"
        tokens = (
            self.boolean(entries["tokens"][1], f"{field}.tokens") if "tokens" in entries else False
        )
        rules: list[Rule] = []
        if "allow" in entries:
            seen: dict[Rule, Rule] = {}
            for i, rule_node in enumerate(self.sequence(entries["allow"][1], f"{field}.allow")):
                rule_field = f"{field}.allow[{i}]"
                rule = self._rule(rule_node, rule_field)
                if rule in seen:
                    self._warn(
                        "duplicate_rule",
                        rule_node,
                        rule_field,
                        f"same as the rule at {seen[rule].source}; it adds nothing",
                    )
                seen.setdefault(rule, rule)
                rules.append(rule)
        networks: list[IPv4Network | IPv6Network] = []
        if "allow_networks" in entries:
            net_field = f"{field}.allow_networks"
            for net_node in self.sequence(entries["allow_networks"][1], net_field):
                net, lints = self._target(network, net_node, net_field)
                self._lint(lints, net_node, net_field)
                networks.append(net)
        budgets = (
            self._budgets(entries["budgets"][1], f"{field}.budgets")
            if "budgets" in entries
            else Budgets()
        )
        if tokens and (blind := sum(not r.needs_request_inspection for r in rules)):
            # Tokens ride in request headers, so a policy that accepts them passes nothing
            # through; a client pinning a host's certificate would fail there.
            self._warn(
                "tokens_intercept", entries["tokens"][1], f"{field}.tokens",
                f"tokens: true intercepts the {blind} rule(s) that alone would pass TLS through "
                "undecrypted (a token inside a blind tunnel could not be seen)",
            )
        named = self._named_credentials(rules, entries, field)
        tools: tuple[Tool, ...] = ()
        if "tools" in entries:
            tools = toolgrammar.tools(self, entries["tools"][1], f"{field}.tools", named)
        generic = None
        if "http_request" in entries:
            generic = toolgrammar.http_request(self, entries["http_request"][1],
                                               f"{field}.http_request")
            if generic is not None and any(t.name == generic.name for t in tools):
                raise self.error(entries["http_request"][1], f"{field}.http_request",
                                 f"a declared tool is already named {generic.name!r}")
        servers = (gatewaygrammar.mcp_servers(self, entries["mcp_servers"][1],
                                              f"{field}.mcp_servers", named)
                   if "mcp_servers" in entries else ())
        for server in servers:
            for rule in rules:
                if not rule.tools_only and any(i.name == server.credential and i.name
                                               for i in rule.inject):
                    self._warn("proxied_credential", entries["mcp_servers"][1],
                               f"{field}.mcp_servers",
                               f"the rule at {rule.source} injects {server.name!r}'s credential "
                               "and is not tools_only: the sandbox's own requests through the "
                               "proxy get it too, past the server's tool list")
        return Policy(name, mode, tokens, tuple(rules), tuple(networks), budgets, tools,
                      generic, servers)

    def _named_credentials(self, rules: list[Rule], entries: Entries, field: str
                           ) -> dict[str, Injection]:
        """The policy's inject entries by name; one name is one credential (secret and
        processor), however many rules carry it."""
        named: dict[str, tuple[Injection, Rule]] = {}
        for rule in rules:
            for injection in rule.inject:
                if injection.name is None:
                    continue
                first = named.setdefault(injection.name, (injection, rule))
                if (first[0].secret, first[0].processor) != (injection.secret,
                                                             injection.processor):
                    raise self.error(entries["allow"][1], f"{field}.allow",
                                     f"inject name {injection.name!r} names two credentials: "
                                     f"at {first[1].source} and at {rule.source}")
        return {name: injection for name, (injection, _) in named.items()}

    def _budgets(self, node: Node, field: str) -> Budgets:
        entries = self.mapping(node, field)
        keys = ("requests_per_second", *_BUDGET_INTS)
        self.expect_keys(entries, node, field, keys)
        defaults = Budgets()
        rate = defaults.requests_per_second
        if "requests_per_second" in entries:
            rate_node = entries["requests_per_second"][1]
            rate_field = f"{field}.requests_per_second"
            text = self.scalar(rate_node, rate_field, (INT, FLOAT), "a number")
            if not _DECIMAL.fullmatch(text) or not 0 < float(text) <= _MAX_RATE:
                raise self.error(
                    rate_node, rate_field, f"{show(text)} must be a decimal number > 0"
                )
            rate = float(text)
        values = {
            key: self.integer(entries[key][1], f"{field}.{key}", low, _MAX_INT)
            if key in entries
            else getattr(defaults, key)
            for key, low in _BUDGET_INTS.items()
        }
        return Budgets(requests_per_second=rate, **values)

    # -- rules ----------------------------------------------------------------------------

    def _rule(self, node: Node, field: str) -> Rule:
        entries = self.mapping(node, field)
        self.expect_keys(entries, node, field, _RULE_KEYS, required=("host",))
        host_node = entries["host"][1]
        host, lints = self._target(host_pattern, host_node, f"{field}.host")
        self._lint(lints, host_node, f"{field}.host")
        ports: frozenset[int] = _DEFAULT_PORTS
        if "ports" in entries:
            ports_field = f"{field}.ports"
            items = self.sequence(entries["ports"][1], ports_field)
            ports = frozenset(self._port(item, ports_field) for item in items)
            self._never_if_empty(items, entries["ports"][1], ports_field)
        methods: frozenset[str] | None = None
        if "methods" in entries:
            methods_field = f"{field}.methods"
            items = self.sequence(entries["methods"][1], methods_field)
            methods = frozenset(self._method(item, methods_field) for item in items)
            self._never_if_empty(items, entries["methods"][1], methods_field)
        paths: tuple[str, ...] | None = None
        if "paths" in entries:
            paths_field = f"{field}.paths"
            items = self.sequence(entries["paths"][1], paths_field)
            paths = tuple(dict.fromkeys(self._path(item, paths_field) for item in items))
            self._never_if_empty(items, entries["paths"][1], paths_field)
        inject: tuple[Injection, ...] = ()
        if "inject" in entries:
            inject = injections(self, entries["inject"][1], f"{field}.inject")
        strip: tuple[str, ...] = ()
        if "strip" in entries:
            strip_field = f"{field}.strip"
            strip = tuple(
                self._header_name(item, strip_field)
                for item in self.sequence(entries["strip"][1], strip_field)
            )
        plain_http = (
            self.boolean(entries["plain_http"][1], f"{field}.plain_http")
            if "plain_http" in entries
            else False
        )
        if (inject or strip) and host == ANY_HOST:
            raise self.error(node, f"{field}.inject", "credentials are never injected for '*'")
        response_timeout = (
            self._seconds(entries["response_timeout"][1], f"{field}.response_timeout")
            if "response_timeout" in entries
            else None
        )
        tools_only = (
            self.boolean(entries["tools_only"][1], f"{field}.tools_only")
            if "tools_only" in entries
            else False
        )
        return Rule(
            host, ports, methods, paths, source=str(self.where(node)),
            inject=inject, strip=strip, plain_http=plain_http, response_timeout=response_timeout,
            tools_only=tools_only,
        )

    def _seconds(self, node: Node, field: str) -> float:
        text = self.scalar(node, field, (INT, FLOAT), "a number of seconds")
        if not _DECIMAL.fullmatch(text) or not 0 < float(text) <= _MAX_RESPONSE_SECONDS:
            raise self.error(node, field, f"{show(text)} must be seconds, > 0 and at most "
                                          f"{_MAX_RESPONSE_SECONDS:g}")
        return float(text)

    def _target(
        self, parse: Callable[[str], tuple[_T, list[Lint]]], node: Node, field: str
    ) -> tuple[_T, list[Lint]]:
        try:
            return parse(self.string(node, field))
        except TargetError as exc:
            raise self.error(node, field, str(exc)) from None

    def _header_name(self, node: Node, field: str) -> str:
        name = self.string(node, field)
        if not _HEADER_NAME.fullmatch(name):
            raise self.error(node, field, f"{show(name)} is not a header name")
        return name.lower()

    def _never_if_empty(self, items: list[Node], node: Node, field: str) -> None:
        if not items:
            self._warn("never_matches", node, field, "empty list: this rule can never match")

    def _port(self, node: Node, field: str) -> int:
        return self.integer(node, field, 1, 65535, what="port ")

    def _method(self, node: Node, field: str) -> str:
        method = self.string(node, field)
        if not _METHOD.fullmatch(method):
            hint = (
                " (methods are case-sensitive: write it in uppercase)"
                if method.upper() != method
                else ""
            )
            raise self.error(node, field, f"{show(method)} is not an HTTP method token{hint}")
        return method

    def _path(self, node: Node, field: str) -> str:
        pattern = self.string(node, field)
        try:
            path_glob_regex(pattern)
        except PathPatternError as exc:
            raise self.error(node, field, f"{show(pattern)}: {exc}") from None
        return pattern

    # -- sandboxes ------------------------------------------------------------------------

    def _sandbox(
        self, sid: str, key_node: Node, node: Node, field: str
    ) -> tuple[SandboxEntry, Node]:
        entries = self.mapping(node, field)
        self.expect_keys(entries, key_node, field, _SANDBOX_KEYS, required=_SANDBOX_KEYS)
        policy_node = entries["policy"][1]
        policy = self._name(policy_node, f"{field}.policy", "policy name")
        hash_node = entries["key_sha256"][1]
        digest = self.string(hash_node, f"{field}.key_sha256")
        if not _HEX64.fullmatch(digest):
            # Never echoed: someone may have pasted the password itself here.
            raise self.error(
                hash_node,
                f"{field}.key_sha256",
                "must be 64 hex digits, the SHA-256 of the sandbox's proxy password "
                f"(got {len(digest)} characters)",
            )
        return SandboxEntry(sid, policy, bytes.fromhex(digest)), policy_node
