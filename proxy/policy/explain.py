"""What the rules decide for one request, and why: `sealgate rules explain` and `rules test`.

The proxy's own primitives (canonical names, path normalisation, first-match rules, the denied
name and address tables, the tunnel decision), applied in the proxy's order to a request written
on the command line instead of one on the wire. What only the wire can tell is said, not
guessed: the addresses a name resolves to are checked when the request is made, and a sandbox's
budgets and sealed tokens are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from sealgate.hostname import HostError, denied_name, split_authority
from sealgate.proxy.net.addresses import IPAddress
from sealgate.proxy.policy.model import PathError, Policy, Rule, RuleSet, normalize_path, tunnels

Decision = Literal["allow", "deny", "report"]
_SCHEMES = {"http": 80, "https": 443}


class ExplainError(ValueError):
    """The question cannot be asked: an unknown sandbox or policy, or no request to explain."""


@dataclass(frozen=True)
class Miss:
    """A rule whose host pattern matched but which did not allow the request, and why not."""

    rule: Rule
    why: str


@dataclass
class Explanation:
    method: str
    url: str
    sandbox: str | None = None
    policy: str | None = None
    mode: str | None = None
    host: str | None = None
    port: int | None = None
    path: str | None = None
    decision: Decision = "deny"  # until the request has passed every step
    reason: str | None = None  # the proxy's reason code when denied or reported
    detail: str = ""
    rule: Rule | None = None
    misses: list[Miss] = field(default_factory=list)
    tunnel: bool | None = None  # https only: would the CONNECT pass through undecrypted?
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method, "url": self.url, "sandbox": self.sandbox,
            "policy": self.policy, "mode": self.mode, "host": self.host, "port": self.port,
            "path": self.path, "decision": self.decision, "reason": self.reason,
            "detail": self.detail, "rule": self.rule.source if self.rule else None,
            "rule_summary": describe(self.rule) if self.rule else None,
            "injects": injects(self.rule) if self.rule else [],
            "near_misses": [{"rule": m.rule.source, "why": m.why} for m in self.misses],
            "tunnel": self.tunnel, "notes": self.notes,
        }


def describe(rule: Rule) -> str:
    """One line a reviewer reads: what the rule allows."""
    parts = [rule.host, "ports " + ",".join(str(p) for p in sorted(rule.ports))]
    if rule.methods is not None:
        parts.append("methods " + ",".join(sorted(rule.methods)))
    if rule.paths is not None:
        parts.append("paths " + " ".join(rule.paths))
    parts += [f"inject {i}" for i in injects(rule)]
    if rule.strip:
        parts.append("strip " + ",".join(rule.strip))
    if rule.plain_http:
        parts.append("plain_http")
    return "; ".join(parts)


def injects(rule: Rule) -> list[str]:
    """The rule's credentials by reference (`bearer from file:key`): never a secret's value."""
    return [f"{i.processor.kind} from {i.secret}" for i in rule.inject]


def explain(
    rules: RuleSet, method: str, url: str, *, sandbox: str | None = None,
    policy: str | None = None,
) -> Explanation:
    """Decide `method url` for a sandbox, a policy, or (neither given) unidentified traffic."""
    result = Explanation(method, url)
    chosen = _policy(rules, result, sandbox, policy)
    if chosen is None:
        return result
    parts = urlsplit(url)
    default_port = _SCHEMES.get(parts.scheme)
    if default_port is None:
        return _deny(result, "scheme_invalid", f"scheme {parts.scheme!r} is not proxied")
    try:
        host, port = split_authority(parts.netloc, default_port)
    except HostError as exc:
        return _deny(result, exc.reason, str(exc))
    result.host, result.port = host.name, port
    host_port_rules = chosen.match_host(host, port)
    rule: Rule | None
    if parts.scheme == "https" and tunnels(chosen, host_port_rules):
        # Passed through undecrypted: the proxy never sees the method or the path.
        result.tunnel = True
        rule = result.rule = host_port_rules[0]
        result.notes.append("TLS passes through undecrypted: method and path are not seen")
    else:
        result.tunnel = False if parts.scheme == "https" else None
        try:
            path = normalize_path(
                (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            )
        except PathError as exc:
            return _deny(result, exc.reason, str(exc))
        result.path = path
        rule = result.rule = chosen.match(host, port, method, path)
    if rule is None:
        path = result.path or ""
        result.misses = _misses(chosen.host_rules(host), port, method, path)
        detail = f"{method} {host.name}:{port}{path} is not allowed"
        if chosen.mode == "enforce":
            return _deny(result, "not_allowed", detail)
        result.decision, result.reason, result.detail = "report", "not_allowed", detail
    if reason := denied_name(host):
        return _deny(result, reason, f"{host.name} is never reachable through this proxy")
    if host.ip is not None:
        if reason := chosen.addresses.check(host.ip):
            return _deny(result, reason, f"{host.ip} is in a denied range ({reason})")
    else:
        result.notes.append(
            f"{host.name} is resolved when the request is made; it is refused if any address "
            "it resolves to is in a denied range" + _opened(chosen)
        )
    if rule is not None and rule.inject:
        _secure(result, chosen, rule, parts.scheme, host.ip)
    if result.reason is None:
        result.decision = "allow"
    if chosen.tokens:
        result.notes.append("requests may also carry sealed tokens (Proxy-Tokenizer)")
    return result


def _policy(
    rules: RuleSet, result: Explanation, sandbox: str | None, policy: str | None
) -> Policy | None:
    if sandbox is not None and policy is not None:
        raise ExplainError("give a sandbox or a policy, not both")
    if sandbox is not None:
        entry = rules.sandboxes.get(sandbox)
        if entry is None:
            raise ExplainError(f"no sandbox {sandbox!r} in the rules")
        result.sandbox, name = sandbox, entry.policy
    elif policy is not None:
        name = policy
    elif rules.default_policy is not None:
        name = rules.default_policy
        result.notes.append("no sandbox given: unidentified traffic gets the default policy")
    else:
        _deny(result, "identity_required",
              "no sandbox given, and no default_policy for unidentified traffic")
        return None
    chosen = rules.policies.get(name)
    if chosen is None:
        raise ExplainError(f"no policy {name!r} in the rules")
    result.policy, result.mode = chosen.name, chosen.mode
    return chosen


def _misses(host_rules: tuple[Rule, ...], port: int, method: str, path: str) -> list[Miss]:
    misses = []
    for rule in host_rules:
        if port not in rule.ports:
            why = f"port {port} is not in {sorted(rule.ports)}"
        elif rule.methods is not None and method not in rule.methods:
            why = f"method {method} is not in {sorted(rule.methods)}"
        else:
            why = f"path {path} matches none of {list(rule.paths or ())}"
        misses.append(Miss(rule, why))
    return misses


def _secure(
    result: Explanation, policy: Policy, rule: Rule, scheme: str, ip: IPAddress | None
) -> None:
    """Credentials go only over verified TLS, or plain HTTP to an allow_networks address."""
    if scheme == "https":
        return
    if not rule.plain_http:
        _deny(result, "insecure_upstream", "credentials are only injected over verified TLS")
    elif ip is not None and not any(ip in net for net in policy.allow_networks):
        _deny(result, "insecure_upstream", f"{ip} is not in the policy's allow_networks")
    elif ip is None:
        result.notes.append("credentials go over plain HTTP only if the name resolves into "
                            "allow_networks" + _opened(policy))


def _opened(policy: Policy) -> str:
    nets = ", ".join(str(n) for n in policy.allow_networks)
    return f" (allow_networks: {nets})" if nets else " (allow_networks: none)"


def _deny(result: Explanation, reason: str, detail: str) -> Explanation:
    result.decision, result.reason, result.detail = "deny", reason, detail
    return result
