"""The files a repository of rules takes to review them in pull requests: the workflow
(docs/examples/rules-review.yml) and the pre-commit hooks (.pre-commit-hooks.yaml). Each
`sealgate` command they run is parsed by sealgate's own CLI (a renamed flag fails here), and the
hooks run for real over a repository laid out as they expect, passing, then failing on a
broken rule and a failing case."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from sealgate.cli import full_parser
from tests.harness import ROOT, SEALGATE


def _commands(script: str) -> list[list[str]]:
    """The sealgate command lines of a workflow step's script, its variables stood in for."""
    joined = script.replace("\\\n", " ").replace('"origin/$GITHUB_BASE_REF"', "origin/main")
    found = []
    for line in joined.splitlines():
        words = shlex.split(line.split(">", 1)[0]) if line.strip() else []
        if words[:1] == ["sealgate"]:
            found.append(words[1:])
    return found


def test_the_workflow_runs_commands_that_exist() -> None:
    workflow = yaml.safe_load((ROOT / "docs" / "examples" / "rules-review.yml").read_text())
    steps = workflow["jobs"]["rules"]["steps"]
    commands = [c for step in steps for c in _commands(step.get("run", ""))]
    assert len(commands) == 5, commands
    parser = full_parser()
    for words in commands:
        assert callable(parser.parse_args(words).func), words
    assert workflow["permissions"] == {"contents": "read", "pull-requests": "write"}


def _hooks() -> list[dict[str, Any]]:
    return yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())  # type: ignore[no-any-return]


def test_the_hooks_pass_good_rules_and_fail_bad_ones(tmp_path: Path) -> None:
    (tmp_path / "rules" / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "rules" / "examples" / "ci-bot.yaml", tmp_path / "rules")
    shutil.copy(ROOT / "rules" / "tests" / "ci-bot.yaml", tmp_path / "rules" / "tests")
    parser = full_parser()

    def run_hooks() -> list[int]:
        codes = []
        for hook in _hooks():
            words = [*shlex.split(hook["entry"]), *hook.get("args", [])]
            assert words[0] == "sealgate" and hook["pass_filenames"] is False
            assert callable(parser.parse_args(words[1:]).func)
            done = subprocess.run([*SEALGATE, *words[1:]], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=60)
            assert "Traceback" not in done.stderr
            codes.append(done.returncode)
        return codes

    assert run_hooks() == [0, 0]
    rules = tmp_path / "rules" / "ci-bot.yaml"
    good = rules.read_text()
    rules.write_text(good.replace("methods: [GET, HEAD]", "methods: [GET, HEAD, DELETE]", 1))
    assert run_hooks() == [0, 1]  # still valid rules; a case expecting a denial now fails
    rules.write_text(good + "\nunknown_key: 1\n")
    assert run_hooks()[0] == 1
