"""Rules learned from a report-mode run: `sealgate rules suggest RULES --from AUDIT_LOG`.

A new sandbox runs its policy in `mode: report`: nothing is refused, and every request no rule
allows is written to the audit log as `decision: report, reason: not_allowed`. This reads those
lines and writes the smallest rules that would have allowed them, with the evidence for each:

- exact host names only, never `*` or a `*.suffix` (a name seen is a name granted, no more);
- one rule per host and group of ports, methods and paths seen together, so that a method seen on
  one path is never granted on another (GET /a and POST /b make two rules, not [GET, POST]
  on both);
- paths listed as seen, and generalised to `/prefix/**` only where more than `--paths` distinct
  paths share that prefix, the deepest prefix they all share; never to `/**`;
- a tunnel (a CONNECT with no request seen inside) allows its host and port, as it was used.

The audit log was written by a proxy, but what is in it came from the sandbox: every field is
checked again as a rule would be, and a line that is not a well-formed request is counted as
skipped, never guessed at. Paths holding `*` are skipped too: a rule's path is a glob, and the
star would grant more than was seen. The suggestions are then checked, not trusted: the rules
with them added, every policy in `enforce` mode, are asked about each line again through the
proxy's own `decide`; whatever would still be refused (a metadata name, an address in a denied
range: no rule can open those) is listed with its reason.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from sealgate.hostname import HostError, canonical_name

from .decide import Identity, Question, decide
from .model import PathError, Policy, Rule, RuleSet, normalize_path

# An audit line is well under this; longer ones are not the proxy's.
MAX_LINE = 64 * 1024
_METHOD = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,32}")


@dataclass(frozen=True, slots=True, order=True)
class Seen:
    """One request (or tunnel: `method` None) no rule allowed."""

    host: str
    port: int
    scheme: str  # "https", "http"; "" for a tunnel
    method: str | None
    path: str | None


@dataclass
class Evidence:
    """What the audit log held: the would-deny requests per policy, and what was skipped."""

    seen: dict[str, Counter[Seen]] = field(default_factory=lambda: defaultdict(Counter))
    lines: int = 0
    skipped: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class Suggestion:
    policy: str
    host: str
    ports: tuple[int, ...]
    methods: tuple[str, ...] | None  # None: a tunnel, any request
    paths: tuple[str, ...] | None
    requests: int
    by_method: tuple[tuple[str, int], ...]
    distinct_paths: int

    def rule(self) -> Rule:
        return Rule(self.host, frozenset(self.ports),
                    None if self.methods is None else frozenset(self.methods),
                    self.paths, source=f"suggested for {self.policy}")

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "host": self.host, "ports": list(self.ports),
                "methods": None if self.methods is None else list(self.methods),
                "paths": None if self.paths is None else list(self.paths),
                "evidence": {"requests": self.requests, "methods": dict(self.by_method),
                             "distinct_paths": self.distinct_paths}}


@dataclass(frozen=True)
class Replayed:
    """A would-deny line asked again of the rules with the suggestions, all enforced."""

    seen: Seen
    policy: str
    reason: str | None  # None: now allowed


def read(stream: IO[str], rules: RuleSet, *, policy: str | None = None,
         include_denied: bool = False) -> Evidence:
    """The would-deny requests of `stream` (audit lines), per policy of `rules`."""
    found = Evidence()
    for line in _lines(stream, found):
        try:
            entry = json.loads(line)
        except ValueError:
            found.skipped["not JSON"] += 1
            continue
        if not isinstance(entry, dict) or entry.get("event") != "request":
            continue
        if entry.get("reason") != "not_allowed" or entry.get("decision") not in (
                ("report", "deny") if include_denied else ("report",)):
            continue
        name = entry.get("policy")
        if policy is not None and name != policy:
            continue
        if not isinstance(name, str) or name not in rules.policies:
            found.skipped["policy not in these rules"] += 1
            continue
        seen = _seen(entry)
        if isinstance(seen, str):
            found.skipped[seen] += 1
            continue
        found.seen[name][seen] += 1
    return found


def _lines(stream: IO[str], found: Evidence) -> Iterator[str]:
    while line := stream.readline(MAX_LINE + 1):
        if len(line) > MAX_LINE and not line.endswith("\n"):
            found.skipped["line too long"] += 1
            while (rest := stream.readline(MAX_LINE)) and not rest.endswith("\n"):
                pass  # the rest of the long line; each read is bounded, the file is finite
            continue
        found.lines += 1
        if line.strip():
            yield line


def _seen(entry: dict[str, Any]) -> Seen | str:
    """The request a line records, or why it is not one a rule could be made for."""
    host, port, method, path = (entry.get(k) for k in ("host", "port", "method", "path"))
    if not isinstance(host, str) or not isinstance(port, int) or not 0 < port < 65536:
        return "no host or port"
    try:
        canonical = canonical_name(host)
    except HostError:
        return "host not well-formed"
    if canonical.name != host or "*" in host:
        return "host not well-formed"
    if method == "CONNECT" and path is None:
        return Seen(host, port, "", None, None)
    if not isinstance(method, str) or not _METHOD.fullmatch(method) or method == "CONNECT":
        return "method not well-formed"
    if not isinstance(path, str):
        return "no path"
    try:
        if normalize_path(path) != path:
            return "path not well-formed"
    except PathError:
        return "path not well-formed"
    if "*" in path:
        return "path holds '*', which a rule's glob would widen"
    scheme = entry.get("scheme")
    return Seen(host, port, scheme if scheme in ("http", "https") else "https", method, path)


# -- from evidence to rules -------------------------------------------------------------------


def suggest(found: Evidence, *, most_paths: int = 5) -> list[Suggestion]:
    """The smallest rules allowing every request in `found`, in a stable order."""
    made: list[Suggestion] = []
    for name in sorted(found.seen):
        by_host: dict[str, dict[int, Counter[Seen]]] = defaultdict(lambda: defaultdict(Counter))
        for seen, count in found.seen[name].items():
            by_host[seen.host][seen.port][seen] += count
        for host in sorted(by_host):
            made += _host_rules(name, host, by_host[host], most_paths)
    return made


# A port's rules: (methods, paths) pairs; None for tunnels only (nothing inside seen).
_Shape = tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] | None


def _host_rules(policy: str, host: str, ports: dict[int, Counter[Seen]],
                most_paths: int) -> list[Suggestion]:
    # Ports whose rules would be the same share them.
    shared: dict[_Shape, list[int]] = defaultdict(list)
    seen_by: dict[_Shape, Counter[Seen]] = defaultdict(Counter)
    for port, seen in ports.items():
        shape = _shape(seen, most_paths)
        shared[shape].append(port)
        seen_by[shape].update(seen)
    made = []
    for shape, port_list in shared.items():
        seen = seen_by[shape]
        groups: list[tuple[tuple[str, ...], tuple[str, ...]] | None] = (
            [None] if shape is None else list(shape))
        for group in groups:
            # The group's rule (its paths compiled once) says which requests it covers.
            rule = None if group is None else Rule(host, frozenset(port_list),
                                                   frozenset(group[0]), group[1], source="")
            covered = seen if rule is None else Counter(
                {s: c for s, c in seen.items() if s.method is not None and s.path is not None
                 and rule.allows_request(s.method, s.path)})
            by_method = Counter[str]()
            for s, c in covered.items():
                by_method[s.method or "CONNECT"] += c
            made.append(Suggestion(
                policy, host, tuple(sorted(port_list)),
                None if group is None else group[0], None if group is None else group[1],
                sum(covered.values()), tuple(sorted(by_method.items())),
                len({s.path for s in covered if s.path is not None}),
            ))
    return sorted(made, key=lambda s: (s.ports, s.methods or (), s.paths or ()))


def _shape(seen: Counter[Seen], most_paths: int) -> _Shape:
    """One port's rules: its paths generalised, then one rule per set of methods seen on the
    same patterns (a method is never granted on a path it was not seen on)."""
    requests = [s for s in seen if s.method is not None and s.path is not None]
    if not requests:
        return None
    patterns = generalise({s.path for s in requests if s.path is not None}, most_paths)
    methods_of: dict[str, set[str]] = defaultdict(set)
    for s in requests:
        assert s.method is not None and s.path is not None
        methods_of[patterns[s.path]].add(s.method)
    grouped: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for pattern, methods in methods_of.items():
        grouped[tuple(sorted(methods))].append(pattern)
    return tuple(sorted((m, tuple(sorted(p))) for m, p in grouped.items()))


def generalise(paths: Iterable[str], most: int) -> dict[str, str]:
    """Each path's pattern: itself, or `/prefix/**` where more than `most` distinct paths share
    `prefix` (the deepest prefix they all share, at least one segment deep)."""
    split = sorted({p: tuple(p[1:].split("/")) for p in paths}.items())
    pattern: dict[str, str] = {}
    _walk(split, 0, most, pattern)
    return pattern


def _walk(group: list[tuple[str, tuple[str, ...]]], depth: int, most: int,
          pattern: dict[str, str]) -> None:
    if len(group) <= most:
        pattern.update((path, path) for path, _ in group)
        return
    ending = [(p, s) for p, s in group if len(s) <= depth]
    below: dict[str, list[tuple[str, tuple[str, ...]]]] = defaultdict(list)
    for path, segments in group:
        if len(segments) > depth:
            below[segments[depth]].append((path, segments))
    if depth == 0 or (len(below) == 1 and not ending):
        # At the top, never `/**`; further down, one way on: a deeper prefix all share.
        pattern.update((path, path) for path, _ in ending)
        for child in below.values():
            _walk(child, depth + 1, most, pattern)
        return
    prefix = "/" + "/".join(group[0][1][:depth])
    pattern.update((path, f"{prefix}/**") for path, _ in group)


# -- the check --------------------------------------------------------------------------------


def learn(rules: RuleSet, found: Evidence, *, most_paths: int = 5
          ) -> tuple[list[Suggestion], list[Replayed]]:
    """The suggestions for `found`, and the requests no rule can allow (left out of them: a rule
    for a metadata name would only be a rule that never matches)."""
    made = suggest(found, most_paths=most_paths)
    still = [r for r in replay(with_suggestions(rules, made), found) if r.reason is not None]
    if still:
        kept = dataclasses.replace(found, seen=defaultdict(Counter))
        refused = {(r.policy, r.seen) for r in still}
        for name, seen in found.seen.items():
            kept.seen[name] = Counter({s: c for s, c in seen.items() if (name, s) not in refused})
        made = suggest(kept, most_paths=most_paths)
    return made, still


def with_suggestions(rules: RuleSet, made: list[Suggestion]) -> RuleSet:
    """`rules` with each suggestion appended to its policy's allow list."""
    added: dict[str, list[Rule]] = defaultdict(list)
    for s in made:
        added[s.policy].append(s.rule())
    policies = {name: (dataclasses.replace(p, rules=p.rules + tuple(added[name]))
                       if name in added else p)
                for name, p in rules.policies.items()}
    return dataclasses.replace(rules, policies=policies)


def replay(rules: RuleSet, found: Evidence) -> list[Replayed]:
    """Each would-deny request asked again, every policy enforced."""
    enforced = dataclasses.replace(rules, policies={
        name: dataclasses.replace(p, mode="enforce") for name, p in rules.policies.items()})
    out = []
    for name, seen in sorted(found.seen.items()):
        policy = enforced.policies[name]
        for s in sorted(seen):
            reason = _refusal(enforced, policy, s)
            out.append(Replayed(s, name, reason))
    return out


def _refusal(rules: RuleSet, policy: Policy, s: Seen) -> str | None:
    identity = Identity(None, policy.name, "proxy-auth")
    host = canonical_name(s.host)
    if s.method is None or s.scheme == "https":
        tunnel = decide(rules, Question(identity, host, s.port))
        if not tunnel.allowed or s.method is None or tunnel.tunnel:
            return None if tunnel.allowed else str(tunnel.reason)
    # A plain-HTTP request, or one inside an intercepted tunnel.
    got = decide(rules, Question(identity, host, s.port, "https" if s.scheme == "https"
                                 else "http", s.method, s.path or "/"))
    return None if got.allowed else str(got.reason)


# -- the patch --------------------------------------------------------------------------------


def patch(made: list[Suggestion]) -> list[str]:
    """The suggestions as YAML: per policy, the entries to append to its `allow` list, each
    with its evidence as a comment (strings quoted as JSON, which YAML reads alike)."""
    lines = ["policies:"]
    policy = None
    for s in made:
        if s.policy != policy:
            policy = s.policy
            lines += [f"  {s.policy}:", "    allow:"]  # names are [A-Za-z0-9._-]
        methods = ", ".join(f"{m} {c}" for m, c in s.by_method)
        paths = "" if s.paths is None else f", {_count(s.distinct_paths, 'distinct path')}"
        lines.append(f"      # {_count(s.requests, 'request')} ({methods}){paths}")
        lines.append(f"      - host: {json.dumps(s.host)}")
        lines.append(f"        ports: {json.dumps(list(s.ports))}")
        if s.methods is not None:
            lines.append(f"        methods: {json.dumps(list(s.methods))}")
        if s.paths is not None:
            lines.append(f"        paths: {json.dumps(list(s.paths))}")
    return lines if made else []


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"
