"""What the rules decide for one request, and why: `sealgate rules explain` and `rules test`.

The proxy's own decision (`policy.decide`, which every hook of the proxy asks) asked about a
request written on the command line instead of one on the wire, so the two agree by
construction. What only the wire can tell is said, not guessed: the addresses a name resolves
to are checked when the request is made, and a sandbox's budgets and sealed tokens are not
modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sealgate.hostname import Host, HostError, split_authority
from sealgate.reasons import Reason

from ..errors import ProxyError
from .decide import Decision, Identity, Question, Scheme, Verdict, decide
from .model import PathError, Policy, Rule, RuleSet, normalize_path

_SCHEMES = {"http": 80, "https": 443}


class ExplainError(ProxyError, ValueError):
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
    decision: Verdict = "deny"  # until the request has passed every step
    reason: Reason | None = None  # the proxy's reason code when denied or reported
    detail: str = ""
    tool: str | None = None  # a tool call's (`explain_tool`): the request is the one it makes
    rule: Rule | None = None
    misses: list[Miss] = field(default_factory=list)
    tunnel: bool | None = None  # https only: would the CONNECT pass through undecrypted?
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool, "method": self.method, "url": self.url, "sandbox": self.sandbox,
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
    """The rule's credentials by reference and how each goes in (`bearer from file:key:
    Authorization: Bearer <secret>`): never a secret's value."""
    return [f"{i.processor.kind} from {i.secret}: {i.processor.describe()}" for i in rule.inject]


def explain(
    rules: RuleSet, method: str, url: str, *, sandbox: str | None = None,
    policy: str | None = None, tokens: bool = False, connect_tokens: bool = False,
) -> Explanation:
    """Decide `method url` for a sandbox, a policy, or (neither given) unidentified traffic:
    the proxy's own `decide`, asked what the proxy asks, in its order (for https, the tunnel
    first, then the request inside it unless the tunnel is passed through). `tokens`: the
    request carries `Proxy-Tokenizer` (whether the tokens would open is not modelled);
    `connect_tokens`: the CONNECT does (they go with every request in its tunnel)."""
    result = Explanation(method, url)
    identity = _identity(rules, result, sandbox, policy)
    parts = urlsplit(url)
    default_port = _SCHEMES.get(parts.scheme)
    if default_port is None:
        return _deny(result, Reason.SCHEME_INVALID, f"scheme {parts.scheme!r} is not proxied")
    try:
        host, port = split_authority(parts.netloc, default_port)
    except HostError as exc:
        return _deny(result, exc.reason, str(exc))
    result.host, result.port = host.name, port
    decision: Decision | None = None
    if parts.scheme == "https":
        decision = decide(rules, Question(identity, host, port, tokens=connect_tokens))
        result.tunnel = decision.tunnel
        if decision.tunnel:
            result.rule = decision.host_rules[0]
            result.notes.append("TLS passes through undecrypted: method and path are not seen")
    if decision is None or (decision.allowed and not decision.tunnel):
        try:
            path = normalize_path(
                (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            )
        except PathError as exc:
            return _deny(result, exc.reason, str(exc))
        result.path = path
        scheme: Scheme = "https" if parts.scheme == "https" else "http"
        decision = decide(rules, Question(
            identity, host, port, scheme, method, path, tokens or connect_tokens
        ))
        result.rule = decision.rule
    result.decision, result.reason, result.detail = (
        decision.verdict, decision.reason, decision.detail
    )
    return _described(result, decision, host, port, method)


def _described(result: Explanation, decision: Decision, host: Host, port: int,
               method: str) -> Explanation:
    """What a decision leaves a reader to know: the rules for the host that did not match, and
    what only the wire can tell (resolution, plain-HTTP credentials, tokens)."""
    chosen = decision.policy
    if chosen is None:
        return result
    if result.rule is None:
        result.misses = _misses(chosen.host_rules(host), port, method, result.path or "")
    if decision.allowed and host.ip is None:
        result.notes.append(
            f"{host.name} is resolved when the request is made; it is refused if any address "
            "it resolves to is in a denied range" + _opened(chosen)
        )
        if decision.plain_credentials:
            result.notes.append("credentials go over plain HTTP only if the name resolves into "
                                "allow_networks" + _opened(chosen))
    if chosen.tokens:
        result.notes.append("requests may also carry sealed tokens (Proxy-Tokenizer)")
    return result


def _identity(
    rules: RuleSet, result: Explanation, sandbox: str | None, policy: str | None
) -> Identity:
    """Who asks: a sandbox of the rules, a policy by name, or unidentified traffic."""
    if sandbox is not None and policy is not None:
        raise ExplainError("give a sandbox or a policy, not both")
    if sandbox is not None:
        entry = rules.sandboxes.get(sandbox)
        if entry is None:
            raise ExplainError(f"no sandbox {sandbox!r} in the rules")
        result.sandbox = sandbox
        identity = Identity(sandbox, entry.policy, "proxy-auth")
    elif policy is not None:
        identity = Identity(None, policy, "proxy-auth")
    else:
        identity = Identity(None, rules.default_policy, "default")
        if rules.default_policy is not None:
            result.notes.append("no sandbox given: unidentified traffic gets the default policy")
    if identity.policy is not None:
        chosen = rules.policies.get(identity.policy)
        if chosen is None:
            raise ExplainError(f"no policy {identity.policy!r} in the rules")
        result.policy, result.mode = chosen.name, chosen.mode
    return identity


def _misses(host_rules: tuple[Rule, ...], port: int, method: str, path: str) -> list[Miss]:
    misses = []
    for rule in host_rules:
        if rule.tools_only:
            why = "tools_only: it serves sealgate's own calls (MCP tools, the gateway), never " \
                  "a request through the proxy"
        elif port not in rule.ports:
            why = f"port {port} is not in {sorted(rule.ports)}"
        elif rule.methods is not None and method not in rule.methods:
            why = f"method {method} is not in {sorted(rule.methods)}"
        else:
            why = f"path {path} matches none of {list(rule.paths or ())}"
        misses.append(Miss(rule, why))
    return misses


def _opened(policy: Policy) -> str:
    nets = ", ".join(str(n) for n in policy.allow_networks)
    return f" (allow_networks: {nets})" if nets else " (allow_networks: none)"


def _deny(result: Explanation, reason: Reason, detail: str) -> Explanation:
    result.decision, result.reason, result.detail = "deny", reason, detail
    return result
