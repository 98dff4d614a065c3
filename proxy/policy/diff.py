"""What a rules change changes, for review: `sealgate rules diff OLD NEW`.

Compared by meaning, not text: rules by what they allow (host, ports, methods, paths, what they
inject and strip), policies field by field, sandboxes by policy and key. Each change says whether
it widens what some sandbox may reach, narrows it, or changes it in a way a person must judge
(a sandbox moved to another policy, rules reordered, a host's TLS no longer inspected), so CI can
ask for a second reviewer (`--fail-on-widen` fails on the first and the last kind).
Moving a rule changes which rule decides first, and so which credential goes where; that is
reported as a change to review, not as wider or narrower.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields, replace
from typing import Any

from .explain import describe
from .model import Budgets, Policy, Rule, RuleSet


@dataclass(frozen=True)
class Change:
    scope: str  # "policy ci", "sandbox bot-1", "default_policy"
    sign: str  # "+" added, "-" removed, "~" changed
    what: str
    widens: bool | None  # True: more access, False: less, None: different, review it
    where: str = ""  # file:line in the new (or, for removals, the old) rules

    def to_json(self) -> dict[str, Any]:
        return {"scope": self.scope, "change": {"+": "added", "-": "removed", "~": "changed"}[
            self.sign], "what": self.what, "widens": self.widens, "where": self.where or None}


def diff(old: RuleSet, new: RuleSet) -> list[Change]:
    changes: list[Change] = []
    used = _used_policies(new)
    for name in sorted(old.policies.keys() | new.policies.keys()):
        before, after = old.policies.get(name), new.policies.get(name)
        scope = f"policy {name}"
        if before is None and after is not None:
            changes.append(Change(scope, "+", f"added, {len(after.rules)} rules", name in used))
        elif after is None:
            changes.append(Change(scope, "-", "removed", False))
        elif before is not None:
            changes += _policy(scope, before, after)
    for sid in sorted(old.sandboxes.keys() | new.sandboxes.keys()):
        was, now = old.sandboxes.get(sid), new.sandboxes.get(sid)
        scope = f"sandbox {sid}"
        if was is None and now is not None:
            changes.append(Change(scope, "+", f"added, policy {now.policy}", True))
        elif now is None:
            changes.append(Change(scope, "-", "removed", False))
        elif was is not None:
            if was.policy != now.policy:
                changes.append(Change(scope, "~", f"policy {was.policy} -> {now.policy}", None))
            if was.key_sha256 != now.key_sha256:
                changes.append(Change(scope, "~", "key changed", None))
    if old.default_policy != new.default_policy:
        changes.append(Change(
            "default_policy", "~", f"{old.default_policy} -> {new.default_policy}",
            None if old.default_policy and new.default_policy else new.default_policy is not None,
        ))
    return changes


def _used_policies(rules: RuleSet) -> set[str]:
    used = {entry.policy for entry in rules.sandboxes.values()}
    return used | ({rules.default_policy} if rules.default_policy else set())


def _policy(scope: str, before: Policy, after: Policy) -> list[Change]:
    changes = []
    if before.mode != after.mode:
        changes.append(Change(scope, "~", f"mode {before.mode} -> {after.mode}",
                              after.mode == "report"))
    if before.tokens != after.tokens:
        # Off can pass hosts through undecrypted that were intercepted: fewer checks, not less.
        changes.append(Change(scope, "~", f"tokens {before.tokens} -> {after.tokens}".lower(),
                              True if after.tokens else None))
    nets_before, nets_after = set(before.allow_networks), set(after.allow_networks)
    for net in sorted(nets_after - nets_before, key=str):
        changes.append(Change(scope, "+", f"allow_networks {net}", True))
    for net in sorted(nets_before - nets_after, key=str):
        changes.append(Change(scope, "-", f"allow_networks {net}", False))
    for budget in fields(Budgets):
        was, now = getattr(before.budgets, budget.name), getattr(after.budgets, budget.name)
        if was != now:
            changes.append(Change(scope, "~", f"budgets.{budget.name} {was} -> {now}", now > was))
    return (changes + _tools(scope, before, after) + _servers(scope, before, after)
            + _rules(scope, before.rules, after.rules))


def _tools(scope: str, before: Policy, after: Policy) -> list[Change]:
    """Tools by name: one added lets an agent make a call it could not (with its credential),
    one removed takes it away, one changed is for a person to judge; the generic tool by its
    methods and its cap."""
    changes = []
    was = {t.name: replace(t, source="") for t in before.tools}
    now = {t.name: replace(t, source="") for t in after.tools}
    where = {t.name: t.source for t in (*before.tools, *after.tools)}
    for name in sorted(now.keys() - was.keys()):
        changes.append(Change(scope, "+", f"tool {name}: {now[name].method} "
                              f"{now[name].host.name}{now[name].path}", True, where[name]))
    for name in sorted(was.keys() - now.keys()):
        changes.append(Change(scope, "-", f"tool {name}", False, where[name]))
    for name in sorted(was.keys() & now.keys()):
        if was[name] != now[name]:
            fields_changed = [f.name for f in fields(was[name])
                              if getattr(was[name], f.name) != getattr(now[name], f.name)]
            changes.append(Change(scope, "~", f"tool {name}: {', '.join(fields_changed)}",
                                  None, where[name]))
    old, new = before.http_request, after.http_request
    if old is None and new is not None:
        changes.append(Change(scope, "+", f"tool http_request: {','.join(new.methods)} to any "
                              "host the rules allow", True, new.source))
    elif old is not None and new is None:
        changes.append(Change(scope, "-", "tool http_request", False, old.source))
    elif old is not None and new is not None:
        added = sorted(set(new.methods) - set(old.methods))
        if added or new.max_response_bytes > old.max_response_bytes:
            changes.append(Change(scope, "~", f"tool http_request: methods "
                                  f"{','.join(old.methods)} -> {','.join(new.methods)}, "
                                  f"max_response_bytes {old.max_response_bytes} -> "
                                  f"{new.max_response_bytes}", True, new.source))
        elif replace(old, source="") != replace(new, source=""):
            changes.append(Change(scope, "~", f"tool http_request: methods "
                                  f"{','.join(new.methods)}, max_response_bytes "
                                  f"{new.max_response_bytes}, timeout {new.timeout:g}", False,
                                  new.source))
    return changes


def _servers(scope: str, before: Policy, after: Policy) -> list[Change]:
    """Upstream MCP servers by name (the gateway's): one added, or one listing a tool it did
    not, lets an agent call what it could not; one removed takes it away; any other change
    (its url, credential, constraints, caps) is for a person to judge."""
    changes = []
    was = {s.name: replace(s, source="") for s in before.mcp_servers}
    now = {s.name: replace(s, source="") for s in after.mcp_servers}
    where = {s.name: s.source for s in (*before.mcp_servers, *after.mcp_servers)}
    for name in sorted(now.keys() - was.keys()):
        tools = ",".join(t.name for t in now[name].tools) or "no tools"
        changes.append(Change(scope, "+", f"mcp server {name}: {now[name].host.name}"
                              f"{now[name].path} ({tools})", True, where[name]))
    for name in sorted(was.keys() - now.keys()):
        changes.append(Change(scope, "-", f"mcp server {name}", False, where[name]))
    for name in sorted(was.keys() & now.keys()):
        old, new = was[name], now[name]
        if old == new:
            continue
        added = sorted({t.name for t in new.tools} - {t.name for t in old.tools})
        if added:
            changes.append(Change(scope, "~", f"mcp server {name}: tools +{','.join(added)}",
                                  True, where[name]))
            continue
        fields_changed = [f.name for f in fields(old)
                          if getattr(old, f.name) != getattr(new, f.name)]
        changes.append(Change(scope, "~", f"mcp server {name}: {', '.join(fields_changed)}",
                              None, where[name]))
    return changes


def _rules(scope: str, before: tuple[Rule, ...], after: tuple[Rule, ...]) -> list[Change]:
    came, gone = Counter(after) - Counter(before), Counter(before) - Counter(after)
    changes = [Change(scope, "+", f"allow {describe(r)}", True, r.source)
               for r in _only(after, came)]
    changes += [Change(scope, "-", f"allow {describe(r)}", _removal(r, after), r.source)
                for r in _only(before, gone)]
    common = Counter(before) & Counter(after)
    if _only(before, common) != _only(after, common):
        changes.append(Change(scope, "~", "rules reordered: the first match decides, and "
                              "brings its credentials", None))
    return changes


def _removal(rule: Rule, after: tuple[Rule, ...]) -> bool | None:
    """A removed rule narrows, unless what is left for its host changes more than that: a
    rule there that injects may now decide requests this one decided (its credential goes
    further), or no rule there needs to see requests any more (TLS passes through
    undecrypted, without the Host and path checks)."""
    same = [r for r in after if r.host == rule.host]
    if any(r.inject for r in same):
        return None
    if rule.needs_request_inspection and same and \
            not any(r.needs_request_inspection for r in same):
        return None
    return False


def _only(rules: tuple[Rule, ...], wanted: Counter[Rule]) -> list[Rule]:
    """`rules` in order, keeping each only as often as `wanted` counts it."""
    left = Counter(wanted)
    kept = []
    for rule in rules:
        if left[rule] > 0:
            left[rule] -= 1
            kept.append(rule)
    return kept
