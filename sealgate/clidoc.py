"""The flags reference in docs/operations.md, made from the parsers themselves so it cannot
drift from them (tests/unit/test_clidoc.py compares).

    python -m sealgate.clidoc            # rewrite the tables in docs/operations.md
    python -m sealgate.clidoc --check    # exit 1, saying which, when one is out of date

Each table sits between `<!-- flags:COMMAND -->` and `<!-- flags:end -->`; COMMAND is a
command path of `sealgate` (`proxy`, `issuer serve`, `sandboxd`). Its rows are the command's
options in the parser's order: flags, the environment variable that sets it (options made with
`clikit.env_option`), the default as the code has it, and the help text.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .cli import full_parser

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
_BLOCK = re.compile(r"(<!-- flags:([a-z ]+) -->\n)(.*?)(<!-- flags:end -->)", re.S)


def _command(parser: argparse.ArgumentParser, path: str) -> argparse.ArgumentParser:
    for word in path.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def _default(action: argparse.Action) -> str:
    value = getattr(action, "code_default", action.default)
    if value in (None, "", [], False) or value is argparse.SUPPRESS:
        return ""
    return f"`{value}`"


def table(parser: argparse.ArgumentParser) -> str:
    rows = ["| flag | env | default | meaning |", "| --- | --- | --- | --- |"]
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or isinstance(
                action, argparse._HelpAction):
            continue
        metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        flags = ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)
        env = getattr(action, "env", None)
        meaning = " ".join((action.help or "").split()).replace("|", "\\|")
        meaning = meaning.replace("%(default)s", str(_default(action).strip("`")))
        rows.append(f"| {flags} | {f'`{env}`' if env else ''} | {_default(action)} | "
                    f"{meaning} |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    root = full_parser()
    return _BLOCK.sub(lambda m: m.group(1) + table(_command(root, m.group(2))) + m.group(4),
                      text)


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    text = DOC.read_text()
    made = render(text)
    if made == text:
        return 0
    if check:
        print(f"{DOC} is out of date: run python -m sealgate.clidoc", file=sys.stderr)
        return 1
    DOC.write_text(made)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
