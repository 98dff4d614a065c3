"""`rules bound`: crafted ceiling and rules pairs, each crossing named with its rule and a
request that shows it; the path-glob containment checked against brute force."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

import pytest

from sealgate.proxy.policy.bound import Crossing, bound
from sealgate.proxy.policy.ceiling import load_ceiling
from sealgate.proxy.policy.globs import uncovered
from sealgate.proxy.policy.model import PathError, RulesError, normalize_path, path_glob_regex
from sealgate.proxy.policy.rulesfile import load_rules


def crossings(tmp_path: Path, ceiling: str, policy: str, *, mode: str = "enforce",
              extra: str = "") -> list[Crossing]:
    (tmp_path / "ceiling.yaml").write_text("version: 1\nceiling:\n" + _indent(ceiling, 2))
    (tmp_path / "rules.yaml").write_text(
        f"version: 1\npolicies:\n  p:\n    mode: {mode}\n" + _indent(policy, 4) + extra)
    return bound(load_ceiling(tmp_path / "ceiling.yaml"), load_rules(tmp_path / "rules.yaml"))


def _indent(text: str, n: int) -> str:
    return "".join(" " * n + line + "\n" for line in text.strip("\n").splitlines())


GITHUB = """
allow:
  - host: "*.github.com"
    ports: [443]
    methods: [GET]
  - host: api.github.com
    ports: [443]
    paths: ["/repos/**"]
"""


def test_a_wildcard_that_crosses_only_through_its_path_glob(tmp_path: Path) -> None:
    inside = crossings(tmp_path, GITHUB, """
allow:
  - host: api.github.com
    ports: [443]
    methods: [POST]
    paths: ["/repos/*/*/issues"]
""")
    assert inside == []
    got = crossings(tmp_path, GITHUB, """
allow:
  - host: api.github.com
    ports: [443]
    methods: [POST]
    paths: ["/repos/*/*/issues", "/re*/x"]
""")
    assert [(c.bound, c.request) for c in got] == [("allow", "POST https://api.github.com/re/x")]
    assert got[0].where.endswith("rules.yaml:6")  # the rule's line


@pytest.mark.parametrize(("host", "inside"), [
    ("*.github.com", True), ("*.a.github.com", True), ("x.github.com", True),
    ("github.com", False), ("*.github.io", False), ("*.xgithub.com", False), ("*", False),
])
def test_host_patterns_by_containment(tmp_path: Path, host: str, inside: bool) -> None:
    got = crossings(tmp_path, GITHUB, f"""
allow:
  - host: "{host}"
    ports: [443]
    methods: [GET]
""")
    assert (got == []) is inside, got
    if not inside:
        assert [c.bound for c in got] == ["allow"]
        witness = got[0].request or ""
        assert re.fullmatch(r"GET https://[a-z.-]+/", witness), witness
        if host.startswith("*."):  # a name the rule matches and the ceiling does not
            assert witness.split("/")[2].endswith(host[1:])


def test_a_tunnel_or_any_method_crosses_a_ceiling_that_names_methods(tmp_path: Path) -> None:
    got = crossings(tmp_path, GITHUB, """
allow:
  - host: "*.github.com"
    ports: [443]
""")
    assert [c.request for c in got] == ["POST https://sealgate-bound.github.com/"]


def test_policy_settings_crossing(tmp_path: Path) -> None:
    ceiling = """
any_host: false
tokens: false
plain_http: false
inject_hosts: [api.github.com]
allow_networks: [10.0.0.0/25, 10.0.0.128/25]
budgets: {requests_per_second: 100, max_total_bytes: 1000}
"""
    policy = """
tokens: true
allow:
  - host: "*"
    ports: [443]
  - host: 10.0.0.9
    ports: [80]
    plain_http: true
    inject:
      - secret: file:k
        as: bearer
allow_networks: [10.0.0.0/24, 10.0.1.0/24]
budgets: {requests_per_second: 50, max_total_bytes: 2000}
"""
    got = crossings(tmp_path, ceiling, policy)
    assert sorted(c.bound for c in got) == sorted(
        ["tokens", "allow_networks", "budgets", "any_host", "inject_hosts", "plain_http"])
    networks = [c.what for c in got if c.bound == "allow_networks"]
    assert networks == ["allow_networks 10.0.1.0/24 opens 10.0.1.0, which the ceiling's "
                        "allow_networks do not"]  # the /24 is covered by the two /25s


def test_report_mode_crosses_any_host_bound(tmp_path: Path) -> None:
    policy = "allow: []"
    assert [c.bound for c in crossings(tmp_path, GITHUB, policy, mode="report")] == [
        "report_mode"]
    assert crossings(tmp_path, "tokens: false", policy, mode="report") == []
    assert [c.bound for c in crossings(tmp_path, "report_mode: false", policy,
                                       mode="report")] == ["report_mode"]


def test_only_the_policies_named(tmp_path: Path) -> None:
    extra = '  q:\n    allow:\n      - host: "*"\nsandboxes: {}\n'
    got = crossings(tmp_path, "policies: [p]\nany_host: false", "allow: []", extra=extra)
    assert got == []
    got = crossings(tmp_path, "any_host: false", "allow: []", extra=extra)
    assert [c.policy for c in got] == ["q"]


@pytest.mark.parametrize(("text", "where"), [
    ("ceiling:\n  allow: []\n", "version"),
    ("version: 2\nceiling: {}\n", "version"),
    ("version: 1\nceiling:\n  nope: 1\n", "ceiling"),
    ("version: 1\nceiling:\n  allow:\n    - host: a.test\n      inject: []\n", "ceiling.allow[0]"),
    ("version: 1\nceiling:\n  tokens: yes\n", "ceiling.tokens"),
    ("version: 1\nceiling:\n  allow_networks: [10.0.0.1/8]\n", "ceiling.allow_networks"),
])
def test_a_broken_ceiling_names_its_line_and_field(tmp_path: Path, text: str,
                                                   where: str) -> None:
    path = tmp_path / "ceiling.yaml"
    path.write_text(text)
    with pytest.raises(RulesError) as raised:
        load_ceiling(path)
    assert raised.value.field.startswith(where), str(raised.value)


def test_glob_containment_agrees_with_brute_force() -> None:
    """Every path up to six characters over the globs' letters, a letter they do not name and
    '/', against the regexes the proxy matches with."""
    rng = random.Random(20261203)
    segments = ["a", "b", "*", "a*", "*b", "**", "ab", ""]

    def glob() -> str:
        while True:
            text = "/" + "/".join(rng.choice(segments) for _ in range(rng.randint(1, 3)))
            try:
                path_glob_regex(text)
                return text
            except ValueError:
                continue  # the loop draws again; valid globs are most of the draws

    paths = []
    for n in range(1, 7):
        for chars in itertools.product("abc/", repeat=n - 1):
            path = "/" + "".join(chars)
            try:
                normalize_path(path)
            except PathError:
                continue
            paths.append(path)
    for _ in range(300):
        inner, outer = [glob() for _ in range(rng.randint(1, 2))], [
            glob() for _ in range(rng.randint(0, 3))]
        inner_re = [re.compile(path_glob_regex(g)) for g in inner]
        outer_re = [re.compile(path_glob_regex(g)) for g in outer]
        brute = [p for p in paths if any(r.fullmatch(p) for r in inner_re)
                 and not any(r.fullmatch(p) for r in outer_re)]
        found = uncovered(inner, outer)
        if found is None:
            assert brute == [], (inner, outer, brute[:3])
        else:
            assert any(r.fullmatch(found) for r in inner_re), (inner, found)
            assert not any(r.fullmatch(found) for r in outer_re), (outer, found)
            if brute:
                assert len(found) <= len(brute[0]), (inner, outer, found, brute[0])
