"""`sealgate rules bound CEILING RULES`: does every policy stay inside the ceiling?

Answered from what the rules mean, not how they are written: a rule is inside `allow` when every
request it allows (each of its ports, each method, every path its globs match, every name its
host pattern matches) is allowed by some ceiling entry, and that is decided exactly (host patterns
by containment, paths by globs.py's automata); where it is not, the answer names the rule and one
request that crosses, such as `POST https://sealgate-bound.github.com/` for a `*.github.com` rule
when the ceiling allows POST only to `api.github.com`. A report-mode policy allows what no rule
does, so it crosses any host bound; a rule passed through undecrypted allows every method and
path, so a ceiling that narrows either is crossed by it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network
from typing import Any, Final

from sealgate.hostname import HostError, canonical_name

from .ceiling import Ceiling
from .globs import uncovered
from .model import ANY_HOST, Policy, Rule, RuleSet

_ANY_PATH: Final = ("/**",)
_WITNESS_LABEL: Final = "sealgate-bound"
# A method the ceiling names nowhere stands for every such method.
_METHODS: Final = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


@dataclass(frozen=True)
class Crossing:
    policy: str
    where: str  # the rule's file:line; "" for a policy's own setting
    bound: str  # the ceiling's key that is crossed
    what: str
    request: str | None = None  # one request that crosses, where there is one

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "where": self.where or None, "bound": self.bound,
                "what": self.what, "request": self.request}


def bound(ceiling: Ceiling, rules: RuleSet) -> list[Crossing]:
    crossings: list[Crossing] = []
    for name in sorted(rules.policies):
        if ceiling.policies is None or name in ceiling.policies:
            crossings += _policy(ceiling, rules.policies[name])
    return crossings


def _policy(ceiling: Ceiling, policy: Policy) -> list[Crossing]:
    out: list[Crossing] = []

    def cross(bound: str, what: str, rule: Rule | None = None, request: str | None = None) -> None:
        out.append(Crossing(policy.name, rule.source if rule else "", bound, what, request))

    hosts_bounded = ceiling.allow is not None or ceiling.any_host is False
    if policy.mode == "report" and (ceiling.report_mode is False or (
            ceiling.report_mode is None and hosts_bounded)):
        cross("report_mode", "the policy is in report mode: it allows what no rule does",
              request=_request("GET", _host_witness(ANY_HOST), 443, "/"))
    if ceiling.tokens is False and policy.tokens:
        cross("tokens", "the policy accepts sealed tokens")
    if ceiling.allow_networks is not None:
        for net in policy.allow_networks:
            if (outside := _outside(net, ceiling.allow_networks)) is not None:
                cross("allow_networks", f"allow_networks {net} opens {outside}, which the "
                                        "ceiling's allow_networks do not")
    for key, most in ceiling.budgets:
        if (value := float(getattr(policy.budgets, key))) > most:
            cross("budgets", f"budgets.{key} {value:g} is over the ceiling's {most:g}")
    for rule in policy.rules:
        if ceiling.any_host is False and rule.host == ANY_HOST:
            cross("any_host", "the rule allows any host", rule,
                  _request("GET", _host_witness(ANY_HOST), min(rule.ports, default=443), "/"))
        if ceiling.plain_http is False and rule.plain_http:
            cross("plain_http", "the rule sends credentials over plain HTTP", rule)
        # Brokered credentials only: a sealed token names its own hosts, which the issuer
        # bounds (and `tokens: false` forbids).
        if ceiling.inject_hosts is not None and rule.inject and not any(
                _within(rule.host, outer) for outer in ceiling.inject_hosts):
            cross("inject_hosts", f"the rule injects credentials for {rule.host}, outside "
                  "inject_hosts", rule,
                  _request("GET", _host_witness(rule.host), min(rule.ports, default=443), "/"))
        if ceiling.allow is not None and (request := _outside_allow(rule, ceiling.allow)):
            cross("allow", f"the rule for {rule.host} allows more than the ceiling", rule,
                  request)
    return out


# -- hosts ------------------------------------------------------------------------------------


def _within(inner: str, outer: str) -> bool:
    """Whether every name host pattern `inner` matches, `outer` matches too."""
    if outer == ANY_HOST:
        return True
    if inner == ANY_HOST:
        return False
    if outer.startswith("*."):
        if inner.startswith("*."):
            return inner[1:].endswith(outer[1:])
        return not _is_address(inner) and inner.endswith(outer[1:])
    return inner == outer


def _is_address(name: str) -> bool:
    try:
        return canonical_name(name).ip is not None
    except HostError:
        return False


def _host_witness(pattern: str) -> str:
    """A name `pattern` matches that a pattern not containing it does not."""
    if pattern == ANY_HOST:
        return f"{_WITNESS_LABEL}.example"
    if pattern.startswith("*."):
        return f"{_WITNESS_LABEL}{pattern[1:]}"
    return pattern


# -- requests ---------------------------------------------------------------------------------


def _outside_allow(rule: Rule, allow: tuple[Rule, ...]) -> str | None:
    """One request `rule` allows and no ceiling entry does, or None."""
    holders = [c for c in allow if _within(rule.host, c.host)]
    host = _host_witness(rule.host)
    inner = rule.paths if rule.paths is not None else _ANY_PATH
    for port in sorted(rule.ports):
        at_port = [c for c in holders if port in c.ports]
        methods = sorted(rule.methods) if rule.methods is not None else _methods(at_port)
        for method in methods:
            outer = [p for c in at_port if c.methods is None or method in c.methods
                     for p in (c.paths if c.paths is not None else _ANY_PATH)]
            if (path := uncovered(inner, outer)) is not None:
                return _request(method, host, port, path)
    return None


def _methods(entries: Iterable[Rule]) -> list[str]:
    """For a rule allowing any method: each the entries name, and one none names (for all the
    others)."""
    named = sorted({m for c in entries if c.methods is not None for m in c.methods})
    unnamed = next((m for m in _METHODS if m not in named), "SEALGATE-BOUND")
    return [*named, unnamed]


def _request(method: str, host: str, port: int, path: str) -> str:
    scheme = "http" if port == 80 else "https"
    shown = f"[{host}]" if ":" in host else host
    default = {"http": 80, "https": 443}[scheme]
    return f"{method} {scheme}://{shown}{'' if port == default else f':{port}'}{path}"


# -- networks ---------------------------------------------------------------------------------


def _outside(net: IPv4Network | IPv6Network,
             ceiling: tuple[IPv4Network | IPv6Network, ...]) -> str | None:
    """An address of `net` outside every ceiling network, or None. CIDR blocks either nest or
    are apart: what is left of `net` after each block is at most a prefix length of blocks."""
    left: list[IPv4Network | IPv6Network] = [net]
    for block in ceiling:
        if block.version != net.version:
            continue
        rest: list[IPv4Network | IPv6Network] = []
        for part in left:
            if part.subnet_of(block):  # type: ignore[arg-type]
                continue
            if block.subnet_of(part):  # type: ignore[arg-type]
                rest += part.address_exclude(block)  # type: ignore[arg-type]
            else:
                rest.append(part)
        left = rest
    return str(min(left).network_address) if left else None
