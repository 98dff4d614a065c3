"""`rules suggest`'s reading of audit lines and its rules: smallest, exact-named, and checked
by the proxy's own decision (tests/integration/test_rules_suggest.py runs it against real
proxies)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from sealgate.proxy.policy import suggest
from sealgate.proxy.policy.model import RuleSet
from sealgate.proxy.policy.rulesfile import load_rules

RULES = """
version: 1
policies:
  ci:
    mode: report
    allow:
      - host: pypi.org
        ports: [443]
  other:
    mode: report
    allow: []
sandboxes: {}
default_policy: ci
"""


@pytest.fixture()
def rules(tmp_path: Path) -> RuleSet:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return load_rules(path)


def line(method: str | None, host: str, path: str | None, *, port: int = 443,
         policy: str = "ci", decision: str = "report", **more: Any) -> str:
    entry = {"event": "request", "policy": policy, "method": method or "CONNECT",
             "scheme": "" if method is None else "https", "host": host, "port": port,
             "path": path, "decision": decision, "reason": "not_allowed", **more}
    return json.dumps(entry)


def learn(rules: RuleSet, lines: list[str], **kwargs: Any) -> tuple[
        list[suggest.Suggestion], list[suggest.Replayed], suggest.Evidence]:
    found = suggest.read(io.StringIO("\n".join(lines) + "\n"), rules,
                         **{k: v for k, v in kwargs.items() if k != "most_paths"})
    made, still = suggest.learn(rules, found, most_paths=kwargs.get("most_paths", 5))
    return made, still, found


def test_paths_generalise_only_where_many_share_a_prefix() -> None:
    many = [f"/packages/ab/cd/f{i}.whl" for i in range(6)]
    few = ["/simple/a/", "/simple/b/"]
    top = [f"/x{i}" for i in range(9)]
    got = suggest.generalise(many + few + top, 5)
    assert {got[p] for p in many} == {"/packages/ab/cd/**"}  # the deepest shared prefix
    assert [got[p] for p in few] == few
    assert [got[p] for p in top] == top  # never /**, however many


def test_a_method_is_never_granted_on_a_path_it_was_not_seen_on(rules: RuleSet) -> None:
    made, still, _ = learn(rules, [line("GET", "api.test", "/a"), line("POST", "api.test", "/b"),
                                   line("GET", "api.test", "/b")])
    assert not still
    shapes = sorted((s.methods, s.paths) for s in made)
    assert shapes == [(("GET",), ("/a",)), (("GET", "POST"), ("/b",))]
    evidence = sorted((s.paths, s.by_method, s.distinct_paths) for s in made)
    assert evidence == [(("/a",), (("GET", 1),), 1), (("/b",), (("GET", 1), ("POST", 1)), 1)]


def test_ports_with_the_same_rules_share_one(rules: RuleSet) -> None:
    made, _, _ = learn(rules, [line("GET", "api.test", "/a", port=443),
                               line("GET", "api.test", "/a", port=8443),
                               line("GET", "api.test", "/z", port=9443)])
    assert sorted((s.ports, s.paths) for s in made) == [((443, 8443), ("/a",)),
                                                        ((9443,), ("/z",))]


def test_a_tunnel_alone_allows_its_host_and_port(rules: RuleSet) -> None:
    made, _, _ = learn(rules, [line(None, "tunnel.test", None)])
    assert [(s.host, s.ports, s.methods, s.paths) for s in made] == [
        ("tunnel.test", (443,), None, None)]


def test_hostile_lines_are_skipped_and_counted(rules: RuleSet) -> None:
    lines = [
        "not json", "[1, 2]", "x" * (suggest.MAX_LINE + 10),
        line("GET", "*", "/a"), line("GET", "*.evil.test", "/a"), line("GET", "A.test", "/a"),
        line("GET", "evil.test\nx", "/a"), line("GE T", "api.test", "/a"),
        line("GET", "api.test", "/a/../b"), line("GET", "api.test", "/a*"),
        line("GET", "api.test", "/a", port=0), line("GET", "api.test", "/a", policy="nope"),
        line("GET", "api.test", None),
    ]
    made, _, found = learn(rules, lines)
    assert made == []
    assert sum(found.skipped.values()) == len(lines) - 1  # the JSON list is no request line
    assert found.skipped["line too long"] == 1


def test_only_report_lines_unless_asked_and_only_the_policy_asked(rules: RuleSet) -> None:
    lines = [line("GET", "a.test", "/1"), line("GET", "b.test", "/2", decision="deny"),
             line("GET", "c.test", "/3", policy="other"),
             line("GET", "d.test", "/4", decision="allow")]
    assert {s.host for s in learn(rules, lines)[0]} == {"a.test", "c.test"}
    assert {s.host for s in learn(rules, lines, include_denied=True)[0]} == {
        "a.test", "b.test", "c.test"}
    assert {s.host for s in learn(rules, lines, policy="other")[0]} == {"c.test"}


def test_what_no_rule_can_allow_is_named_not_suggested(rules: RuleSet) -> None:
    made, still, _ = learn(rules, [line("GET", "169.254.169.254", "/latest", port=80),
                                   line("GET", "metadata.google.internal", "/x"),
                                   line("GET", "api.test", "/ok")])
    assert [s.host for s in made] == ["api.test"]
    assert sorted(r.reason or "" for r in still) == ["metadata", "metadata_name"]


def test_the_patch_is_yaml_with_the_rules(rules: RuleSet) -> None:
    import yaml

    made, _, _ = learn(rules, [line("GET", "api.test", f"/v1/{i}") for i in range(7)])
    patch = yaml.safe_load("\n".join(suggest.patch(made)))
    assert patch == {"policies": {"ci": {"allow": [
        {"host": "api.test", "ports": [443], "methods": ["GET"], "paths": ["/v1/**"]}]}}}
