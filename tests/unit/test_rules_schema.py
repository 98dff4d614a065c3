"""rules/schema.json: the generator's output, valid JSON Schema, and never stricter than the
loader: a file `load_rules` accepts, the schema accepts (hypothesis draws files from the
grammar with good and bad values in every field); shape errors, unknown keys among them, both
refuse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sealgate.proxy.policy.rulesfile import RulesError, load_rules
from sealgate.proxy.policy.schema import schema

REPO = Path(__file__).resolve().parents[2]
VALIDATOR = jsonschema.Draft202012Validator(schema())


def test_the_committed_schema_is_the_generated_one() -> None:
    committed = json.loads((REPO / "rules" / "schema.json").read_text())
    assert committed == schema(), "run: sealgate rules schema > rules/schema.json"
    jsonschema.Draft202012Validator.check_schema(committed)


@pytest.mark.parametrize("path", sorted(
    str(p.relative_to(REPO)) for p in [REPO / "rules" / "default.yaml",
                                       *(REPO / "rules" / "examples").glob("*.yaml")]))
def test_every_shipped_rules_file_validates(path: str) -> None:
    document = yaml.safe_load((REPO / path).read_text())
    assert [e.message for e in VALIDATOR.iter_errors(document)] == []


class _Plain(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _accepted(tmp: Path, document: Any) -> bool:
    path = tmp / "rules.yaml"
    # Drawn values are shared objects, which a plain dump writes as anchors (refused).
    path.write_text(yaml.dump(document, Dumper=_Plain, sort_keys=False))
    try:
        load_rules(path)
        return True
    except RulesError:
        return False


def _mostly(good: list[Any], bad: list[Any]) -> st.SearchStrategy[Any]:
    """A good value nine draws in ten: enough files load for the test to mean something."""
    return st.sampled_from(good * (9 * max(1, len(bad)) // len(good) + 1) + bad)


_RULE = st.fixed_dictionaries({"host": _mostly(["api.test", "*.x.test", "*"], [5])}, optional={
    "ports": _mostly([[443], [80, 8080], []], [[0], [70000], ["443"]]),
    "methods": _mostly([["GET"], ["GET", "POST"]], [["get"], [1], "GET"]),
    "paths": _mostly([["/a/**"], ["/v1/*/x"]], [["a"], ["/a/**/b/**"], [""]]),
    "plain_http": _mostly([True, False], ["no"]),
    "response_timeout": _mostly([1, 2.5], [0, 100000, "1"]),
    "strip": _mostly([["X-A"], []], [["bad header"]]),
    "inject": st.sampled_from([
        [{"secret": "file:k", "as": "bearer"}],
        [{"secret": "file:k", "as": "bearer", "name": "gh"}],
        [{"secret": "file:k", "as": "bearer", "name": "bad name"}],
        [{"secret": "file:k", "as": "nope"}],
        [{"secret": {"mount": "kv", "path": "p", "field": "f"},
          "as": {"type": "header", "header": "X-K"}}],
        [{"secret": {"mount": "kv", "path": "p"}, "as": "bearer"}],
        [{"secret": "file:k", "as": {"type": "header"}}],
        [{"secret": "file:k"}]]),
})
_TOOL = st.fixed_dictionaries({
    "name": _mostly(["list_issues", "a.b-c"], ["bad name", ".x", 5]),
    "description": _mostly(["Lists issues."], ["", 3]),
    "method": _mostly(["GET", "POST"], ["get"]),
    "url": _mostly(["https://api.test/r/{id}", "http://api.test:8080/x"],
                   ["ftp://api.test/", "https://{host}/", "https://api.test/a?b=1"]),
}, optional={
    "query": _mostly([{"q": "{id}"}, {"n": "20"}], [{"bad name": "x"}, {"q": 5}]),
    "arguments": _mostly([{"type": "object", "properties": {"id": {"type": "string"}},
                           "required": ["id"]}],
                         [{"type": "array"}, {"type": "object", "properties": 5}]),
    "credential": _mostly(["gh"], ["nope", "bad name"]),
    "max_response_bytes": _mostly([1024], [0, 10**9]),
    "returns": _mostly([["a", "b.c"]], [[""], "a"]),
    "timeout": _mostly([5, 2.5], [0, 1000]),
    "body": _mostly([{"id": "{id}"}], [{"id": "x {id}"}]),
})
_POLICY = st.fixed_dictionaries({}, optional={
    "mode": _mostly(["enforce", "report"], ["block", 1]),
    "tokens": _mostly([True, False], ["yes"]),
    "allow": st.lists(_RULE, max_size=3) | st.just(None),
    "allow_networks": _mostly([["10.0.0.0/8"], []], [["10.0.0.1/8"], [5]]),
    "tools": st.lists(_TOOL, max_size=2) | st.just([{
        "name": "t", "description": "d", "method": "GET", "url": "https://api.test/x"}]),
    "budgets": st.fixed_dictionaries({}, optional={
        "requests_per_second": _mostly([1, 0.5], [0, -1, "x"]),
        "burst": _mostly([1], [0, 10**20]),
        "max_total_bytes": _mostly([1], [0])}),
})
_SANDBOX = st.fixed_dictionaries({}, optional={
    "policy": _mostly(["ci"], ["gone", "bad name"]),
    "key_sha256": _mostly(["0" * 64], ["0" * 63, "z" * 64]),
})
_DOCUMENT = st.fixed_dictionaries({"version": _mostly([1], [2, "1"])}, optional={
    "policies": st.dictionaries(_mostly(["ci", "a.b"], ["bad name", "-x"]), _POLICY,
                                max_size=2),
    "sandboxes": st.dictionaries(_mostly(["s1"], ["s 2"]), _SANDBOX, max_size=2),
    "default_policy": _mostly([None, "ci"], ["bad name", 3]),
})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(document=_DOCUMENT)
def test_what_the_loader_accepts_the_schema_accepts(tmp_path: Path, document: Any) -> None:
    if _accepted(tmp_path, document):
        errors = [e.message for e in VALIDATOR.iter_errors(document)]
        assert errors == [], (document, errors)


@pytest.mark.parametrize("document", [
    {"policies": {}},
    {"version": 1, "policy": {}},
    {"version": 1, "policies": {"ci": {"allow": [{"host": "a.test", "port": [443]}]}}},
    {"version": 1, "policies": {"ci": {"allow": [{"ports": [443]}]}}},
    {"version": 1, "policies": {"ci": {"mode": "block"}}},
    {"version": 1, "policies": {"ci": {"allow": [{"host": "a.test", "methods": ["get"]}]}}},
    {"version": 1, "policies": {"ci": {"allow": [{"host": "a.test", "ports": [0]}]}}},
    {"version": 1, "policies": {"ci": {"budgets": {"burst": 0}}}},
    {"version": 1, "policies": {"ci": {"allow": [{"host": "a.test", "inject": [
        {"secret": "file:k", "as": "nope"}]}]}}},
    {"version": 1, "policies": {"ci": {}}, "sandboxes": {"s": {"policy": "ci"}}},
    {"version": 1, "default_policy": "bad name"},
    {"version": 1, "policies": {"ci": {"tools": [{"name": "t", "description": "d"}]}}},
    {"version": 1, "policies": {"ci": {"tools": [
        {"name": "t", "description": "d", "method": "GET", "url": "https://a.test/",
         "arguments": {"type": "string"}}]}}},
])
def test_shape_errors_are_refused_by_both(tmp_path: Path, document: Any) -> None:
    assert not _accepted(tmp_path, document)
    assert list(VALIDATOR.iter_errors(document)), document
