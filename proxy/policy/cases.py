"""Tests for rules, written next to them and run in CI: `sealgate rules test RULES CASES...`.

A case names a request, who sends it, and the decision the rules must come to:

    cases:
      - name: CI may read PyPI
        sandbox: ci-bot               # or `policy: NAME`; neither: unidentified traffic
        request: GET https://pypi.org/simple/requests/
        expect: allow                 # allow, deny or report
        rule: ci.yaml:14              # optional: the rule that must decide it (file:line)
      - name: no metadata, ever
        sandbox: ci-bot
        request: GET http://169.254.169.254/latest/meta-data/
        expect: deny
        reason: metadata              # optional: the proxy's reason code
      - name: the docs server's search, for octo/docs only
        sandbox: ci-bot
        tool: docs/search             # instead of `request`: an MCP tool call (explain-tool)
        arguments: {repo: octo/other} # optional, default {}
        expect: deny
        reason: tool_arguments_invalid

Cases are decided by `policy.explain` (a tool call's by `explaintool.explain_tool`: a declared
tool, `http_request`, or SERVER/TOOL of the gateway), so what they cannot see (a name's DNS
answers, budgets, sealed tokens) they cannot test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yaml.nodes import Node

from sealgate.yamlfile import YamlFile

from .explain import ExplainError, Explanation, explain
from .explaintool import explain_tool
from .model import RulesError, RuleSet

_DECISIONS = ("allow", "deny", "report")
_KEYS = ("name", "sandbox", "policy", "request", "tool", "arguments", "expect", "reason",
         "rule")


@dataclass(frozen=True)
class Case:
    name: str
    where: str  # file:line
    method: str  # a request's; "" for a tool call
    url: str
    expect: str
    tool: str | None = None  # a tool call's tool, instead of a request
    arguments: dict[str, Any] = field(default_factory=dict)
    sandbox: str | None = None
    policy: str | None = None
    reason: str | None = None
    rule: str | None = None


@dataclass(frozen=True)
class Outcome:
    case: Case
    explanation: Explanation | None
    failures: tuple[str, ...]  # empty: passed

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        got = self.explanation
        return {
            "name": self.case.name, "where": self.case.where, "passed": self.passed,
            # What was asked: the request, or the tool call (its arguments left out: a case
            # file may carry values a report need not repeat).
            "request": f"{self.case.method} {self.case.url}" if self.case.tool is None else None,
            "tool": self.case.tool,
            "failures": list(self.failures),
            "decision": got.decision if got else None, "reason": got.reason if got else None,
            "rule": got.rule.source if got and got.rule else None,
        }


class _CaseFile(YamlFile):
    error_type = RulesError

    def cases(self) -> list[Case]:
        if self.root is None:
            raise RulesError(self.path, None, "", "file is empty; expected 'cases:'")
        top = self.mapping(self.root, "")
        self.expect_keys(top, self.root, "", ("cases",), ("cases",))
        items = self.sequence(top["cases"][1], "cases")
        if not items:
            raise self.error(top["cases"][1], "cases", "no cases")
        return [self._case(node, f"cases[{i}]") for i, node in enumerate(items)]

    def _case(self, node: Node, where: str) -> Case:
        entries = self.mapping(node, where)
        self.expect_keys(entries, node, where, _KEYS, ("name", "expect"))
        if "request" not in entries and "tool" not in entries:
            raise self.error(node, f"{where}.request",
                             "required key is missing (or `tool`, for an MCP tool call)")
        if "request" in entries and "tool" in entries:
            raise self.error(node, where, "give a request or a tool, not both")
        arguments: dict[str, Any] = {}
        if "arguments" in entries:
            if "tool" not in entries:
                raise self.error(entries["arguments"][1], f"{where}.arguments",
                                 "arguments are a tool call's")
            value = self.value(entries.pop("arguments")[1], f"{where}.arguments")
            if not isinstance(value, dict):
                raise self.error(node, f"{where}.arguments", "expected a mapping")
            arguments = value
        text = {key: self.string(value, f"{where}.{key}") for key, (_, value) in entries.items()}
        method, url = "", ""
        if "request" in text:
            method, _, url = text["request"].strip().partition(" ")
            if not method or not url.strip():
                raise self.error(entries["request"][1], f"{where}.request",
                                 "write the method, a space and the URL: GET https://host/path")
        if text["expect"] not in _DECISIONS:
            raise self.error(entries["expect"][1], f"{where}.expect",
                             f"expected one of: {', '.join(_DECISIONS)}")
        if "sandbox" in text and "policy" in text:
            raise self.error(node, where, "give a sandbox or a policy, not both")
        return Case(
            name=text["name"], where=str(self.where(node)), method=method, url=url.strip(),
            expect=text["expect"], tool=text.get("tool"), arguments=arguments,
            sandbox=text.get("sandbox"), policy=text.get("policy"),
            reason=text.get("reason"), rule=text.get("rule"),
        )


def load_cases(path: Path) -> list[Case]:
    """The cases of one file; RulesError (file:line: field: message) when it is malformed."""
    return _CaseFile(path).cases()


def run_case(rules: RuleSet, case: Case) -> Outcome:
    try:
        if case.tool is not None:
            got = explain_tool(rules, case.tool, case.arguments, sandbox=case.sandbox,
                               policy=case.policy)
        else:
            got = explain(rules, case.method, case.url, sandbox=case.sandbox,
                          policy=case.policy)
    except ExplainError as exc:
        return Outcome(case, None, (str(exc),))
    failures = []
    if got.decision != case.expect:
        failures.append(f"expected {case.expect}, got {got.decision}" + _because(got))
    if case.reason is not None and got.reason != case.reason:
        failures.append(f"expected reason {case.reason}, got {got.reason or 'none'}")
    if case.rule is not None and not _same_rule(got, case.rule):
        failures.append(f"expected rule {case.rule}, got "
                        f"{got.rule.source if got.rule else 'no rule'}")
    return Outcome(case, got, tuple(failures))


def _because(got: Explanation) -> str:
    if got.rule is not None:
        return f" (rule {got.rule.source})"
    return f" ({got.reason}: {got.detail})" if got.reason else ""


def _same_rule(got: Explanation, expected: str) -> bool:
    """`ci.yaml:14` names the rule at rules/ci.yaml:14: compared from a path boundary."""
    if got.rule is None:
        return False
    source = got.rule.source
    return source == expected or source.endswith("/" + expected)
