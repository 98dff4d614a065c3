"""The `sealgate rules` commands as a child process: exit codes, JSON, the shipped rules."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sealgate.proxy.policy.diff import diff
from sealgate.proxy.policy.rulesfile import load_rules
from tests.harness import ROOT, SEALGATE
from tests.unit.test_rules_tools import CASES, RULES, write


def sealgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SEALGATE, "rules", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    good = write(tmp_path, "rules.yaml", RULES)
    bad = write(tmp_path, "bad.yaml", RULES.replace("mode: enforce", "mode: enforcing"))
    out = sealgate("check", str(good))
    assert out.returncode == 0 and out.stdout.startswith("ok "), out.stderr
    out = sealgate("check", "--json", str(good), str(bad))
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert report["ok"] is False
    assert report["results"][1]["error"]["field"] == "policies.ci.mode"

    out = sealgate("explain", str(good), "--sandbox", "bot-1", "GET",
                   "https://api.example.com/v1/users")
    assert out.returncode == 0 and "decision  ALLOW" in out.stdout
    out = sealgate("explain", str(good), "--sandbox", "bot-1", "--json", "DELETE",
                   "https://api.example.com/v1/users")
    assert out.returncode == 1 and json.loads(out.stdout)["reason"] == "not_allowed"
    out = sealgate("explain", str(good), "--sandbox", "ghost", "GET", "https://x.example/")
    assert out.returncode == 2 and "no sandbox 'ghost'" in out.stderr

    cases = write(tmp_path, "cases.yaml", CASES)
    out = sealgate("test", str(good), str(cases))
    assert out.returncode == 1
    assert "FAIL  wrong on purpose" in out.stdout and "2 passed, 2 failed" in out.stdout

    wider = write(tmp_path, "wider.yaml", RULES.replace("tokens", "tokens").replace(
        "  watcher:\n    mode: report", "  watcher:\n    mode: report\n    tokens: true"))
    out = sealgate("diff", str(good), str(wider))
    assert out.returncode == 0
    assert out.stdout.splitlines() == ["policy watcher", "  ~ tokens false -> true  [widens]",
                                       "1 changes, 1 widen or may widen access"]
    assert sealgate("diff", "--fail-on-widen", str(good), str(wider)).returncode == 1
    narrower = write(tmp_path, "narrower.yaml",
                     RULES.replace('      - host: "*"\n        ports: [8080]\n', ""))
    out = sealgate("diff", "--fail-on-widen", str(good), str(narrower))
    assert out.returncode == 0, out.stdout
    assert sealgate("diff", str(good), str(bad)).returncode == 2


@pytest.mark.parametrize(("rules_file", "cases_file"), [
    ("rules/examples/ci-bot.yaml", "rules/tests/ci-bot.yaml"),
    ("rules/default.yaml", "rules/tests/default.yaml"),
])
def test_the_shipped_rules_pass_their_checks_and_cases(rules_file: str, cases_file: str) -> None:
    assert sealgate("check", "--strict", rules_file).returncode == 0
    out = sealgate("test", rules_file, cases_file)
    assert out.returncode == 0, out.stdout + out.stderr


def test_diff_marks_what_may_widen_for_review(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, "rules.yaml", RULES))
    # A sandbox moved to another policy, tokens switched off: --fail-on-widen fails on both.
    moved = RULES.replace('new-1: {policy: watcher', 'new-1: {policy: ci')
    changes = diff(rules, load_rules(write(tmp_path, "moved.yaml", moved)))
    assert [(c.what, c.widens) for c in changes] == [("policy watcher -> ci", None)]
    tokens_on = RULES.replace("  ci:\n    mode: enforce",
                              "  ci:\n    mode: enforce\n    tokens: true")
    on, off = (load_rules(write(tmp_path, f"{n}.yaml", t)) for n, t in (("on", tokens_on),
                                                                        ("off", RULES)))
    assert [c.widens for c in diff(off, on)] == [True]
    assert [c.widens for c in diff(on, off)] == [None]
    # Removing the only rule of a host that needed inspection, where another rule stays: the
    # host's TLS would pass through undecrypted.
    before = RULES.replace('      - host: "*.cdn.example.com"\n        ports: [443]\n',
                           '      - host: "*.cdn.example.com"\n        ports: [443]\n'
                           '      - host: "*.cdn.example.com"\n        ports: [443]\n'
                           '        methods: [GET]\n')
    changes = diff(load_rules(write(tmp_path, "before.yaml", before)), rules)
    assert [(c.sign, c.widens) for c in changes] == [("-", None)]
    path = str(write(tmp_path, "moved2.yaml", moved))
    assert sealgate("diff", "--fail-on-widen", str(write(tmp_path, "r.yaml", RULES)),
                    path).returncode == 1
