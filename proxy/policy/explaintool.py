"""What the rules decide for one tool call, and why: `sealgate rules explain-tool RULES TOOL`.

The MCP server's own order (mcp/calls.py) up to what only a live call can tell: the tool of the
caller's policy (a declared one, or the generic `http_request`), its arguments against its JSON
Schema, its template filled, then the one `decide` for the request that makes, and the
credential the tool names checked against what the allowing rule injects. Budgets, the secret
store and the guard's resolution are not modelled (said as notes, as `explain` says them).

A TOOL written SERVER/TOOL is a tool of an upstream MCP server the gateway fronts (`mcp_servers:`,
served at /mcp/SERVER), in the gateway's order (mcp/gatewayflow.py): the server of the
caller's policy, the tool listed for it, the arguments against its constraints, then `decide`
for the POST to the server's URL and the server's credential against the allowing rule.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator

from sealgate.hostport import format_hostport
from sealgate.reasons import Reason

from .decide import Identity, Question, decide
from .explain import ExplainError, Explanation, _deny, _described, _identity
from .model import PathError, Policy, RuleSet, normalize_path
from .tools import ToolArgumentError

__all__ = ["explain_tool"]


def explain_tool(rules: RuleSet, name: str, arguments: dict[str, Any], *,
                 sandbox: str | None = None, policy: str | None = None) -> Explanation:
    result = Explanation("", "", tool=name)
    identity = _identity(rules, result, sandbox, policy)
    chosen = rules.policies.get(identity.policy) if identity.policy else None
    if chosen is None:
        raise ExplainError("no policy applies, so no tool does: give --sandbox or --policy")
    if "/" in name:
        return _gateway(rules, result, identity, chosen, name=name, arguments=arguments)
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
    return _decided(rules, result, Question(identity, call.host, call.port, call.scheme,
                                            call.method, path, tool=tool.rules_made),
                            tool.credential, "call")


def _gateway(rules: RuleSet, result: Explanation, identity: Identity, chosen: Policy, *,
             name: str, arguments: dict[str, Any]) -> Explanation:
    server_name, _, tool_name = name.partition("/")
    server = next((s for s in chosen.mcp_servers if s.name == server_name), None)
    if server is None:
        names = ", ".join(s.name for s in chosen.mcp_servers) or "none"
        raise ExplainError(f"policy {chosen.name} has no MCP server {server_name!r} (its "
                           f"servers: {names})")
    path = normalize_path(server.path)
    result.method = "POST"
    result.url = f"{server.scheme}://{format_hostport(server.host.name, server.port)}{server.path}"
    result.host, result.port, result.path = server.host.name, server.port, path
    tool = server.tool(tool_name)
    if tool is None:  # the gateway's -32602: not called, not listed
        listed = ", ".join(t.name for t in server.tools) or "none"
        return _deny(result, Reason.NOT_ALLOWED, f"{server.name} lists no tool {tool_name!r} "
                                                 f"(listed: {listed})")
    if (refused := tool.refusal(arguments)) is not None:
        return _deny(result, Reason.TOOL_ARGUMENTS_INVALID, f"arguments: {refused}")
    return _decided(rules, result, Question(identity, server.host, server.port, server.scheme,
                                            "POST", path, tool=True), server.credential,
                            "server")


def _decided(rules: RuleSet, result: Explanation, question: Question, credential: str | None,
             what: str) -> Explanation:
    """The one `decide` for the request a call makes, and the credential the call names
    against what the allowing rule injects."""
    decision = decide(rules, question)
    result.rule = rule = decision.rule
    result.decision, result.reason, result.detail = (
        decision.verdict, decision.reason, decision.detail)
    if decision.allowed and credential is not None and not (
            rule is not None and any(i.name == credential for i in rule.inject)):
        _deny(result, Reason.TOOL_CREDENTIAL,
              f"the rule that allows this {what} does not inject {credential!r}")
    return _described(result, decision, question.host, question.port, result.method)
