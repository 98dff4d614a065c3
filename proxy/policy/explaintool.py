"""What the rules decide for one tool call, and why: `sealgate rules explain-tool RULES TOOL`.

The MCP server's own order (mcp/calls.py) up to what only a live call can tell: the tool of the
caller's policy (a declared one, or the generic `http_request`), its arguments against its JSON
Schema, its template filled, then the one `decide` for the request that makes, and the
credential the tool names checked against what the allowing rule injects. Budgets, the secret
store and the guard's resolution are not modelled (said as notes, as `explain` says them).
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator

from sealgate.hostport import format_hostport
from sealgate.reasons import Reason

from .decide import Question, decide
from .explain import ExplainError, Explanation, _deny, _described, _identity
from .model import PathError, RuleSet, normalize_path
from .tools import ToolArgumentError

__all__ = ["explain_tool"]


def explain_tool(rules: RuleSet, name: str, arguments: dict[str, Any], *,
                 sandbox: str | None = None, policy: str | None = None) -> Explanation:
    result = Explanation("", "", tool=name)
    identity = _identity(rules, result, sandbox, policy)
    chosen = rules.policies.get(identity.policy) if identity.policy else None
    if chosen is None:
        raise ExplainError("no policy applies, so no tool does: give --sandbox or --policy")
    offered = chosen.offered_tools
    tool = next((t for t in offered if t.name == name), None)
    if tool is None:
        names = ", ".join(t.name for t in offered) or "none"
        raise ExplainError(f"policy {chosen.name} has no tool {name!r} (its tools: {names})")
    errors = list(Draft202012Validator(tool.schema).iter_errors(arguments))
    if errors:
        shown = "; ".join(f"{'/'.join(map(str, e.absolute_path)) or '(arguments)'}: "
                          f"{str(e.message)[:160]}" for e in errors[:5])
        return _deny(result, Reason.TOOL_ARGUMENTS_INVALID, f"arguments: {shown}")
    try:
        call = tool.request(arguments)
        path = normalize_path(call.path)
    except (ToolArgumentError, PathError) as exc:
        return _deny(result, exc.reason, f"arguments: {exc}")
    result.method = call.method
    result.url = f"{call.scheme}://{format_hostport(call.host.name, call.port)}{call.target}"
    result.host, result.port, result.path = call.host.name, call.port, path
    decision = decide(rules, Question(identity, call.host, call.port, call.scheme, call.method,
                                      path))
    result.rule = decision.rule
    result.decision, result.reason, result.detail = (
        decision.verdict, decision.reason, decision.detail)
    rule = decision.rule
    if decision.allowed and tool.credential is not None and not (
            rule is not None and any(i.name == tool.credential for i in rule.inject)):
        _deny(result, Reason.TOOL_CREDENTIAL,
              f"the rule that allows this call does not inject {tool.credential!r}")
    return _described(result, decision, call.host, call.port, call.method)
