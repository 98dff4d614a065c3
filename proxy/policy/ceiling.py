"""Ceiling files: what no policy may ever allow, set once by a platform team (`rules bound`).

    version: 1
    ceiling:
      policies: [ci, agents]      # the policies it bounds; omitted: every policy
      allow:                      # every rule must lie inside these (host, ports, methods, paths
        - host: "*.github.com"    #   as in rules; a request no entry allows is outside)
          ports: [443]
        - host: pypi.org
          ports: [443]
          methods: [GET, HEAD]
      any_host: false             # no rule for "*"
      inject_hosts: [api.github.com]  # brokered credentials (inject) only to these
      plain_http: false           # no credential over plain HTTP
      tokens: false               # no policy accepts sealed tokens (each names its hosts)
      report_mode: false          # no policy in report mode (it allows what no rule does)
      allow_networks: []          # private networks a policy may open: none
      budgets: {requests_per_second: 100, max_total_bytes: 1073741824}  # maxima

Every key is optional; one left out does not bound what it names (a report-mode policy still
crosses `allow` and `any_host: false`, since it allows any host). Read as strictly as a rules
file (grammar.py, whose rule, host and network readers it shares): unknown keys, wrong types and
malformed entries are errors naming file, line and field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from typing import Final

from yaml.nodes import Node

from .grammar import RulesDocument
from .model import Budgets, Rule, RulesError
from .targets import host_pattern, network

_KEYS: Final = ("policies", "allow", "any_host", "inject_hosts", "plain_http", "tokens",
                "report_mode", "allow_networks", "budgets")
_ENTRY_KEYS: Final = ("host", "ports", "methods", "paths")
BUDGET_FIELDS: Final = tuple(f.name for f in fields(Budgets))


@dataclass(frozen=True)
class Ceiling:
    """None: not bounded."""

    source: Path
    policies: frozenset[str] | None = None
    allow: tuple[Rule, ...] | None = None
    any_host: bool | None = None
    inject_hosts: tuple[str, ...] | None = None
    plain_http: bool | None = None
    tokens: bool | None = None
    report_mode: bool | None = None
    allow_networks: tuple[IPv4Network | IPv6Network, ...] | None = None
    budgets: tuple[tuple[str, float], ...] = ()  # (field, maximum), for the fields given


class _CeilingDocument(RulesDocument):
    def _top(self, root: Node) -> None:
        entries = self.mapping(root, "")
        self.expect_keys(entries, root, "", ("version", "ceiling"), ("version", "ceiling"))
        version = entries["version"][1]
        if self.integer(version, "version", 0, 1 << 31) != 1:
            raise self.error(version, "version", "this sealgate reads ceiling version 1")
        self.ceiling = self._ceiling(entries["ceiling"][1])

    def _ceiling(self, node: Node) -> Ceiling:
        entries = self.mapping(node, "ceiling")
        self.expect_keys(entries, node, "ceiling", _KEYS)
        found: dict[str, object] = {}
        for key in ("any_host", "plain_http", "tokens", "report_mode"):
            if key in entries:
                found[key] = self.boolean(entries[key][1], f"ceiling.{key}")
        if "policies" in entries:
            found["policies"] = frozenset(
                self._name(item, "ceiling.policies", "policy name")
                for item in self.sequence(entries["policies"][1], "ceiling.policies"))
        if "allow" in entries:
            allow = []
            for i, item in enumerate(self.sequence(entries["allow"][1], "ceiling.allow")):
                field = f"ceiling.allow[{i}]"
                # Only what bounds a request: credentials and timeouts are not reach.
                self.expect_keys(self.mapping(item, field), item, field, _ENTRY_KEYS, ("host",))
                allow.append(self._rule(item, field))
            found["allow"] = tuple(allow)
        if "inject_hosts" in entries:
            found["inject_hosts"] = tuple(
                self._target(host_pattern, item, "ceiling.inject_hosts")[0]
                for item in self.sequence(entries["inject_hosts"][1], "ceiling.inject_hosts"))
        if "allow_networks" in entries:
            found["allow_networks"] = tuple(
                self._target(network, item, "ceiling.allow_networks")[0]
                for item in self.sequence(entries["allow_networks"][1],
                                          "ceiling.allow_networks"))
        if "budgets" in entries:
            given = self.mapping(entries["budgets"][1], "ceiling.budgets")
            parsed = self._budgets(entries["budgets"][1], "ceiling.budgets")
            found["budgets"] = tuple((key, float(getattr(parsed, key)))
                                     for key in BUDGET_FIELDS if key in given)
        return Ceiling(self.path, **found)  # type: ignore[arg-type]


def load_ceiling(path: Path) -> Ceiling:
    """The ceiling of one file; RulesError (file:line: field: message) when it is malformed."""
    if not path.is_file():
        raise RulesError(path, None, "", "not a file")
    return _CeilingDocument(path).ceiling
