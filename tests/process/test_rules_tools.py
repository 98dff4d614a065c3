"""The `sealgate rules` commands as a child process: exit codes, JSON, the shipped rules."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sealgate.proxy.policy.diff import diff
from sealgate.proxy.policy.rulesfile import load_rules
from tests.harness import ROOT, SEALGATE
from tests.unit.test_rules_tools import CASES, RULES, TOOL_RULES, write


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


SHIPPED = sorted(str(p.relative_to(ROOT)) for p in
                 [ROOT / "rules/default.yaml", *(ROOT / "rules/examples").glob("*.yaml")])


@pytest.mark.parametrize("rules_file", SHIPPED)
def test_every_shipped_rules_file_passes_check_strict(rules_file: str) -> None:
    out = sealgate("check", "--strict", rules_file)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("cases_file",
                         sorted(p.name for p in (ROOT / "rules/tests").glob("*.yaml")))
def test_the_shipped_rules_pass_their_cases(cases_file: str) -> None:
    # rules/tests/NAME.yaml holds the cases of the shipped rules file named NAME.yaml.
    [rules_file] = [f for f in SHIPPED if Path(f).name == cases_file]
    out = sealgate("test", rules_file, f"rules/tests/{cases_file}")
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


def test_github_annotations_and_a_markdown_diff(tmp_path: Path) -> None:
    good = write(tmp_path, "rules.yaml", RULES)
    bad = write(tmp_path, "bad.yaml", RULES.replace("mode: enforce", "mode: enforcing"))
    out = sealgate("check", "--format", "github", str(good), str(bad))
    assert out.returncode == 1
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("::error")]
    assert line.startswith(f"::error file={bad},line=") and "title=rules%3A policies.ci.mode" \
        in line, line
    # The fixture's warnings, each on its line; under --strict each is an error.
    assert f"::warning file={good},line=27,title=rules%3A any_host::" in out.stdout
    strict = sealgate("check", "--format", "github", "--strict", str(good))
    assert strict.returncode == 1 and "::warning" not in strict.stdout
    assert f"::error file={good},line=27,title=rules%3A any_host::" in strict.stdout
    cases = write(tmp_path, "cases.yaml", CASES)
    out = sealgate("test", "--format", "github", str(good), str(cases))
    lines = out.stdout.splitlines()
    assert out.returncode == 1 and lines[-1] == "::notice::2 passed, 2 failed"
    assert all(x.startswith(f"::error file={cases},line=") for x in lines[:-1]) and \
        len(lines) == 3, lines
    wider = write(tmp_path, "wider.yaml", RULES.replace(
        "  watcher:\n    mode: report", "  watcher:\n    mode: report\n    tokens: true").replace(
        '      - host: "*"\n        ports: [8080]\n',
        '      - host: "*"\n        ports: [8080]\n      - host: new.example.com\n'
        '        ports: [443]\n'))
    out = sealgate("diff", "--format", "github", "--fail-on-widen", str(good), str(wider))
    assert out.returncode == 1
    added = _line(wider, "host: new.example.com")
    lines = out.stdout.splitlines()
    assert f"::error file={wider},line={added},title=rules diff::" in lines[0], lines
    assert "new.example.com" in lines[0] and "(widens access)" in lines[0]
    # A policy's own setting has no line of its own in the loaded rules: no file property.
    assert lines[1] == ("::error title=rules diff::policy watcher: changed: tokens false -> "
                        "true (widens access)"), lines
    out = sealgate("diff", "--format", "markdown", str(good), str(wider))
    assert out.returncode == 0
    assert "| ~ | tokens false -&gt; true |  | **widens** |" in out.stdout, out.stdout
    assert f"]({wider}#L{added}) | **widens** |" in out.stdout, out.stdout


def test_annotations_carry_no_command_of_the_author_s(tmp_path: Path) -> None:
    """A rules file is a pull request author's text: a newline and `::` in a message must not
    become a workflow command of its own (`::add-mask::`, `::set-output`, ...)."""
    from sealgate.proxy.policy import annotate

    line = annotate.workflow("warning", "x\n::add-mask::secret", file="a,b:c.yaml", line=3,
                             title="t\n::stop-commands::y")
    # One line: the runner reads a command only at a line's start, and the message's `::` after
    # the command's own is data.
    assert "\n" not in line and "\r" not in line, line
    assert line.endswith("::x%0A::add-mask::secret")
    assert line.startswith("::warning file=a%2Cb%3Ac.yaml,line=3,title=t%0A%3A%3Astop")


def _line(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_diff_between_git_revisions_reads_git_not_the_work_tree(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                       check=True, capture_output=True, timeout=30)

    git("init", "-q")
    (tmp_path / "rules").mkdir()
    write(tmp_path / "rules", "ci.yaml", RULES)
    git("add", ".")
    git("commit", "-qm", "base")
    wider = RULES.replace("  watcher:\n    mode: report",
                          "  watcher:\n    mode: report\n    tokens: true")
    (tmp_path / "rules" / "ci.yaml").write_text(wider)
    git("commit", "-qam", "head")
    (tmp_path / "rules" / "ci.yaml").write_text(RULES)  # the work tree says otherwise: unread

    def rules(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*SEALGATE, "rules", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)

    out = rules("diff", "HEAD~1", "HEAD", "--", "rules")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["policy watcher", "  ~ tokens false -> true  [widens]",
                                       "1 changes, 1 widen or may widen access"]
    out = rules("diff", "--fail-on-widen", "HEAD~1", "HEAD", "--", "rules/ci.yaml")
    assert out.returncode == 1
    for bad in (["--", "HEAD", "HEAD", "/etc"], ["HEAD", "nope", "--", "rules"],
                ["HEAD", "HEAD", "--", "../x"]):
        out = rules("diff", *bad)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr


def test_the_shipped_rules_stay_under_the_shipped_ceiling() -> None:
    out = sealgate("bound", "rules/ceilings/ci-bot.yaml", "rules/examples/ci-bot.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "1 policies bounded, 0 crossings"


def test_bound_names_the_rule_and_a_request_that_crosses(tmp_path: Path) -> None:
    wider = write(tmp_path, "wider.yaml", (ROOT / "rules/examples/ci-bot.yaml").read_text()
                  .replace('paths: ["/repos/*/*/issues/*/comments"]',
                           'paths: ["/repos/*/*/issues/*/comments", "/repos/*/*/git/**"]'))
    out = sealgate("bound", "--json", "rules/ceilings/ci-bot.yaml", str(wider))
    assert out.returncode == 1, out.stdout + out.stderr
    crossing, = json.loads(out.stdout)["crossings"]
    assert crossing["bound"] == "allow" and crossing["where"].endswith("wider.yaml:14")
    assert crossing["request"] == "POST https://api.github.com/repos/c/c/git"
    github = sealgate("bound", "--format", "github", "rules/ceilings/ci-bot.yaml", str(wider))
    assert github.stdout.startswith(f"::error file={wider},line=14,title=rules bound%3A allow::")
    broken = write(tmp_path, "ceiling.yaml", "version: 1\nceiling:\n  hosts: []\n")
    out = sealgate("bound", str(broken), str(wider))
    assert out.returncode == 2 and "ceiling.yaml:3" in out.stderr and "Traceback" not in out.stderr


def test_explain_tool_says_the_call_and_its_decision(tmp_path: Path) -> None:
    rules = write(tmp_path, "tools.yaml", TOOL_RULES)
    done = sealgate("explain-tool", str(rules), "--sandbox", "bot", "issue", "--arguments",
                    '{"n": 7}', "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["tool"], answer["method"], answer["url"], answer["decision"]) == (
        "issue", "GET", "https://api.example.com:443/issues/7", "allow")
    denied = sealgate("explain-tool", str(rules), "--sandbox", "bot", "http_request",
                      "--arguments", '{"url": "https://api.example.com/other"}')
    assert denied.returncode == 1 and "DENY not_allowed" in denied.stdout, denied.stdout
    broken = sealgate("explain-tool", str(rules), "--sandbox", "bot", "issue", "--arguments",
                      "[1]")
    assert broken.returncode == 2 and "must be a JSON object" in broken.stderr
