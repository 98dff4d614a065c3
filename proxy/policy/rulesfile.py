"""Rules files: YAML in, a validated `RuleSet` out, or a `RulesError` naming file, line and field.

The YAML is composed into nodes (which keep their line numbers) and walked here by hand rather
than constructed into Python objects: every key is checked against the fields we know, every
scalar against the type we expect, so a typo can neither widen nor narrow a policy silently.
The format is documented in docs/rules.md.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_network
from pathlib import Path
from types import MappingProxyType
from typing import Final

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from sealgate.files import read_regular
from sealgate.hostname import Host, HostError, canonical_host, denied_name
from sealgate.issuer.processors import InjectionError, processor_from_object, target
from sealgate.proxy.credentials.secrets.base import SecretConfigError, SecretRef, parse_ref
from sealgate.proxy.net.addresses import METADATA_ADDRESSES
from sealgate.proxy.policy.model import (
    ANY_HOST,
    Budgets,
    Injection,
    Mode,
    PathPatternError,
    Policy,
    Rule,
    RuleSet,
    RuleWarning,
    SandboxEntry,
    format_location,
    path_glob_regex,
)

__all__ = ["MAX_FILE_BYTES", "RulesError", "load_rules"]

MAX_FILE_BYTES: Final = 1024 * 1024
_VERSION: Final = 1
_MAX_DEPTH: Final = 32
_MAX_INT: Final = 2**63 - 1
_MAX_RATE: Final = 1e9
_SHOW_MAX: Final = 100

_DEFAULT_PORTS: Final = frozenset({80, 443})
_MODES: Final[tuple[Mode, ...]] = ("enforce", "report")
# Policy names and sandbox ids appear in logs and in `Proxy-Authorization: Basic id:key`, so no
# ':' and nothing that needs quoting.
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_METHOD: Final = re.compile(r"[A-Z][A-Z0-9_-]{0,31}")
_INT: Final = re.compile(r"-?(?:0|[1-9](?:_?[0-9])*)")
_DECIMAL: Final = re.compile(r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
_HEX64: Final = re.compile(r"[0-9A-Fa-f]{64}")
_BARE_IPV6: Final = re.compile(r"[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*")
# For a warning only: the address layer refuses these whatever allow_networks says.
_METADATA_FORMS: Final = (
    *METADATA_ADDRESSES,
    *(IPv6Address(f"::ffff:{a}") for a in METADATA_ADDRESSES if a.version == 4),
)
_WIDE_PREFIX: Final = {4: 16, 6: 48}

_T: Final = "tag:yaml.org,2002:"
_STR, _INT_TAG, _FLOAT, _BOOL, _NULL = (f"{_T}{t}" for t in ("str", "int", "float", "bool", "null"))

_TOP_KEYS: Final = ("version", "policies", "sandboxes", "default_policy")
_POLICY_KEYS: Final = ("mode", "tokens", "allow", "allow_networks", "budgets")
_RULE_KEYS: Final = ("host", "ports", "methods", "paths", "inject", "strip", "plain_http")
_INJECT_KEYS: Final = ("secret", "as")
_VAULT_KEYS: Final = ("mount", "path", "field", "kv_version")
_SANDBOX_KEYS: Final = ("policy", "key_sha256")
_BUDGET_INTS: Final = {  # field -> minimum
    "burst": 1,
    "max_connections": 1,
    "max_request_bytes": 0,
    "max_total_bytes": 1,
}


class RulesError(ValueError):
    """A rules file we refuse to load. `str()` is `file:line: field: message`."""

    reason = "rules_invalid"

    def __init__(self, path: Path, line: int | None, field: str, message: str) -> None:
        super().__init__(format_location(path, line, field, message))
        self.path = path
        self.line = line
        self.field = field
        self.message = message


def load_rules(path: Path) -> RuleSet:
    """Load a rules file, or every `*.yaml` / `*.yml` directly in a directory (sorted, merged)."""
    merged = _Merged()
    for file in _rule_files(path):
        merged.add(_Document(file, _read(file)))
    return merged.finish()


def _rule_files(path: Path) -> list[Path]:
    if path.is_dir():
        # Dotfiles are editor locks and swap files (`.#ci.yaml`) or the hidden `..data` of a
        # Kubernetes ConfigMap mount, never rules.
        try:
            files = sorted(
                p
                for p in path.iterdir()
                if not p.name.startswith(".") and p.suffix in (".yaml", ".yml") and p.is_file()
            )
        except OSError as exc:
            raise RulesError(path, None, "", f"cannot list directory: {exc.strerror}") from None
        if not files:
            raise RulesError(path, None, "", "no *.yaml or *.yml files in this directory")
        return files
    if path.is_file():
        return [path]
    raise RulesError(path, None, "", "not a file or directory")


def _read(path: Path) -> str:
    try:
        data, _ = read_regular(path, MAX_FILE_BYTES)
    except OSError as exc:
        raise RulesError(path, None, "", f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise RulesError(path, None, "", f"file is larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RulesError(path, None, "", f"not valid UTF-8 (byte {exc.start})") from None


# --- YAML -------------------------------------------------------------------------------------


class _Refused(Exception):
    def __init__(self, line: int | None, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader's composer minus anchors, aliases, explicit tags and deep nesting.

    Aliases are how YAML bombs multiply; tags are how YAML asks for objects. Neither belongs in
    a rules file, and refusing them while composing means we never build the expanded tree.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        # The stubs leave Parser.peek_event untyped; it returns the next parser event.
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            raise _Refused(line, "YAML anchors and aliases are not allowed")
        if isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent) and event.tag:
            raise _Refused(line, "YAML tags are not allowed")
        if self._depth >= _MAX_DEPTH:
            raise _Refused(line, f"nested deeper than {_MAX_DEPTH} levels")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _compose(path: Path, text: str) -> Node | None:
    loader = _StrictLoader(text)
    try:
        return loader.get_single_node()
    except _Refused as exc:
        raise RulesError(path, exc.line, "", exc.message) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        # Only the parser's words, never its snippet of the file: the line may hold a key hash.
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise RulesError(
            path, mark.line + 1 if mark else None, "", f"YAML syntax error: {problem}"
        ) from None
    except yaml.YAMLError as exc:
        raise RulesError(path, None, "", f"YAML error: {type(exc).__name__}") from None
    finally:
        loader.dispose()


# --- one file ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Where:
    path: Path
    line: int | None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line is not None else str(self.path)


_Entries = dict[str, tuple[ScalarNode, Node]]


def _line(node: Node) -> int | None:
    return node.start_mark.line + 1 if node.start_mark is not None else None


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _show(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= _SHOW_MAX else shown[: _SHOW_MAX - 3] + "..."


def _describe(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return {_NULL: "null", _BOOL: "true/false", _INT_TAG: "a number", _FLOAT: "a number"}.get(
        node.tag, "a string"
    )


class YamlFile:
    """A YAML file read the strict way (no anchors, aliases, tags or duplicate keys), with typed
    access whose errors name file, line and field. The rules and `rules test` case files."""

    def __init__(self, path: Path, text: str | None = None) -> None:
        self.path = path
        self.root = _compose(path, _read(path) if text is None else text)

    # errors and typed access

    def _where(self, node: Node) -> _Where:
        return _Where(self.path, _line(node))

    def _error(self, node: Node, field: str, message: str) -> RulesError:
        return RulesError(self.path, _line(node), field, message)

    def _mapping(self, node: Node, field: str) -> _Entries:
        if not isinstance(node, MappingNode):
            raise self._error(node, field, f"expected a mapping, got {_describe(node)}")
        entries: _Entries = {}
        for key_node, value in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag != _STR:
                raise self._error(key_node, field, "keys must be plain strings (quote them)")
            key: str = key_node.value
            if key in entries:
                first = _line(entries[key][0])
                raise self._error(
                    key_node, _join(field, key), f"duplicate key (first at line {first})"
                )
            entries[key] = (key_node, value)
        return entries

    def _expect_keys(
        self,
        entries: _Entries,
        where: Node,
        field: str,
        allowed: Collection[str],
        required: Collection[str] = (),
    ) -> None:
        for key, (key_node, _) in entries.items():
            if key not in allowed:
                raise self._error(
                    key_node,
                    _join(field, key),
                    f"unknown key {_show(key)} (expected one of: {', '.join(allowed)})",
                )
        for key in required:
            if key not in entries:
                raise self._error(where, _join(field, key), "required key is missing")

    def _scalar(self, node: Node, field: str, tags: Collection[str], what: str) -> str:
        if not isinstance(node, ScalarNode) or node.tag not in tags:
            raise self._error(node, field, f"expected {what}, got {_describe(node)}")
        value: str = node.value
        return value

    def _string(self, node: Node, field: str) -> str:
        return self._scalar(node, field, (_STR,), "a string")

    def _name(self, node: Node, field: str, what: str) -> str:
        name = self._string(node, field)
        if not _NAME.fullmatch(name):
            raise self._error(
                node,
                field,
                f"{what} {_show(name)} must be 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -)",
            )
        return name

    def _int(self, node: Node, field: str, low: int, high: int, what: str = "") -> int:
        text = self._scalar(node, field, (_INT_TAG,), "an integer")
        # YAML 1.1 would read 0443 as octal and 0x1bb as hex: one spelling per number.
        if not _INT.fullmatch(text):
            raise self._error(node, field, f"{_show(text)} is not a plain decimal integer")
        value = int(text)
        if not low <= value <= high:
            raise self._error(node, field, f"{what}{value} out of range {low}-{high}")
        return value

    def _bool(self, node: Node, field: str) -> bool:
        text = self._scalar(node, field, (_BOOL,), "true or false")
        # YAML 1.1 also reads yes/no/on/off as booleans; one spelling avoids surprises.
        if text.lower() not in ("true", "false"):
            raise self._error(node, field, f"write true or false, not {_show(text)}")
        return text.lower() == "true"

    def _list(self, node: Node, field: str) -> list[Node]:
        if not isinstance(node, SequenceNode):
            raise self._error(node, field, f"expected a list, got {_describe(node)}")
        items: list[Node] = node.value
        return items

    def _named(self, node: Node, field: str, what: str) -> Iterator[tuple[str, ScalarNode, Node]]:
        for key, (key_node, value) in self._mapping(node, field).items():
            yield self._name(key_node, _join(field, key), what), key_node, value



class _Document(YamlFile):
    """One parsed and validated rules file; cross-file checks happen in `_Merged`."""

    def __init__(self, path: Path, text: str) -> None:
        super().__init__(path, text)
        self.warnings: list[RuleWarning] = []
        self.policies: dict[str, tuple[Policy, _Where]] = {}
        # sandbox id -> (entry, where the id is, where its policy is named)
        self.sandboxes: dict[str, tuple[SandboxEntry, _Where, _Where]] = {}
        self.default_policy: tuple[str, _Where] | None = None
        if self.root is None:
            raise RulesError(path, None, "", "file is empty; expected a mapping with 'version: 1'")
        self._top(self.root)

    def _warn(self, code: str, node: Node, field: str, message: str) -> None:
        self.warnings.append(RuleWarning(code, self.path, _line(node), field, message))

    # the document

    def _top(self, root: Node) -> None:
        entries = self._mapping(root, "")
        if "version" not in entries:
            raise self._error(root, "version", "required key is missing (write 'version: 1')")
        version_node = entries["version"][1]
        if not (
            isinstance(version_node, ScalarNode)
            and version_node.tag == _INT_TAG
            and version_node.value == str(_VERSION)
        ):
            shown = (
                _show(version_node.value)
                if isinstance(version_node, ScalarNode)
                else _describe(version_node)
            )
            raise self._error(
                version_node,
                "version",
                f"unsupported rules version {shown} (this sealgate reads version {_VERSION})",
            )
        self._expect_keys(entries, root, "", _TOP_KEYS)
        if "policies" in entries:
            for name, key_node, value in self._named(entries["policies"][1], "policies", "policy"):
                field = f"policies.{name}"
                self.policies[name] = (self._policy(name, value, field), self._where(key_node))
        if "sandboxes" in entries:
            for sid, key_node, value in self._named(entries["sandboxes"][1], "sandboxes", "id"):
                entry, policy_node = self._sandbox(sid, key_node, value, f"sandboxes.{sid}")
                self.sandboxes[sid] = (entry, self._where(key_node), self._where(policy_node))
        if "default_policy" in entries:
            node = entries["default_policy"][1]
            if not (isinstance(node, ScalarNode) and node.tag == _NULL):
                name = self._name(node, "default_policy", "policy name")
                self.default_policy = (name, self._where(node))

    def _policy(self, name: str, node: Node, field: str) -> Policy:
        entries = self._mapping(node, field)
        self._expect_keys(entries, node, field, _POLICY_KEYS)
        mode: Mode = "enforce"
        if "mode" in entries:
            mode_node = entries["mode"][1]
            text = self._string(mode_node, f"{field}.mode")
            if text not in _MODES:
                raise self._error(mode_node, f"{field}.mode", "must be enforce or report")
            mode = "enforce" if text == "enforce" else "report"
        tokens = (
            self._bool(entries["tokens"][1], f"{field}.tokens") if "tokens" in entries else False
        )
        rules: list[Rule] = []
        if "allow" in entries:
            seen: dict[Rule, Rule] = {}
            for i, rule_node in enumerate(self._list(entries["allow"][1], f"{field}.allow")):
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
            for net_node in self._list(entries["allow_networks"][1], net_field):
                networks.append(self._network(net_node, net_field))
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
        return Policy(name, mode, tokens, tuple(rules), tuple(networks), budgets)

    def _rule(self, node: Node, field: str) -> Rule:
        entries = self._mapping(node, field)
        self._expect_keys(entries, node, field, _RULE_KEYS, required=("host",))
        host = self._host(entries["host"][1], f"{field}.host")
        ports: frozenset[int] = _DEFAULT_PORTS
        if "ports" in entries:
            ports_field = f"{field}.ports"
            items = self._list(entries["ports"][1], ports_field)
            ports = frozenset(self._port(item, ports_field) for item in items)
            self._never_if_empty(items, entries["ports"][1], ports_field)
        methods: frozenset[str] | None = None
        if "methods" in entries:
            methods_field = f"{field}.methods"
            items = self._list(entries["methods"][1], methods_field)
            methods = frozenset(self._method(item, methods_field) for item in items)
            self._never_if_empty(items, entries["methods"][1], methods_field)
        paths: tuple[str, ...] | None = None
        if "paths" in entries:
            paths_field = f"{field}.paths"
            items = self._list(entries["paths"][1], paths_field)
            paths = tuple(dict.fromkeys(self._path(item, paths_field) for item in items))
            self._never_if_empty(items, entries["paths"][1], paths_field)
        inject: tuple[Injection, ...] = ()
        if "inject" in entries:
            inject_field = f"{field}.inject"
            inject = tuple(
                self._injection(item, f"{inject_field}[{i}]")
                for i, item in enumerate(self._list(entries["inject"][1], inject_field))
            )
            self._one_writer_each(inject, entries["inject"][1], inject_field)
        strip: tuple[str, ...] = ()
        if "strip" in entries:
            strip_field = f"{field}.strip"
            strip = tuple(
                self._header_name(item, strip_field)
                for item in self._list(entries["strip"][1], strip_field)
            )
        plain_http = (
            self._bool(entries["plain_http"][1], f"{field}.plain_http")
            if "plain_http" in entries
            else False
        )
        if (inject or strip) and host == ANY_HOST:
            raise self._error(node, f"{field}.inject", "credentials are never injected for '*'")
        return Rule(
            host, ports, methods, paths, source=str(self._where(node)),
            inject=inject, strip=strip, plain_http=plain_http,
        )

    def _injection(self, node: Node, field: str) -> Injection:
        entries = self._mapping(node, field)
        self._expect_keys(entries, node, field, _INJECT_KEYS, required=_INJECT_KEYS)
        secret_node = entries["secret"][1]
        try:
            ref = self._secret_ref(secret_node, f"{field}.secret")
        except SecretConfigError as exc:
            raise self._error(secret_node, f"{field}.secret", str(exc)) from None
        as_node = entries["as"][1]
        as_field = f"{field}.as"
        # `as: bearer` is short for `as: {type: bearer}`; a mapping is the processor's JSON form,
        # the same one sealed tokens carry (docs/token-format.md).
        if isinstance(as_node, ScalarNode):
            spec: dict[str, str] = {"type": self._string(as_node, as_field)}
        else:
            spec = {
                key: self._string(value, f"{as_field}.{key}")
                for key, (_, value) in self._mapping(as_node, as_field).items()
            }
        try:
            processor = processor_from_object(spec)
        except InjectionError as exc:
            raise self._error(as_node, as_field, str(exc)) from None
        return Injection(ref, processor)

    def _secret_ref(self, node: Node, field: str) -> SecretRef:
        """`vault:kv/data/ci/github#token` (any store), or Vault's split form
        `{mount: kv, path: ci/github, field: token, kv_version: 2}`."""
        if not isinstance(node, MappingNode):
            return parse_ref(self._string(node, field))
        entries = self._mapping(node, field)
        self._expect_keys(entries, node, field, _VAULT_KEYS, required=_VAULT_KEYS[:3])
        mount, path, key = (self._string(entries[k][1], _join(field, k)) for k in _VAULT_KEYS[:3])
        version = entries.get("kv_version")
        kv = 2 if version is None else self._int(version[1], f"{field}.kv_version", 1, 2)
        return SecretRef.vault(mount, path, key, kv_version=kv)

    def _one_writer_each(self, inject: tuple[Injection, ...], node: Node, field: str) -> None:
        # Two credentials for one header (or parameter): one would undo the other on every
        # request, or make the proxy refuse it (injection_conflict).
        first: dict[str, int] = {}
        for i, injection in enumerate(inject):
            written = target(injection.processor)
            if written in first:
                raise self._error(
                    node, field, f"[{first[written]}] and [{i}] both write {written}"
                )
            first[written] = i

    def _header_name(self, node: Node, field: str) -> str:
        name = self._string(node, field)
        if not _HEADER_NAME.fullmatch(name):
            raise self._error(node, field, f"{_show(name)} is not a header name")
        return name.lower()

    def _never_if_empty(self, items: list[Node], node: Node, field: str) -> None:
        if not items:
            self._warn("never_matches", node, field, "empty list: this rule can never match")

    def _port(self, node: Node, field: str) -> int:
        return self._int(node, field, 1, 65535, what="port ")

    def _method(self, node: Node, field: str) -> str:
        method = self._string(node, field)
        if not _METHOD.fullmatch(method):
            hint = (
                " (methods are case-sensitive: write it in uppercase)"
                if method.upper() != method
                else ""
            )
            raise self._error(node, field, f"{_show(method)} is not an HTTP method token{hint}")
        return method

    def _path(self, node: Node, field: str) -> str:
        pattern = self._string(node, field)
        try:
            path_glob_regex(pattern)
        except PathPatternError as exc:
            raise self._error(node, field, f"{_show(pattern)}: {exc}") from None
        return pattern

    def _host(self, node: Node, field: str) -> str:
        raw = self._string(node, field)
        if raw == ANY_HOST:
            self._warn("any_host", node, field, "'*' allows every public host")
            return ANY_HOST
        wildcard = raw.startswith("*.")
        body = raw[2:] if wildcard else raw
        if "*" in body:
            raise self._error(node, field, "'*' is only allowed alone or as a leading '*.'")
        # canonical_host reads authorities, where IPv6 is bracketed; rules may omit the brackets.
        text = f"[{body}]" if _BARE_IPV6.fullmatch(body) else body
        try:
            host = canonical_host(text)
        except HostError as exc:
            # Not echoed: a pasted URL may carry userinfo. hostname.py words its errors safely.
            raise self._error(node, field, f"invalid host: {exc}") from None
        if wildcard and host.ip is not None:
            raise self._error(node, field, f"{_show(raw)}: a wildcard cannot cover an IP address")
        pattern = f"*.{host.name}" if wildcard else host.name
        if body.strip("[]") != host.name:
            self._warn(
                "noncanonical_host",
                node,
                field,
                f"{_show(raw)} is matched as {pattern!r}; write it that way",
            )
        if host.ip is not None:
            self._warn(
                "ip_literal_host",
                node,
                field,
                f"{pattern} matches only requests to that literal address, never a name",
            )
            return pattern
        self._warn_denied(host, wildcard, node, field, pattern)
        return pattern

    def _warn_denied(
        self, host: Host, wildcard: bool, node: Node, field: str, pattern: str
    ) -> None:
        # The guard refuses some names whatever the policy says. A wildcard is tested with one
        # sample subdomain: the name denials that cover subdomains are all suffix-based.
        probe = Host(f"x.{host.name}") if wildcard else host
        reason = denied_name(probe)
        if reason is not None:
            self._warn(
                "never_matches",
                node,
                field,
                f"{pattern} is always denied by the guard ({reason}); this rule can never match",
            )
        elif wildcard and "." not in host.name:
            self._warn(
                "broad_wildcard",
                node,
                field,
                f"{pattern} allows every name under a top-level domain",
            )

    def _network(self, node: Node, field: str) -> IPv4Network | IPv6Network:
        text = self._string(node, field)
        try:
            net = ip_network(text, strict=True)
        except ValueError as exc:
            raise self._error(node, field, f"invalid network: {exc}") from None
        if net.prefixlen < _WIDE_PREFIX[net.version]:
            self._warn(
                "wide_network",
                node,
                field,
                f"{net} is wider than /{_WIDE_PREFIX[net.version]}; "
                "every address in it becomes reachable",
            )
        if any(address in net for address in _METADATA_FORMS if address.version == net.version):
            self._warn(
                "metadata_network",
                node,
                field,
                f"{net} contains a cloud metadata address; those stay denied regardless",
            )
        return net

    def _budgets(self, node: Node, field: str) -> Budgets:
        entries = self._mapping(node, field)
        keys = ("requests_per_second", *_BUDGET_INTS)
        self._expect_keys(entries, node, field, keys)
        defaults = Budgets()
        rate = defaults.requests_per_second
        if "requests_per_second" in entries:
            rate_node = entries["requests_per_second"][1]
            rate_field = f"{field}.requests_per_second"
            text = self._scalar(rate_node, rate_field, (_INT_TAG, _FLOAT), "a number")
            if not _DECIMAL.fullmatch(text) or not 0 < float(text) <= _MAX_RATE:
                raise self._error(
                    rate_node, rate_field, f"{_show(text)} must be a decimal number > 0"
                )
            rate = float(text)
        values = {
            key: self._int(entries[key][1], f"{field}.{key}", low, _MAX_INT)
            if key in entries
            else getattr(defaults, key)
            for key, low in _BUDGET_INTS.items()
        }
        return Budgets(requests_per_second=rate, **values)

    def _sandbox(
        self, sid: str, key_node: Node, node: Node, field: str
    ) -> tuple[SandboxEntry, Node]:
        entries = self._mapping(node, field)
        self._expect_keys(entries, key_node, field, _SANDBOX_KEYS, required=_SANDBOX_KEYS)
        policy_node = entries["policy"][1]
        policy = self._name(policy_node, f"{field}.policy", "policy name")
        hash_node = entries["key_sha256"][1]
        digest = self._string(hash_node, f"{field}.key_sha256")
        if not _HEX64.fullmatch(digest):
            # Never echoed: someone may have pasted the password itself here.
            raise self._error(
                hash_node,
                f"{field}.key_sha256",
                "must be 64 hex digits, the SHA-256 of the sandbox's proxy password "
                f"(got {len(digest)} characters)",
            )
        return SandboxEntry(sid, policy, bytes.fromhex(digest)), policy_node


# --- merging ----------------------------------------------------------------------------------


class _Merged:
    def __init__(self) -> None:
        self.sources: list[Path] = []
        self.warnings: list[RuleWarning] = []
        self.policies: dict[str, tuple[Policy, _Where]] = {}
        self.sandboxes: dict[str, tuple[SandboxEntry, _Where, _Where]] = {}
        self.default_policy: tuple[str, _Where] | None = None

    def add(self, doc: _Document) -> None:
        self.sources.append(doc.path)
        self.warnings.extend(doc.warnings)
        for name, (policy, where) in doc.policies.items():
            if name in self.policies:
                raise RulesError(
                    where.path,
                    where.line,
                    f"policies.{name}",
                    f"policy {name!r} is also defined at {self.policies[name][1]}",
                )
            self.policies[name] = (policy, where)
        for sid, (entry, where, policy_where) in doc.sandboxes.items():
            if sid in self.sandboxes:
                raise RulesError(
                    where.path,
                    where.line,
                    f"sandboxes.{sid}",
                    f"sandbox {sid!r} is also defined at {self.sandboxes[sid][1]}",
                )
            self.sandboxes[sid] = (entry, where, policy_where)
        if doc.default_policy is not None:
            if self.default_policy is not None:
                _, where = doc.default_policy
                raise RulesError(
                    where.path,
                    where.line,
                    "default_policy",
                    f"default_policy is also set at {self.default_policy[1]}",
                )
            self.default_policy = doc.default_policy

    def finish(self) -> RuleSet:
        for sid, (entry, _, where) in self.sandboxes.items():
            if entry.policy not in self.policies:
                raise RulesError(
                    where.path,
                    where.line,
                    f"sandboxes.{sid}.policy",
                    f"no policy named {entry.policy!r}",
                )
        if self.default_policy is not None:
            name, where = self.default_policy
            if name not in self.policies:
                raise RulesError(
                    where.path, where.line, "default_policy", f"no policy named {name!r}"
                )
        self._warn_shared_keys()
        return RuleSet(
            policies=MappingProxyType({n: p for n, (p, _) in self.policies.items()}),
            sandboxes=MappingProxyType({s: e for s, (e, _, _) in self.sandboxes.items()}),
            default_policy=self.default_policy[0] if self.default_policy else None,
            warnings=tuple(self.warnings),
            sources=tuple(self.sources),
        )

    def _warn_shared_keys(self) -> None:
        first: dict[bytes, str] = {}
        for sid, (entry, where, _) in self.sandboxes.items():
            other = first.setdefault(entry.key_sha256, sid)
            if other != sid:
                self.warnings.append(
                    RuleWarning(
                        "shared_key",
                        where.path,
                        where.line,
                        f"sandboxes.{sid}.key_sha256",
                        f"same key as sandbox {other!r}: each can authenticate as the other",
                    )
                )
