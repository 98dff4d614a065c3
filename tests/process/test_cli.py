"""The `sealgate` entry point imports only the part that runs, and its command table says what
the parts register."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from sealgate.cli import COMMANDS, full_parser


def _registered_help() -> dict[str, str | None]:
    sub = next(a for a in full_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {action.dest: action.help for action in sub._choices_actions}


def test_the_table_lists_every_command_with_its_parts_help() -> None:
    assert _registered_help() == {name: text for name, (_, text) in COMMANDS.items()}


@pytest.mark.parametrize(("argv", "heavy"), [
    (["--help"], ("mitmproxy", "aiohttp", "sealgate.proxy", "sealgate.sandbox")),
    (["sandbox", "ls", "--daemon", "/nonexistent.sock"], ("mitmproxy", "aiohttp",
                                                           "sealgate.proxy")),
    (["sandbox", "exec", "--help"], ("mitmproxy", "aiohttp", "sealgate.proxy")),
    (["mcp", "serve", "--help"], ("mitmproxy", "aiohttp", "sealgate.proxy", "mcp")),
])
def test_a_command_imports_only_its_part(argv: list[str], heavy: tuple[str, ...]) -> None:
    probe = (
        "import sys\nfrom sealgate.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(" + repr(heavy) + ")))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


@pytest.mark.parametrize(("argv", "code", "said"), [
    (["sandbox", "put", "sb-x", "/nonexistent/file", "a", "--daemon", "/nonexistent.sock"], 2,
     "/nonexistent/file: No such file or directory"),
    (["sandbox", "ls", "--key-file", "/nonexistent/key"], 125,
     "--key-file /nonexistent/key: No such file or directory"),
    (["sandbox", "exec", "sb-x", "--daemon", "/nonexistent.sock", "--", "true"], 125,
     "cannot be reached"),
    (["ca", "--state", "/nonexistent/state"], 1, "no proxy CA in /nonexistent/state/ca"),
    (["mcp", "serve", "--python", "/nonexistent/python"], 2,
     "no MCP virtualenv python at /nonexistent/python: run `make deps`"),
])
def test_client_commands_say_what_is_wrong_without_a_traceback(
    argv: list[str], code: int, said: str
) -> None:
    done = subprocess.run([sys.executable, "-m", "sealgate.cli", *argv], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == code, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
