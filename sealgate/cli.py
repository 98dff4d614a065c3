"""The `sealgate` command: one entry point, each part registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from sealgate import __version__

# Each module exposes `register(subparsers)` and sets `func=handler` (handler(args) -> exit code)
# on the parsers it adds, so a part's commands live next to the code they drive.
_COMMAND_MODULES = ("proxy.cli", "proxy.rulestool", "issuer.cli", "sandbox.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sealgate", description="Egress credential proxy and sandbox runtime."
    )
    parser.add_argument("--version", action="version", version=f"sealgate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    code: int = func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
