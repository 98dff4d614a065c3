"""The policy decision: one pure function every path asks, and `rules explain` too.

    decide(rules, Question(...)) -> Decision

A question is what is known at that point: who asks (an `Identity`), the canonical target, and
either nothing more (a tunnel: a CONNECT, or a redirected TLS connection named by its SNI) or the
request's method and path. The answer carries its `Reason` when it is not a plain allow, the
policy and rule it was decided by, and, for a tunnel, whether it is passed through undecrypted.
The steps, in order, each ending the decision when it refuses:

1. identity: the policy the identity names, which must exist;
2. rules: the first rule in file order that allows host, port (and method and path); a miss is
   a denial in `enforce` mode and a `report` (allowed, logged) in `report` mode; that rule must
   also allow every method the request's override headers name;
3. names and literal addresses: a name the guard never resolves, an IP literal in a denied range
   (a name's addresses are checked when it is resolved: `Guard.pin`, after this);
4. tokens: only where the policy accepts them (such a policy intercepts every tunnel, so a
   token on a CONNECT reaches each request inside: `model.tunnels`);
5. credentials over plain HTTP: only where a `plain_http` rule sends them to an address in the
   policy's allow_networks (`Decision.secure_for` finishes this once the address is known).

Nothing here does I/O or keeps state, so the proxy's hooks and the explain tool cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sealgate.hostname import Host, denied_name
from sealgate.hostport import format_hostport
from sealgate.reasons import Reason

from ..net.addresses import IPAddress
from .model import Policy, Rule, RuleSet, tunnels

Verdict = Literal["allow", "deny", "report"]
Scheme = Literal["http", "https"]
# How the caller was learnt; "stdio": named on the command line of a local MCP server over stdio,
# which whoever starts it chooses (mcp/service.py, `named`); "bearer": a token sealgate minted
# for the sandbox (mcp/bearer.py).
Via = Literal["proxy-auth", "source", "default", "stdio", "bearer"]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who asks: a sandbox (None: no one proven) and the policy it names, and how that was
    learnt. The proxy finds it (request/identity.py), `rules explain` is told it; both ask
    `decide` with it."""

    sandbox: str | None
    policy: str | None
    via: Via


@dataclass(frozen=True, slots=True)
class Question:
    identity: Identity
    host: Host
    port: int
    scheme: Scheme = "https"
    method: str | None = None  # None: a tunnel, decided before any request is seen
    path: str | None = None  # normalised (policy.model.normalize_path)
    tokens: bool = False  # sealed tokens go with the request (or with the CONNECT's tunnel)
    ssl_insecure: bool = False  # upstream certificates are not verified (mitmproxy option)
    tool: bool = False  # one of sealgate's own calls (MCP), which `tools_only` rules serve
    # The methods the request's override headers name (X-HTTP-Method-Override and its kin),
    # upper-cased: an API that honours one takes the request for that method, so the rule
    # that allows the request must allow each of them too.
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: Reason | None = None  # None only for a plain allow
    detail: str = ""
    policy: Policy | None = None
    rule: Rule | None = None  # the rule that matched the request (None for a tunnel or a miss)
    host_rules: tuple[Rule, ...] = ()  # a tunnel's: the rules matching its host and port
    tunnel: bool = False  # a tunnel passed through undecrypted
    # Credentials go over plain HTTP: allowed only to an address `secure_for` accepts.
    plain_credentials: bool = False

    @property
    def allowed(self) -> bool:
        return self.verdict != "deny"

    def secure_for(self, address: IPAddress) -> Decision:
        """This decision once the dialed address is known: a credential over plain HTTP goes
        only to an address inside the policy's allow_networks."""
        if not self.plain_credentials or _in_networks(self.policy, address):
            return self
        return _deny(self.policy, Reason.INSECURE_UPSTREAM,
                     f"{address} is not in the policy's allow_networks", self.host_rules,
                     self.rule)


def policy_for(rules: RuleSet, identity: Identity) -> Policy | Decision:
    """Step 1 alone: the policy an identity names, or the refusal. The proxy asks it before it
    reads a request's target, so that an unidentified client learns nothing but 407."""
    policy = rules.policies.get(identity.policy) if identity.policy is not None else None
    if policy is not None:
        return policy
    if identity.policy is not None:  # the rules were reloaded without it
        return _deny(None, Reason.NOT_ALLOWED, "this sandbox's policy no longer exists")
    if identity.via == "default":
        return _deny(None, Reason.IDENTITY_REQUIRED, "authenticate with Proxy-Authorization")
    return _deny(None, Reason.NOT_ALLOWED, "this sandbox has no policy")


def decide(rules: RuleSet, question: Question) -> Decision:
    q = question
    policy = policy_for(rules, q.identity)
    if isinstance(policy, Decision):
        return policy
    # A tunnel is decided by every rule of its host and port; a request by the first rule that
    # allows it, so the per-request path matches once.
    rule = None
    if q.method is None:
        host_rules = policy.match_host(q.host, q.port, tool=q.tool)
        matched = bool(host_rules)
    else:
        host_rules = ()
        rule = policy.match(q.host, q.port, q.method, q.path or "/", tool=q.tool)
        matched = rule is not None
    verdict: Verdict = "allow"
    reason: Reason | None = None
    detail = ""
    if not matched:
        detail = f"{_where(q)} is not allowed"
        if policy.mode == "enforce":
            return _deny(policy, Reason.NOT_ALLOWED, detail)
        verdict, reason = "report", Reason.NOT_ALLOWED
    if rule is not None:
        for method in q.overrides:
            if not rule.allows_request(method, q.path or "/"):
                return _deny(policy, Reason.NOT_ALLOWED,
                             f"a method override names {method}, which the rule that allows "
                             f"{_where(q)} does not", host_rules, rule)
    # From here a refusal still names the rule that matched: the rule was not the problem.
    if name_reason := denied_name(q.host):
        return _deny(policy, name_reason,
                     f"{q.host.name} is never reachable through this proxy", host_rules, rule)
    if q.host.ip is not None and (ip_reason := policy.addresses.check(q.host.ip)):
        return _deny(policy, ip_reason,
                     f"{q.host.ip} is in a denied range ({ip_reason})", host_rules, rule)
    if q.tokens and not policy.tokens:
        return _deny(policy, Reason.TOKENS_NOT_ALLOWED,
                     f"policy {policy.name} does not accept tokens", host_rules, rule)
    credentials = q.method is not None and (q.tokens or (rule is not None and bool(rule.inject)))
    plain = credentials and (q.scheme != "https" or q.ssl_insecure)
    if plain:
        if q.scheme != "http" or rule is None or not rule.plain_http:
            return _deny(policy, Reason.INSECURE_UPSTREAM,
                         "credentials are only injected over verified TLS", host_rules, rule)
        if q.host.ip is not None and not _in_networks(policy, q.host.ip):
            return _deny(policy, Reason.INSECURE_UPSTREAM,
                         f"{q.host.ip} is not in the policy's allow_networks", host_rules, rule)
    return Decision(
        verdict, reason, detail, policy, rule, host_rules,
        tunnel=q.method is None and tunnels(policy, host_rules), plain_credentials=plain,
    )


def _where(q: Question) -> str:
    target = format_hostport(q.host.name, q.port)
    return target if q.method is None else f"{q.method} {target}{q.path or '/'}"


def _in_networks(policy: Policy | None, address: IPAddress) -> bool:
    return policy is not None and any(address in net for net in policy.allow_networks)


def _deny(
    policy: Policy | None, reason: Reason, detail: str, host_rules: tuple[Rule, ...] = (),
    rule: Rule | None = None,
) -> Decision:
    return Decision("deny", reason, detail, policy, rule, host_rules)
